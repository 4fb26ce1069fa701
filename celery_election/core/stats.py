"""An elector's own counters: kept whether or not anything exports them (cheap).

The exporter and the health probes (celery_election.metrics) read them through
``elector.electors()``; they live in the core so that the Elector needs nothing from the
metrics package.
"""

from __future__ import annotations

__all__ = ["BUCKETS", "ElectorStats"]

#: Histogram buckets of one database call (seconds): calls have a deadline (call_timeout).
BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class ElectorStats:
    """An elector's own counters, kept whether or not anything exports them (cheap)."""

    def __init__(self) -> None:
        self.transitions: dict[tuple[str, str], int] = {}
        self.failures: dict[str, int] = {}
        #: operation -> (bucket counts, sum of seconds, count)
        self.calls: dict[str, tuple[list[int], float, int]] = {}
        #: boot-time clock: when the election thread went busy (None: waiting or stopped)
        self.busy_since: float | None = None
        self.calls_ok = 0

    def transition(self, kind: str, reason: str) -> None:
        """Count a change of belief."""
        k = (kind, reason)
        self.transitions[k] = self.transitions.get(k, 0) + 1

    def call(self, op: str, seconds: float, ok: bool) -> None:
        """Record one database call."""
        buckets, total, n = self.calls.get(op) or ([0] * len(BUCKETS), 0.0, 0)
        for i, bound in enumerate(BUCKETS):
            if seconds <= bound:
                buckets[i] += 1
                break
        self.calls[op] = (buckets, total + seconds, n + 1)
        if ok:
            self.calls_ok += 1
        else:
            self.failures[op] = self.failures.get(op, 0) + 1
