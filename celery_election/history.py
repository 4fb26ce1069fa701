"""An append-only history of leadership and leader actions (the checker is harness.checker).

Why: "it never had two leaders" is a claim about what every process *believed* and *did*,
so each process writes its own record and one checker reads them all afterwards. A
process appends JSON lines to a file opened with O_APPEND, one ``write`` per line, so
several processes may share one file and a SIGKILL loses at most the line being written.

Records (``k`` is the kind):

* ``trust``: the elector's trust window changed. ``term``/``until`` are the term and the
  boot-time reading until which leadership is trusted (a renewal moves ``until``), or
  None when leadership ended. Written synchronously by the election thread, from
  :meth:`Elector.watch_trust`, so it is never late by more than the clock reading.
* ``transition``: elected / revoked with its reason (for people; the checker uses trust).
* ``act``: something done as leader under ``term`` (a leader task, a write). ``mono`` is
  read *before* the leadership check that allowed it, so a correct process never records
  an act outside its own trust window.
* ``send``: a beat run sent under ``term``: ``entry``, ``run`` (the run's key: the stored
  last run it follows, epoch microseconds, 0 for an entry's first) and ``at`` (the run's
  own time as stored, on the database's clock).
* ``fault``: written by a fault driver (kind, target, start and end).

``mono`` is CLOCK_BOOTTIME: every process on a host reads the same clock, and no wall
clock skew touches it. That is why intervals from different processes can be compared.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .core.clock import boottime

if TYPE_CHECKING:
    from .election.elector import Elector

__all__ = ["Recorder"]


class Recorder:
    """Appends history records to ``path`` (shared safely between processes)."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        role: str = "",
        monotonic: Callable[[], float] = boottime,
    ) -> None:
        self.path = Path(path)
        self.role = role
        #: The elector's clock for deadlines (a FakeClock's in tests): ``until`` is on it.
        self.monotonic = monotonic
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._pid = os.getpid()
        self._max_err = 0.0
        # close() and the follower thread's last lines race: a write to a closed (or,
        # worse, reused) descriptor must not happen
        self._lock = threading.Lock()

    def record(self, record_kind: str, /, mono: float | None = None, **fields: Any) -> None:
        """One line: kind, wall and boot-time clock, pid, role, then ``fields``."""
        if os.getpid() != self._pid and self._fd >= 0:  # a forked child: its own descriptor
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            self._pid = os.getpid()
        now = self.monotonic()
        line = {"k": record_kind, "mono": now if mono is None else mono, "wall": time.time()}
        line.update(pid=self._pid, role=self.role, **fields)
        data = (json.dumps(line, separators=(",", ":")) + "\n").encode()
        with self._lock:
            if self._fd >= 0:
                os.write(self._fd, data)  # O_APPEND: one write is one whole line

    def attach(self, elector: Elector) -> Recorder:
        """Record every change of ``elector``'s trust window and every transition."""
        ns, cand = elector.namespace, elector.candidate_id

        def on_trust(term: int | None, until: float | None) -> None:
            # Called by the election thread right after the change: the clock is read here,
            # and the time taken to write the line is kept as this record's reading error.
            start = self.monotonic()
            self.record("trust", mono=start, ns=ns, cand=cand, term=term, until=until)
            self._record_error(start)

        elector.watch_trust(on_trust)
        sub = elector.subscribe()

        def follow() -> None:
            for t in sub:
                reason = t.reason.value if t.reason is not None else None
                self.record("transition", mono=t.at, ns=ns, cand=cand, term=t.term,
                            what=t.kind, reason=reason)  # fmt: skip

        threading.Thread(target=follow, name="history-recorder", daemon=True).start()
        return self

    def _record_error(self, start: float) -> None:
        # The largest gap between a clock reading and its line reaching the file bounds how
        # far any interval edge in this history can be off: the checker allows that much.
        err = self.monotonic() - start
        if err > self._max_err:
            self._max_err = err
            self.record("clock_error", seconds=err)

    def act(self, ns: str, term: int, mono: float, what: str = "act", **fields: Any) -> None:
        """Something done as leader under ``term``; ``mono`` read before the check."""
        self.record("act", mono=mono, ns=ns, term=term, what=what, **fields)

    def close(self) -> None:
        """Stop writing (idempotent); lines that arrive later are dropped."""
        with self._lock:
            fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)
