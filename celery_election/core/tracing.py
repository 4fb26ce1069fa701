"""OpenTelemetry traces of the election and of the beat's runs (the ``otel`` extra).

Nothing here is wired by the user: with ``opentelemetry-api`` installed and an SDK
configured (``opentelemetry-instrument celery ...``), the beat's runs and the election's
transitions become spans; with ``opentelemetry-instrumentation-celery`` too, each run is
one trace: the beat's run span, Celery's publish span under it, the worker's task span
under that. Without OpenTelemetry nothing is imported; with the API but no SDK every hook
returns after one check of the global tracer provider (docs/tracing.md).

A run's trace id is its task id (``ledger.run_task_id``: uuid5 of namespace, entry and
the run's stored time), so every attempt of one run (an owed send retried, a run a
deposed leader claimed and the next leader sent) lands in one trace, across processes and
failovers, with no state kept to link them. Each attempt's span hangs under the run's
root, a parent that no process exports (see the docs).

The attribute names below are the one place they are named.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from contextlib import AbstractContextManager, nullcontext
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from .due import due_after

try:  # the otel extra: the API only
    from opentelemetry import context as _context
    from opentelemetry import propagate as _propagate
    from opentelemetry import trace as _trace

    AVAILABLE = True
except ImportError:  # not installed: every hook returns at once
    AVAILABLE = False

#: No provider set is told by the API's global alone (``set_tracer_provider`` sets it):
#: ``get_tracer_provider()`` also looks up an environment variable at each call, 20 times
#: the cost, unless that variable names a provider to load (then the API's way is taken).
_FAST = (
    AVAILABLE
    and hasattr(_trace, "_TRACER_PROVIDER")
    and "OTEL_PYTHON_TRACER_PROVIDER" not in os.environ
)

if TYPE_CHECKING:
    from .transitions import Transition

log = logging.getLogger("celery_election.core.tracing")

__all__ = ["AVAILABLE", "beat_run", "beat_run_ended", "beat_run_not_sent", "transition"]

# -- attribute names (docs/tracing.md) ------------------------------------------------------
NAMESPACE = "celery_election.namespace"  #: the election namespace
TERM = "celery_election.term"  #: the term (fencing token) the act happened under
CANDIDATE = "celery_election.candidate"  #: the elector's candidate id
REASON = "celery_election.reason"  #: why a term ended: lost, expired, resigned, stopped
VACANCY = "celery_election.vacancy_s"  #: seconds the namespace had no leader before a win
ENTRY = "celery_election.beat.entry"  #: the beat entry's name
TASK = "celery_election.beat.task"  #: the entry's task name
RUN = "celery_election.beat.run"  #: the run's key: the stored last run it follows (epoch us)
TASK_ID = "celery_election.beat.task_id"  #: the run's task id (every attempt's)
DUE = "celery_election.beat.due"  #: when the run fell due (ISO 8601, UTC)
LATENESS = "celery_election.beat.lateness_s"  #: seconds from due to the claim
ATTEMPT = "celery_election.beat.attempt"  #: 1, then 2, 3 ... for an owed send retried
CLAIMED_TERM = "celery_election.beat.claimed_term"  #: a recovered run: the term that claimed it
OUTCOME = "celery_election.beat.outcome"  #: sent, publish_failed, lost, fenced, refused, expired
TASK_OUTCOME = "celery_election.leader_task.outcome"  #: a follower's: skipped, requeued, raised

#: Outcomes that are errors of the send (the span's status is ERROR).
_ERRORS = frozenset({"publish_failed", "lost"})
_NULL: AbstractContextManager[Any] = nullcontext()
_MASK64 = (1 << 64) - 1
_cached: tuple[Any, Any] | None = None  # (provider, its tracer)


def _tracer() -> Any | None:
    """The tracer, or None: no OpenTelemetry, or no SDK configured (the API's no-op).

    The global provider is set once (``set_tracer_provider``), possibly after this
    module was imported: asked at each act, cached by provider.
    """
    global _cached
    if not AVAILABLE or (_FAST and _trace._TRACER_PROVIDER is None):
        return None
    provider = _trace.get_tracer_provider()
    if isinstance(provider, (_trace.ProxyTracerProvider, _trace.NoOpTracerProvider)):
        return None
    cached = _cached
    if cached is None or cached[0] is not provider:
        cached = _cached = (provider, provider.get_tracer("celery_election", _version()))
    return cached[1]


def _version() -> str | None:
    """The installed version of celery-election: the tracer's instrumentation scope."""
    import importlib.metadata  # once per provider, and only when tracing

    try:
        return importlib.metadata.version("celery-election")
    except importlib.metadata.PackageNotFoundError:
        return None


def enabled() -> bool:
    """Whether spans are recorded now (an SDK's tracer provider is set)."""
    return _tracer() is not None


# -- the beat's runs ------------------------------------------------------------------------


def run_parent(task_id: str) -> Any | None:
    """The context of a run's root: the trace id is the task id, the span id derived.

    Sampled: a run's attempts are recorded whatever a ratio sampler would say of a new
    root (the root is this remote parent), so no attempt is missing from its trace.
    """
    try:
        trace_id = uuid.UUID(task_id).int
    except ValueError:  # a task id of the user's own: a trace of its own
        return None
    span_id = ((trace_id >> 64) ^ trace_id) & _MASK64 or 1
    root = _trace.SpanContext(
        trace_id, span_id, is_remote=True, trace_flags=_trace.TraceFlags(_trace.TraceFlags.SAMPLED)
    )
    return _trace.set_span_in_context(_trace.NonRecordingSpan(root))


def beat_run(
    fence: Any, ledger: Any, entry: Any, claim: Any | None, term: int, options: dict[str, Any]
) -> Any | None:
    """A run's span, from its claim (``claim.claimed_ns``) on; None when not tracing.

    Its context goes into the send's headers (``options["headers"]``), so the worker's
    task span joins the run's trace even when the beat's Celery is not instrumented.
    ``fence``: the beat's (the namespace, the database clock); ``ledger``: its run ledger
    (whether this send is a retry, or of a run an earlier term claimed).
    """
    tracer = _tracer()
    if tracer is None:
        return None
    name = str(entry.name)
    namespace, from_db = fence.namespace, fence.from_db
    resend = ledger.resend_of(name)
    attrs: dict[str, Any] = {NAMESPACE: namespace, TERM: term, ENTRY: name, TASK: str(entry.task)}
    start = None
    parent = None
    if claim is not None:
        attrs[RUN] = claim.run
        start = getattr(claim, "claimed_ns", 0) or None
        attrs.update(_due(entry, claim.run, from_db, start or time.time_ns()))
    task_id = options.get("task_id")
    if isinstance(task_id, str):
        attrs[TASK_ID] = task_id
        parent = run_parent(task_id)
    attempt, claimed_term = resend
    attrs[ATTEMPT] = attempt
    if claimed_term is not None and claimed_term != term:
        attrs[CLAIMED_TERM] = claimed_term
    span = tracer.start_span(f"beat_run/{name}", context=parent, attributes=attrs, start_time=start)
    headers = options.get("headers")
    if isinstance(headers, dict):
        _propagate.inject(headers, context=_trace.set_span_in_context(span))
    return span


def _due(entry: Any, run: int, from_db: Any, at_ns: int) -> dict[str, Any]:
    """When the run after the stored run ``run`` fell due, how late ``at_ns`` is ({}: unknown)."""
    if not run or from_db is None:
        return {}
    try:
        last = from_db(run, entry.last_run_at)
        due = due_after(entry.schedule, last, datetime.now(timezone.utc))
    except Exception:
        return {}
    return {DUE: due.isoformat(), LATENESS: round(at_ns / 1e9 - due.timestamp(), 6)}


def current(span: Any | None) -> AbstractContextManager[Any]:
    """``span`` made current (Celery's publish span becomes its child); a no-op for None."""
    if span is None:
        return _NULL
    return _trace.use_span(
        span, end_on_exit=False, record_exception=False, set_status_on_exception=False
    )


def from_headers(headers: Any) -> AbstractContextManager[Any]:
    """The context a send's headers carry, made current (a publisher process's send)."""
    if not isinstance(headers, dict) or _tracer() is None:
        return _NULL
    return _Attached(_propagate.extract(headers))


class _Attached:
    """A context attached for a ``with`` block."""

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx
        self.token: Any = None

    def __enter__(self) -> None:
        self.token = _context.attach(self.ctx)

    def __exit__(self, *exc: object) -> None:
        _context.detach(self.token)


def beat_run_ended(
    span: Any | None, outcome: str, error: BaseException | str | None = None
) -> None:
    """The run's span ends with its outcome: "sent" once the broker accepted it."""
    if span is None:
        return
    span.set_attribute(OUTCOME, outcome)
    if outcome in _ERRORS:
        if isinstance(error, BaseException):
            span.record_exception(error)
        span.set_status(_trace.Status(_trace.StatusCode.ERROR, str(error or outcome)))
    span.end()


def beat_run_not_sent(
    fence: Any,
    ledger: Any,
    entry: Any,
    claim: Any | None,
    outcome: str,
    task_id: str | None = None,
) -> None:
    """A run that goes no further: refused (another leader ran it), fenced or expired.

    A span of its own (from the claim, when known, to now) with the outcome; none for a
    send that claimed nothing (an unreserved send while not leading).
    """
    if _tracer() is None or claim is None or not claim.term:
        return
    options = {} if task_id is None else {"task_id": task_id}
    beat_run_ended(beat_run(fence, ledger, entry, claim, claim.term, options), outcome)


# -- the election ---------------------------------------------------------------------------


def transition(item: Transition, ago: float = 0.0) -> None:
    """A term won (a span over the vacancy it ended, when known) or ended (and why).

    ``ago``: seconds since the change (it is told after the callbacks ran). Never raises:
    the election's announcements go on whatever the SDK does.
    """
    tracer = _tracer()
    if tracer is None:
        return
    try:
        _transition(tracer, item, ago)
    except Exception:
        log.debug("tracing: the span of %s was not recorded", item, exc_info=True)


def _transition(tracer: Any, item: Transition, ago: float) -> None:
    attrs: dict[str, Any] = {NAMESPACE: item.namespace, TERM: item.term,
                             CANDIDATE: item.candidate_id}  # fmt: skip
    end = time.time_ns() - max(0, int(ago * 1e9))
    start = end
    if item.reason is not None:
        attrs[REASON] = item.reason.value
    vacancy = getattr(item, "vacancy", None)
    if vacancy is not None:
        attrs[VACANCY] = vacancy
        start = end - int(vacancy * 1e9)
    span = tracer.start_span(f"election/{item.kind}", context=_ROOT, attributes=attrs,
                             start_time=start)  # fmt: skip
    span.end(end_time=end)


#: An empty context: election spans are roots of their own, whatever is current.
_ROOT = _context.Context() if AVAILABLE else None


# -- leader tasks (the worker) -------------------------------------------------------------


def task_term(term: int) -> None:
    """The running leader task's span (Celery's, when instrumented) carries its term."""
    if _FAST and _trace._TRACER_PROVIDER is None:  # _tracer(), inlined: the hot path
        return
    span = _trace.get_current_span()
    if span.is_recording():
        span.set_attribute(TERM, term)


def task_not_leader(outcome: str) -> None:
    """A leader task a follower received: what it did (skipped, requeued, raised)."""
    if _tracer() is None:
        return
    span = _trace.get_current_span()
    if span.is_recording():
        span.set_attribute(TASK_OUTCOME, outcome)
