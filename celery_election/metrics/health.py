"""Health probes: is each election thread making progress, is each beat's tick loop on time.

``/healthz`` and ``/readyz`` (``exporter.MetricsServer``) answer from ``health()``. A beat's
tick loop announces each round with ``mark_tick()``, in the store (``counters``), so the
worker's main process can judge an embedded beat that runs in a process of its own.

Part of the core: it never imports Celery.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..core.clock import boottime
from . import counters
from .counters import TICK, key, set_gauge

if TYPE_CHECKING:
    from ..election.elector import Elector

__all__ = ["BeatProbe", "allow_start", "elector_problem", "health", "mark_tick", "tick_late"]


def tick_late(values: dict[str, int], namespace: str, now: float) -> float | None:
    """Seconds the beat's tick loop is late for the tick it announced (0: on time).

    None when the beat has neither ticked nor been given a start-up allowance. Late, not
    age: a sparse schedule sleeps long between ticks on purpose, and says so.
    """
    due_us = values.get(key(TICK, namespace, "due"))
    if not due_us:
        # never ticked: late once the start-up allowance ("start") has passed
        due_us = values.get(key(TICK, namespace, "start"))
        if not due_us:
            return None
    return max(0.0, now - due_us / 1e6)


def mark_tick(namespace: str, next_in: float) -> None:
    """A beat's tick loop went round; it expects to go round again in ``next_in`` s."""
    now = boottime()
    set_gauge(key(TICK, namespace, "last"), int(now * 1e6))
    set_gauge(key(TICK, namespace, "due"), int((now + next_in) * 1e6))


def allow_start(namespace: str, seconds: float) -> None:
    """Give a beat that has not ticked yet ``seconds`` to start before it counts as late."""
    set_gauge(key(TICK, namespace, "start"), int((boottime() + seconds) * 1e6))


class BeatProbe:
    """The tick loop of one beat (embedded: read from the worker's shared table)."""

    def __init__(self, namespace: str, grace: float) -> None:
        self.namespace = namespace
        #: the loop is wedged once this many seconds late for its next tick
        self.grace = grace

    def check(self, values: dict[str, int], now: float) -> str | None:
        """None if the tick loop is on time, else why not."""
        late = tick_late(values, self.namespace, now)
        if late is not None and late > self.grace:
            return f"beat tick loop of {self.namespace!r} is {late:.1f}s late"
        return None


def elector_problem(e: Elector, now: float) -> str | None:
    """None if the election thread makes progress, else why not.

    Wedged: busy (not waiting) in one round for longer than 3 x ttl; every database
    call has a deadline (call_timeout < ttl) and a round makes at most three.
    """
    if not e.snapshot().running:
        return f"election thread of {e.namespace!r} is not running"
    busy = e.stats.busy_since
    if busy is not None and now - busy > 3 * e.config.ttl:
        return f"election thread of {e.namespace!r} busy for {now - busy:.1f}s"
    return None


def health(
    electors_: list[Elector], beats: list[BeatProbe], values: dict[str, int] | None = None
) -> tuple[bool, bool, list[str]]:
    """(healthy, ready, problems): ready is healthy and each elector reached its database.

    A follower is ready: readiness says "this process takes part in the election", not
    "this process leads".
    """
    now = boottime()
    problems: list[str] = []
    for e in electors_:
        p = elector_problem(e, now)
        if p:
            problems.append(p)
    snap = values if values is not None else counters.values()
    for b in beats:
        p = b.check(snap, now)
        if p:
            problems.append(p)
    healthy = not problems
    waiting = [e.namespace for e in electors_ if not e.stats.calls_ok or e.snapshot().failures]
    ready = healthy and not waiting and bool(electors_ or beats)
    if healthy and waiting:
        problems.append(f"not ready: no answer from the election database for {waiting}")
    return healthy, ready, problems
