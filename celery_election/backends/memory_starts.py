"""Task runs' start records in the memory backend, with the SQL store's semantics.

A dict under the backend's lock stands for the table: ``record_start`` inserts if absent,
``rerun_start`` and ``record_finish`` compare and set, as sql_starts.py's statements do.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable

from ..clock import Clock
from .base import TaskStart

__all__ = ["MemoryStartStore"]


class MemoryStartStore:
    """The :class:`~celery_election.backends.base.StartStore` of a :class:`MemoryBackend`."""

    def __init__(self, clock: Clock, enter: Callable[[str], None]) -> None:
        """``enter(name)``: the backend's accounting and faults (a stalled, failing call)."""
        self.clock, self._enter = clock, enter
        self._lock = threading.Lock()
        self._rows: dict[tuple[str, str], TaskStart] = {}

    def _now(self) -> int:
        return self.clock.wall_us()

    def prune_starts(
        self, namespace: str, older_than: float, *, batch: int = 5000, timeout: float | None = None
    ) -> int:
        """Delete up to ``batch`` records of ``namespace`` older than ``older_than`` seconds."""
        self._enter("prune_starts")
        cut = self._now() - int(older_than * 1_000_000)
        with self._lock:
            old = [k for k, r in self._rows.items() if k[0] == namespace and r.started_at_us < cut]
            for key in old[:batch]:
                del self._rows[key]
            return min(len(old), batch)

    def record_start(
        self, namespace: str, start: TaskStart, *, timeout: float | None = None
    ) -> bool:
        """Store ``start`` (started now, attempt 1) unless its key exists."""
        self._enter("record_start")
        with self._lock:
            key = (namespace, start.run_key)
            if key in self._rows:
                return False
            fresh = dataclasses.replace(
                start, attempt=1, started_at_us=self._now(), finished_at_us=None, outcome=None
            )
            self._rows[key] = fresh
            return True

    def rerun_start(
        self,
        namespace: str,
        run_key: str,
        attempt: int,
        hostname: str,
        pid: int,
        *,
        timeout: float | None = None,
    ) -> bool:
        """Take the unfinished ``attempt`` over for one more."""
        self._enter("rerun_start")
        with self._lock:
            row = self._rows.get((namespace, run_key))
            if row is None or row.attempt != attempt or row.finished_at_us is not None:
                return False
            self._rows[(namespace, run_key)] = dataclasses.replace(
                row, attempt=attempt + 1, hostname=hostname, pid=pid, started_at_us=self._now()
            )
            return True

    def record_finish(
        self,
        namespace: str,
        run_key: str,
        outcome: str,
        *,
        attempt: int = 1,
        timeout: float | None = None,
    ) -> bool:
        """Mark ``attempt`` finished with ``outcome``."""
        self._enter("record_finish")
        with self._lock:
            row = self._rows.get((namespace, run_key))
            if row is None or row.attempt != attempt or row.finished_at_us is not None:
                return False
            self._rows[(namespace, run_key)] = dataclasses.replace(
                row, finished_at_us=self._now(), outcome=outcome[:16]
            )
            return True

    def load_start(
        self, namespace: str, run_key: str, *, timeout: float | None = None
    ) -> TaskStart | None:
        """The start record of ``run_key``, or None."""
        self._enter("load_start")
        with self._lock:
            return self._rows.get((namespace, run_key))

    def load_starts(
        self,
        namespace: str,
        *,
        task_id: str | None = None,
        limit: int = 100,
        timeout: float | None = None,
    ) -> list[TaskStart]:
        """The newest start records (of one task id if given), newest first."""
        self._enter("load_starts")
        with self._lock:
            rows = [
                r
                for (ns, _), r in self._rows.items()
                if ns == namespace and (task_id is None or r.task_id == task_id)
            ]
        rows.sort(key=lambda r: (-r.started_at_us, r.run_key))
        return rows[:limit]
