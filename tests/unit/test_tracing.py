"""The tracing hooks: nothing without OpenTelemetry, one trace per run, the vacancy rule.

The spans here go to an SDK provider of the test's own (``tracing._tracer`` patched), never
the global one: a global provider is set once per process and would trace every other test.
The real set-up (opentelemetry-instrument, real processes) is tests/e2e/test_tracing.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from celery_election.beat.ledger import run_task_id
from celery_election.beat.runs import Claim
from celery_election.core import tracing
from celery_election.core.lease import Lease, vacancy
from celery_election.core.transitions import RevokeReason, Transition

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def exported(monkeypatch: pytest.MonkeyPatch) -> InMemorySpanExporter:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(tracing, "_tracer", lambda: provider.get_tracer("test"))
    return exporter


class Ledger:
    def __init__(self, attempt: int = 1, claimed_term: int | None = None) -> None:
        self.answer = (attempt, claimed_term)

    def resend_of(self, name: str) -> tuple[int, int | None]:
        return self.answer


FENCE = SimpleNamespace(namespace="ns-beat", from_db=lambda us, like: None)
ENTRY = SimpleNamespace(name="nightly", task="proj.report", last_run_at=None)


def send(ledger: Ledger, term: int, task_id: str) -> tuple[Any, dict[str, Any]]:
    options: dict[str, Any] = {"task_id": task_id, "headers": {"election_term": term}}
    claim = Claim(True, term, 0, 1_000, 1_700_000_000_000_000_000)
    return tracing.beat_run(FENCE, ledger, ENTRY, claim, term, options), options


def test_every_attempt_of_a_run_is_in_the_trace_named_by_its_task_id(
    exported: InMemorySpanExporter,
) -> None:
    task_id = run_task_id("ns-beat", "nightly", 1_000)
    first, options = send(Ledger(), 5, task_id)
    tracing.beat_run_ended(first, "publish_failed", ConnectionError("broker down"))
    again, _ = send(Ledger(attempt=2), 5, task_id)
    tracing.beat_run_ended(again, "sent")
    recovered, _ = send(Ledger(claimed_term=5), 6, task_id)  # the next leader sends it
    tracing.beat_run_ended(recovered, "sent")
    spans = exported.get_finished_spans()
    assert [s.context.trace_id for s in spans] == [uuid.UUID(task_id).int] * 3
    assert len({s.parent.span_id for s in spans if s.parent}) == 1  # the run's one root
    assert [s.attributes[tracing.ATTEMPT] for s in spans] == [1, 2, 1]
    assert tracing.CLAIMED_TERM not in spans[1].attributes
    assert spans[2].attributes[tracing.CLAIMED_TERM] == 5
    assert spans[2].attributes[tracing.TERM] == 6
    assert spans[0].status.status_code is StatusCode.ERROR
    assert [s.attributes[tracing.OUTCOME] for s in spans] == ["publish_failed", "sent", "sent"]
    assert spans[0].start_time == 1_700_000_000_000_000_000  # from the claim
    # the context travels in the send's headers: the worker's span joins the run's trace
    assert options["headers"]["traceparent"].split("-")[1] == uuid.UUID(task_id).hex


def test_a_span_is_current_while_celery_publishes(exported: InMemorySpanExporter) -> None:
    span, options = send(Ledger(), 5, run_task_id("ns-beat", "nightly", 2_000))
    with tracing.current(span):
        child = tracing._tracer().start_span("apply_async/proj.report")  # type: ignore[union-attr]
        child.end()
    (publish,) = exported.get_finished_spans()
    assert publish.parent is not None and publish.parent.span_id == span.get_span_context().span_id
    # a publisher process: the same, from the headers the job carried
    with tracing.from_headers(options["headers"]):
        child = tracing._tracer().start_span("apply_async/proj.report")  # type: ignore[union-attr]
        child.end()
    assert exported.get_finished_spans()[-1].parent.span_id == span.get_span_context().span_id  # type: ignore[union-attr]


def test_runs_not_sent_and_the_elections_transitions(exported: InMemorySpanExporter) -> None:
    tracing.beat_run_not_sent(FENCE, Ledger(), ENTRY, Claim(False, 7, 0, 1), "refused")
    tracing.beat_run_not_sent(FENCE, Ledger(), ENTRY, Claim(False, 0, 0, 0), "fenced")  # none
    tracing.beat_run_not_sent(FENCE, Ledger(), ENTRY, None, "fenced")  # unreserved: none
    tracing.transition(Transition("elected", "ns", 9, "beat@h:1", vacancy=1.5))
    told = time.time_ns()
    tracing.transition(Transition("revoked", "ns", 9, "beat@h:1", RevokeReason.RESIGNED), ago=2.0)
    after = time.time_ns()
    refused, won, resigned = exported.get_finished_spans()
    assert refused.attributes[tracing.OUTCOME] == "refused"
    assert won.name == "election/elected" and won.attributes[tracing.VACANCY] == 1.5
    assert won.end_time - won.start_time == 1_500_000_000  # type: ignore[operator]
    assert resigned.attributes[tracing.REASON] == "resigned"
    # timed when it changed, 2 s before it was told
    assert told - 2_000_000_000 <= resigned.end_time <= after - 2_000_000_000  # type: ignore[operator]
    assert won.parent is None and resigned.parent is None


def test_without_an_sdk_every_hook_is_a_no_op() -> None:
    # the API is installed here and no provider is set in this process
    assert not tracing.enabled()
    options: dict[str, Any] = {"task_id": str(uuid.uuid4()), "headers": {}}
    assert tracing.beat_run(FENCE, Ledger(), ENTRY, None, 1, options) is None
    assert options["headers"] == {}
    assert tracing.current(None) is tracing.current(None)  # one shared no-op


def test_without_opentelemetry_nothing_of_it_is_imported() -> None:
    body = textwrap.dedent("""
        import json, sys

        class Blocker:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] == "opentelemetry":
                    raise ImportError(name)

        sys.meta_path.insert(0, Blocker())
        from celery_election.core import tracing
        from celery_election.beat import sender, publish
        from celery_election.integration import tasks
        print(json.dumps({"available": tracing.AVAILABLE, "enabled": tracing.enabled(),
                          "loaded": [m for m in sys.modules if m.startswith("opentelemetry")]}))
    """)
    proc = subprocess.run([sys.executable, "-c", body], capture_output=True, text=True,
                          cwd=ROOT, timeout=60, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1]) == {
        "available": False, "enabled": False, "loaded": [],
    }  # fmt: skip


def lease(term: int, token: str | None, acquired: int, renewed: int, expires: int) -> Lease:
    return Lease("ns", term, None, expires, 0, acquired, renewed, token)


@pytest.mark.parametrize(
    ("before", "after", "expected"),
    [
        # a leader last renewed at 10 s, taken over at 12.5 s: vacant 2.5 s at most
        (lease(1, "t1", 0, 10_000_000, 20_000_000), lease(2, "t2", 12_500_000, 0, 0), 2.5),
        # resigned at 11 s (expires_at = the resign), elected at 11.2 s
        (lease(1, None, 0, 10_000_000, 11_000_000), lease(2, "t2", 11_200_000, 0, 0), 0.2),
        # never renewed: alive at its acquisition
        (lease(1, "t1", 5_000_000, 0, 20_000_000), lease(2, "t2", 6_000_000, 0, 0), 1.0),
        # nothing read before, or a fresh row, or the same term (a renewal): unknown
        (None, lease(2, "t2", 12_500_000, 0, 0), None),
        (lease(0, None, 0, 0, 0), lease(1, "t2", 12_500_000, 0, 0), None),
        (lease(2, "t2", 1, 1, 1), lease(2, "t2", 12_500_000, 0, 0), None),
    ],
)
def test_vacancy(before: Lease | None, after: Lease, expected: float | None) -> None:
    assert vacancy(before, after) == (None if expected is None else pytest.approx(expected))


def test_a_leader_tasks_span_carries_its_term(monkeypatch: pytest.MonkeyPatch) -> None:
    from opentelemetry import trace

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", provider)  # as set_tracer_provider sets it
    assert tracing.enabled()
    task = provider.get_tracer("celery").start_span("run/proj.report")  # Celery's, current
    with trace.use_span(task, end_on_exit=True):
        tracing.task_term(42)
        tracing.task_not_leader("skipped")
    (span,) = exporter.get_finished_spans()
    assert span.attributes[tracing.TERM] == 42
    assert span.attributes[tracing.TASK_OUTCOME] == "skipped"
