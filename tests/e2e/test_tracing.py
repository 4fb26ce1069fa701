"""OpenTelemetry, the standard set-up: one trace per beat run, beat -> publish -> task run.

A real ``celery worker --election`` and two ``celery beat -S ...LeaderScheduler`` under
``opentelemetry-instrument`` with opentelemetry-instrumentation-celery and the SDK's
console exporter (harness/otel.py); entries every second (tests/e2e/proj.py). For every
run the worker executed (its row: entry, run key, term, task id), the exported spans must
form one trace, named by the task id: the beat's ``beat_run/<entry>`` span with the run's
attributes, Celery's publish span its child, the worker's task span the publish's child.
Then the leading beat is SIGKILLed: the next leader's runs are traced alike, under its
term, and both beats exported the ``election/elected`` span of their term.
"""

from __future__ import annotations

import signal
from typing import Any

import pytest

from celery_election.core import tracing as t
from harness import otel
from harness.cluster import Cluster, wait_until

pytestmark = [
    pytest.mark.slow,
    pytest.mark.parametrize("cluster", [{"beat": True}], indirect=True, ids=["beat"]),
]
TICK = "tests.e2e.proj.tick"


def chain(spans: list[dict[str, Any]], tick: Any) -> dict[str, dict[str, Any]] | None:
    """The run's three spans (beat run, publish, task run), or None while one is missing."""
    trace = "0x" + tick.task_id.replace("-", "")
    mine = [s for s in spans if s["context"]["trace_id"] == trace]
    runs = [s for s in mine if s["name"] == f"beat_run/{tick.entry}"
            and s["attributes"].get(t.OUTCOME) == "sent"]  # fmt: skip
    for run in runs:
        run_id = run["context"]["span_id"]
        publish = [s for s in mine
                   if s["name"] == f"apply_async/{TICK}" and s["parent_id"] == run_id]  # fmt: skip
        for pub in publish:
            pub_id = pub["context"]["span_id"]
            task = [s for s in mine if s["name"] == f"run/{TICK}" and s["parent_id"] == pub_id]
            if task:
                return {"run": run, "publish": pub, "task": task[0]}
    return None


def traced(c: Cluster, ticks: list[Any], what: str) -> dict[str, dict[str, dict[str, Any]]]:
    """Wait until each executed run in ``ticks`` has its whole trace; their chains by task id."""

    def check() -> dict[str, dict[str, dict[str, Any]]] | None:
        spans = otel.all_spans(c)
        found = {tick.task_id: chain(spans, tick) for tick in ticks}
        if any(v is None for v in found.values()):
            return None
        return found  # type: ignore[return-value]

    return wait_until(check, 15, f"one trace beat run -> publish -> task run for {what}", 0.2)


def check_run(c: Cluster, tick: Any, spans: dict[str, dict[str, Any]]) -> None:
    """The beat run span's attributes are the run the worker executed."""
    attrs = spans["run"]["attributes"]
    assert attrs[t.NAMESPACE] == f"{c.namespace}-beat"
    assert attrs[t.TERM] == tick.term
    assert attrs[t.ENTRY] == tick.entry
    assert attrs[t.TASK] == TICK
    assert attrs[t.RUN] == tick.run
    assert attrs[t.TASK_ID] == tick.task_id
    assert attrs[t.ATTEMPT] >= 1
    if tick.run:  # the entry's first run has no last run to be due after
        assert attrs[t.DUE].endswith("+00:00") and isinstance(attrs[t.LATENESS], float)
    assert spans["run"]["_proc"].startswith("b")
    assert spans["publish"]["_proc"] == spans["run"]["_proc"]
    assert spans["task"]["_proc"] == "w1"


def ticks_of(c: Cluster, term: int, at_least: int) -> list[Any]:
    """The executed runs of ``term``, once there are ``at_least`` of them."""
    return wait_until(
        lambda: (
            (rows := [r for r in c.rows(c.ticks) if r.term == term])
            and len(rows) >= at_least
            and rows
        ),
        30,
        f"{at_least} runs executed under term {term}",
    )


def elected(c: Cluster, proc: str, term: int) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        return next(
            (s for s in otel.spans_in(c.tmp / f"{proc}.log") if s["name"] == "election/elected"
             and s["attributes"][t.TERM] == term), None,
        )  # fmt: skip

    span = wait_until(check, 10, f"{proc}'s election/elected span of term {term}", 0.2)
    assert span["attributes"][t.NAMESPACE] == f"{c.namespace}-beat"
    return span


def test_each_beat_run_is_one_trace_through_a_sigkill_failover(cluster: Cluster) -> None:
    c = cluster
    otel.start_worker(c, "w1")
    otel.start_beat(c, "b1")
    otel.start_beat(c, "b2")
    first = c.wait_beat_leader(30)
    lease = c.backend.current(f"{c.namespace}-beat")
    assert lease is not None
    term1 = lease.term
    ticks = ticks_of(c, term1, 4)
    for tick in ticks:
        check_run(c, tick, traced(c, ticks, f"term {term1}")[tick.task_id])
    elected(c, first, term1)

    # a leader task on the worker: Celery's task span carries the worker's term
    c.wait_leader(30)
    worker_term = c.backend.current(c.namespace).term  # type: ignore[union-attr]
    result = c.send("skip", "traced")
    assert result.get(timeout=30) == worker_term
    wait_until(
        lambda: any(s["name"] == "run/tests.e2e.proj.skip"
                    and s["attributes"].get(t.TERM) == worker_term
                    for s in otel.spans_in(c.tmp / "w1.log")),
        10, "the leader task's span with its term", 0.2,
    )  # fmt: skip

    c.signal(first, signal.SIGKILL)
    second = c.wait_beat_leader(30, other_than=first)
    lease = c.backend.current(f"{c.namespace}-beat")
    assert lease is not None and lease.term > term1
    term2 = lease.term
    ticks = ticks_of(c, term2, 4)
    for tick in ticks:
        check_run(c, tick, traced(c, ticks, f"term {term2}")[tick.task_id])
    won = elected(c, second, term2)
    # the new leader had read the killed one's lease: how long the namespace had none
    assert won["attributes"][t.VACANCY] >= 0
    assert won["attributes"][t.CANDIDATE]


@pytest.mark.tier2  # a variant of the first (8 s): the CI's first tier is full
def test_a_publisher_process_publishes_under_the_run_span(cluster: Cluster) -> None:
    # election_beat_publishers: the run span is the beat's, Celery's publish is the forked
    # publisher's; the context crosses in the job's headers
    c = cluster
    otel.start_worker(c, "w1")
    otel.start_beat(c, "b1", env={"E2E_PUBLISHERS": "1"})
    c.wait_beat_leader(30)
    lease = c.backend.current(f"{c.namespace}-beat")
    assert lease is not None
    ticks = ticks_of(c, lease.term, 4)
    chains = traced(c, ticks, "runs published by a publisher process")
    for tick in ticks:
        check_run(c, tick, chains[tick.task_id])


@pytest.mark.tier2  # a SIGKILL mid-send: about 10 s
def test_a_run_the_next_leader_recovers_is_traced_in_the_same_trace(cluster: Cluster) -> None:
    # b1 claims the runs due in its first burst (one per entry due then: the entries' phases
    # decide how many) and hangs in Celery's publish of the first (tests/e2e/proj.py's
    # E2E_HANG_FILE); SIGKILLed there, it leaves them pending; b2 sends them at promotion,
    # under their task ids: the trace the task id names holds b2's attempt, which says which
    # term claimed the run, and the worker's run of it
    c = cluster
    hang = c.tmp / "hang"
    hang.touch()
    otel.start_worker(c, "w1")
    otel.start_beat(c, "b1", env={"E2E_HANG_FILE": str(hang)})
    c.wait_beat_leader(30)
    beat_ns = f"{c.namespace}-beat"
    term1 = c.backend.current(beat_ns).term  # type: ignore[union-attr]
    # a burst's claims are one statement, before its sends: the first seen is the whole burst
    pending = wait_until(lambda: c.backend.beat.pending_runs(beat_ns), 30, "b1's runs pending")
    assert {p.state.term for p in pending} == {term1}
    keys = {(p.entry_name, p.run) for p in pending}
    c.signal("b1", signal.SIGKILL)
    otel.start_beat(c, "b2")
    c.wait_beat_leader(30, other_than="b1")
    term2 = c.backend.current(beat_ns).term  # type: ignore[union-attr]
    recovered = wait_until(
        lambda: (rows := [r for r in c.rows(c.ticks) if (r.entry, r.run) in keys])
        and len(rows) == len(keys) and rows, 30, "the recovered runs executed",
    )  # fmt: skip
    chains = traced(c, recovered, "the recovered runs")
    for tick in recovered:
        check_run(c, tick, chains[tick.task_id])
        attrs = chains[tick.task_id]["run"]["attributes"]
        assert (attrs[t.TERM], attrs[t.CLAIMED_TERM]) == (term2, term1)
        assert chains[tick.task_id]["run"]["_proc"] == "b2"
