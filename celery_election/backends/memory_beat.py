"""The in-process backend's beat store: entries' run state and the run ledger.

The same semantics as the SQL store (backends/sql_beat.py), on the memory backend's
dicts and under its lock: a claim is a compare-and-set under the lease's (token, term),
refused while the entry's last run is claimed and not confirmed; a claim to send writes
the run's row (memory_runs.py) under the same lock.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any, Protocol

from ..core.clock import Clock
from ..core.runstate import CLAIMED, run_key, run_task_id
from .base import (
    PendingRun,
    RunClaim,
    RunRequest,
    RunState,
    check_batch,
    next_run_count,
    pending_run,
)
from .memory_runs import MemoryRuns

__all__ = ["MemoryBeatStore"]


class _Host(Protocol):
    """What the store reads of its MemoryBackend (memory.py imports this module)."""

    clock: Clock
    _lock: threading.RLock
    _leases: dict[str, Any]
    _runs: dict[tuple[str, str], RunState]

    @property
    def runs(self) -> MemoryRuns: ...

    def _enter(self, name: str) -> None: ...

    def _holds(self, row: Any, now: int, token: str, term: int) -> bool: ...


class MemoryBeatStore:
    """Beat run state in the memory backend: the same compare-and-set as on SQL."""

    def __init__(self, backend: _Host) -> None:
        self.backend = backend

    def load_runs(self, namespace: str, *, timeout: float | None = None) -> dict[str, RunState]:
        """Every entry's run state in ``namespace``, by entry name."""
        b = self.backend
        b._enter("load_runs")
        with b._lock:
            return {entry: state for (ns, entry), state in b._runs.items() if ns == namespace}

    def _claim(self, namespace: str, token: str, term: int, r: RunRequest) -> RunClaim:
        b = self.backend
        leading = _leads(b, namespace, token, term)
        key = (namespace, r.entry_name)
        stored = b._runs.get(key)
        if not leading or _run_key(stored) != _run_key(r.expected) or _held(b, namespace, r):
            return RunClaim(False, stored, leading)
        count = next_run_count(r.expected, r.total_run_count)
        state = RunState(r.last_run_us, count, term, r.identity)
        b._runs[key] = state
        if r.pending:
            run = 0 if r.expected is None else r.expected.last_run_us
            task_id = run_task_id(namespace, r.entry_name, r.last_run_us)
            b.runs.claim(namespace, term, [(r.entry_name, run, task_id)], r.task_name)
        return RunClaim(True, state, True)

    def claim_runs(
        self,
        namespace: str,
        token: str,
        term: int,
        requests: Sequence[RunRequest],
        *,
        timeout: float | None = None,
    ) -> list[RunClaim]:
        """Many claims under one look at the lease, as the SQL store's batch statement."""
        check_batch(requests)
        b = self.backend
        b._enter("claim_runs")
        with b._lock:
            return [self._claim(namespace, token, term, r) for r in requests]

    def pending_runs(self, namespace: str, *, timeout: float | None = None) -> list[PendingRun]:
        """The runs claimed and not yet confirmed in ``namespace``, oldest first."""
        b = self.backend
        b._enter("pending_runs")
        with b._lock:
            found = [pending_run(namespace, s.row.entry, s.row.due, s.row.term, s.created_us,
                                 s.row.task_id, b._runs.get((namespace, s.row.entry)))
                     for s in b.runs.claimed(namespace)]  # fmt: skip
        return [p for p in found if p is not None]


def _leads(b: _Host, namespace: str, token: str, term: int) -> bool:
    """The beat claims' fence: the lease has this token and term and has not expired."""
    row = b._leases.get(namespace)
    return row is not None and b._holds(row, b.clock.wall_us(), token, term)


def _held(b: _Host, namespace: str, r: RunRequest) -> bool:
    """Whether the entry's last run (the one ``r`` follows) is claimed and not confirmed."""
    if r.expected is None:
        return False
    key = run_key(run_task_id(namespace, r.entry_name, r.expected.last_run_us))
    stored = b.runs.peek(namespace, key)
    return stored is not None and stored.row.state == CLAIMED


def _run_key(state: RunState | None) -> tuple[int, int] | None:
    """What a claim compares (the SQL store's WHERE): when it last ran, and how often."""
    return None if state is None else (state.last_run_us, state.total_run_count)
