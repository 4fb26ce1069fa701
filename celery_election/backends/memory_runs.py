"""The run rows in memory: each call applies one of runstate.py's transitions under a lock.

The SQL store will run the same transitions as one conditional statement each (the claim
fenced by the lease row, as ``claim_runs`` is); this one is what the seeded simulation
(harness/runsim.py) runs. A call is atomic: it changes the rows, or nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Sequence

from .. import runstate
from ..runstate import Delivery, Row, Start

__all__ = ["MemoryRuns"]

Key = tuple[str, str, int]  # (namespace, entry, due)


class MemoryRuns:
    """One row per run, by (namespace, entry, due).

    ``leads(namespace, term)``: whether ``term`` holds the lease now (the claim's fence);
    ``alive(worker)``: whether a worker process named in a row still lives (its liveness).
    """

    def __init__(
        self,
        leads: Callable[[str, int], bool],
        alive: Callable[[str], bool],
    ) -> None:
        self.leads, self.alive = leads, alive
        self._lock = threading.Lock()
        self._rows: dict[Key, Row] = {}

    def claim(self, namespace: str, term: int, runs: Sequence[tuple[str, int, str]]) -> list[bool]:
        """Claim each (entry, due, task id) under ``term``: which runs this call created.

        All or none: a term that no longer leads claims nothing.
        """
        with self._lock:
            if not self.leads(namespace, term):
                return [False] * len(runs)
            won = []
            for entry, due, task_id in runs:
                key = (namespace, entry, due)
                row = runstate.claim(self._rows.get(key), entry, due, task_id, term)
                if row is not None:
                    self._rows[key] = row
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
            for key, row in self._rows.items():
                if key[0] != namespace:
                    continue
                adopted = runstate.adopt(row, term)
                if adopted is not None:
                    self._rows[key] = row = adopted
                if runstate.owes(row, term):
                    out.append(row)
            return out

    def confirm(self, namespace: str, runs: Collection[tuple[str, int]]) -> int:
        """The broker accepted these runs: mark them sent; how many changed."""
        return self._apply(namespace, runs, runstate.confirm)

    def start(self, namespace: str, d: Delivery) -> Start:
        """Delivery ``d``'s start: run, skip or put off (runstate.start), its row written."""
        with self._lock:
            key = (namespace, d.entry, d.due)
            row = self._rows.get(key)
            alive = row is None or row.worker is None or self.alive(row.worker)
            decided = runstate.start(row, d, starter_alive=alive)
            if decided.row is not None:
                self._rows[key] = decided.row
            return decided

    def release(self, namespace: str, entry: str, due: int, delivery: str) -> bool:
        """A started delivery gives its run back before the body (it was put off)."""
        return self._apply(namespace, [(entry, due)], lambda r: runstate.release(r, delivery)) == 1

    def finish(self, namespace: str, entry: str, due: int, delivery: str, outcome: str) -> bool:
        """The body of ``delivery`` ended: close the run (if that delivery still runs it)."""
        done = self._apply(
            namespace, [(entry, due)], lambda r: runstate.finish(r, delivery, outcome)
        )
        return done == 1

    def reap(self, namespace: str) -> int:
        """Close the early-acknowledged runs whose worker died mid-body; how many."""
        with self._lock:
            rows = [(k, r) for k, r in self._rows.items() if k[0] == namespace]
            reaped = 0
            for key, row in rows:
                new = runstate.reap(row, row.worker is None or self.alive(row.worker))
                if new is not None:
                    self._rows[key] = new
                    reaped += 1
            return reaped

    def rows(self, namespace: str) -> list[Row]:
        """Every run of ``namespace`` (history, status, the page read these)."""
        with self._lock:
            return [r for k, r in self._rows.items() if k[0] == namespace]

    def _apply(
        self, namespace: str, runs: Collection[tuple[str, int]], step: Callable[[Row], Row | None]
    ) -> int:
        changed = 0
        with self._lock:
            for entry, due in runs:
                key = (namespace, entry, due)
                row = self._rows.get(key)
                new = None if row is None else step(row)
                if new is not None:
                    self._rows[key] = new
                    changed += 1
        return changed
