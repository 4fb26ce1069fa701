"""The run rows in memory: each call applies one of core/runstate.py's transitions under a lock.

The SQL store (sql_runs.py) applies the same transitions with one conditional statement
each; this one is the memory backend's, and what the seeded simulation
(harness/runsim.py) runs. A call is atomic: it changes the rows, or nothing.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Collection, Sequence
from dataclasses import replace

from ..core import runstate
from ..core.runstate import Delivery, Row, Start, run_key
from .base import Alive, End, RunRecord

__all__ = ["MemoryRuns"]


class MemoryRuns:
    """One row per run, by (namespace, run key).

    ``leads(namespace, term)``: whether ``term`` holds the lease now (the claim's fence);
    ``now()``: the store's clock in epoch microseconds (the database's, in SQL);
    ``enter(call)``: the memory backend's accounting and faults, before each call;
    ``lock``: the backend's (re-entrant), so a beat claim and its rows are one change.
    """

    def __init__(
        self,
        leads: Callable[[str, int], bool],
        now: Callable[[], int] = lambda: 0,
        enter: Callable[[str], None] = lambda call: None,
        lock: threading.RLock | None = None,
    ) -> None:
        self.leads, self.now, self._enter = leads, now, enter
        self._lock = lock or threading.RLock()
        self._rows: dict[tuple[str, str], RunRecord] = {}

    def claim(
        self, namespace: str, term: int, runs: Sequence[tuple[str, int, str]], task_name: str = ""
    ) -> list[bool]:
        """Claim each (entry, due, task id) under ``term``: which runs this call created.

        All or none: a term that no longer leads claims nothing.
        """
        with self._lock:
            if not self.leads(namespace, term):
                return [False] * len(runs)
            won = []
            for entry, due, task_id in runs:
                key = (namespace, run_key(task_id))
                old = self._rows.get(key)
                row = runstate.claim(old.row if old else None, entry, due, task_id, term)
                if row is not None:
                    self._rows[key] = RunRecord(key[1], row, task_name or entry, "", self.now())
                won.append(row is not None)
            return won

    def owed(self, namespace: str, term: int) -> list[Row]:
        """The runs ``term`` must send: its own unsent claims, and earlier terms' (adopted).

        Read from the rows every time, never from what the leader remembers: a claim whose
        answer was lost, a mark that failed, a send that was never tried are all here.
        """
        with self._lock:
            if not self.leads(namespace, term):
                return []
            out = []
            for key, stored in self._rows.items():
                if key[0] != namespace:
                    continue
                row = stored.row
                adopted = runstate.adopt(row, term)
                if adopted is not None:
                    self._rows[key] = replace(stored, row=adopted)
                    row = adopted
                if runstate.owes(row, term):
                    out.append(row)
            return out

    def confirm(self, namespace: str, task_ids: Collection[str]) -> int:
        """The broker accepted these runs: mark them sent; how many changed."""
        keys = [run_key(t) for t in task_ids]
        return sum(self._apply(namespace, k, runstate.confirm) for k in keys)

    def drop(self, namespace: str, task_ids: Collection[str], why: str) -> int:
        """Give up these claimed runs unsent (expired, entry removed); how many changed."""
        keys = [run_key(t) for t in task_ids]
        return sum(self._apply(namespace, k, lambda r: runstate.drop(r, r.term, why))
                   for k in keys)  # fmt: skip

    def claimed(self, namespace: str) -> list[RunRecord]:
        """The runs claimed and not confirmed yet, whichever term claimed them, oldest first."""
        with self._lock:
            found = [s for (ns, _), s in self._rows.items()
                     if ns == namespace and s.row.state == runstate.CLAIMED]  # fmt: skip
        return sorted(found, key=lambda s: s.created_us)

    def clear(self) -> None:
        """Forget every run (the backend's uninstall)."""
        with self._lock:
            self._rows.clear()

    def start(
        self, namespace: str, d: Delivery, alive: Alive, *, task_name: str = "", hostname: str = "",
        ends: Sequence[End] = (),
    ) -> Start:  # fmt: skip
        """Delivery ``d``'s start: run, skip or put off (runstate.start), its row written.

        ``ends``: earlier runs' ends, written first, under the same lock.
        """
        self._enter("start")
        with self._lock:
            for ns, run, token, outcome in ends:
                self._step(
                    ns, run, functools.partial(runstate.finish, delivery=token, outcome=outcome)
                )
            key = (namespace, d.key)
            old = self._rows.get(key)
            decided = runstate.start(old.row if old else None, d, alive)
            if decided.row is not None:
                if old is None:
                    old = RunRecord(d.key, decided.row, task_name, hostname, self.now())
                self._rows[key] = replace(old, row=decided.row, hostname=hostname or old.hostname)
            return decided

    def release(self, namespace: str, key: str, delivery: str) -> bool:
        """A started delivery gives its run back before the body (it was put off)."""
        return self._apply(namespace, key, lambda r: runstate.release(r, delivery))

    def finish(self, namespace: str, key: str, delivery: str, outcome: str) -> bool:
        """The body of ``delivery`` ended: close the run (if that delivery still runs it)."""
        return self._apply(namespace, key, lambda r: runstate.finish(r, delivery, outcome))

    def reap(self, namespace: str, alive: Alive) -> int:
        """Close the early-acknowledged runs whose worker died mid-body; how many."""
        with self._lock:
            keys = [k for k in self._rows if k[0] == namespace]
        return sum(self._apply(namespace, k[1], lambda r: runstate.reap(r, alive)) for k in keys)

    def rows(self, namespace: str) -> list[Row]:
        """Every run of ``namespace`` (history, status, the page read these)."""
        with self._lock:
            return [s.row for k, s in self._rows.items() if k[0] == namespace]

    def load(self, namespace: str, key: str) -> RunRecord | None:
        """The run of ``key``, or None."""
        self._enter("load")
        return self.peek(namespace, key)

    def peek(self, namespace: str, key: str) -> RunRecord | None:
        """The run of ``key`` as a step of another store reads it (no call of its own)."""
        with self._lock:
            return self._rows.get((namespace, key))

    def newest(
        self, namespace: str, *, task_id: str | None = None, limit: int = 100
    ) -> list[RunRecord]:
        """The newest runs (of one task id if given), newest first."""
        self._enter("newest")
        with self._lock:
            rows = [
                s for (ns, _), s in self._rows.items()
                if ns == namespace and (task_id is None or s.row.task_id == task_id)
            ]  # fmt: skip
        rows.sort(key=lambda s: (-s.created_us, s.key))
        return rows[:limit]

    def prune(
        self, namespace: str, older_than: float, *, batch: int = 5000, history: bool = False
    ) -> int:
        """Delete up to ``batch`` runs of ``namespace`` written ``older_than`` s ago.

        ``history``: the runs a beat claimed (they have a term), else the others.
        """
        self._enter("prune")
        cut = self.now() - int(older_than * 1_000_000)
        with self._lock:
            old = [k for k, s in self._rows.items() if k[0] == namespace and s.created_us < cut
                   and s.row.state != runstate.CLAIMED and bool(s.row.term) == history]  # fmt: skip
            for key in old[:batch]:
                del self._rows[key]
            return min(len(old), batch)

    def _apply(self, namespace: str, key: str, step: Callable[[Row], Row | None]) -> bool:
        self._enter("change")
        return self._step(namespace, key, step)

    def _step(self, namespace: str, key: str, step: Callable[[Row], Row | None]) -> bool:
        with self._lock:
            stored = self._rows.get((namespace, key))
            new = None if stored is None else step(stored.row)
            if stored is None or new is None:
                return False
            ended = self.now() if new.state == runstate.ENDED else stored.ended_us
            self._rows[(namespace, key)] = replace(stored, row=new, ended_us=ended)
            return True
