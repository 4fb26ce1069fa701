"""The leadership history and the rows of runs not sent, written off the tick thread.

A run sent is its own row, written by its claim (backends/sql_runs.py). What the leading
beat skipped or missed (``schedule history``, the page) and which terms it led (the
timeline) are queued by the tick and written by a thread of their own.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from ..core.clock import boottime
from ..errors import ElectionError
from ..schedule.store import SQLScheduleStore
from .burst_costs import PAUSE_MAX

__all__ = ["HistoryWriter"]

log = logging.getLogger("celery_election.beat")


class HistoryWriter:
    """History rows written by a thread of their own, a batch every ``every`` seconds.

    A policy's decision then costs the tick loop nothing more. A batch that fails is
    kept for the next one (up to ``limit`` rows: these rows are best effort; the runs'
    own rows are written by their claims).

    While a burst goes on (:meth:`hold`) the batches wait for its end: building them took
    the interpreter from the tick thread, and a burst of 10,000 went out 0.7 s later
    (benchmarks/beat_burst_profile.py). They wait :data:`~.burst_costs.PAUSE_MAX` seconds
    at most, or until half of ``limit`` rows are queued.
    """

    #: Seconds between two marks of the led term's ``seen_at`` (its end after a crash).
    SEEN_EVERY = 1.0

    def __init__(
        self, store: SQLScheduleStore, every: float = 0.25, limit: int = 50_000,
        prune: Callable[[], float] | None = None,
    ) -> None:  # fmt: skip
        """``prune``: the leader's retention, on this thread while a term is led.

        It returns the seconds until its next call (0: a whole batch went, again at once).
        """
        self.store, self.every, self.limit = store, every, limit
        self._prune, self._next_prune = prune, 0.0
        self._rows: list[dict[str, Any]] = []
        # leadership history: the term led now (namespace, term, label), whether its row is
        # written, when it was last marked seen, and terms that ended but are not marked so
        self._term: tuple[str, int, str] | None = None
        self._term_written = False
        self._seen_at = 0.0
        self._ended: list[tuple[str, int]] = []
        self._lock = threading.Lock()  # the queue
        self._writing = threading.Lock()  # one batch at a time, in order
        self._stop = threading.Event()
        self._held_since: float | None = None  # a burst goes on since then (hold)
        self._thread = threading.Thread(target=self._run, name="election-history", daemon=True)
        self._thread.start()

    def add(self, row: dict[str, Any]) -> None:
        with self._lock:
            if len(self._rows) < self.limit:
                self._rows.append(row)

    def lead(self, namespace: str, term: int | None, label: str) -> None:
        """The term this beat leads now (None: none); the thread records changes."""
        with self._lock:
            current = self._term
            if current is not None and (term is None or current[1] != term):
                if self._term_written:
                    self._ended.append(current[:2])
                self._term = None
            if term is not None and self._term is None:
                self._term, self._term_written, self._seen_at = (namespace, term, label), False, 0.0

    def _terms(self) -> None:
        """Write the leadership history's changes (best effort, retried next time)."""
        with self._lock:
            ended, self._ended = self._ended, []
            current, written = self._term, self._term_written
        try:
            for ns, term in ended:
                self.store.term_seen(ns, term, ended=True)
            if current is not None and not written:
                self.store.term_started(*current)
                with self._lock:
                    if self._term == current:
                        self._term_written, self._seen_at = True, boottime()
            elif current is not None and boottime() - self._seen_at >= self.SEEN_EVERY:
                self.store.term_seen(*current[:2])
                self._seen_at = boottime()
        except ElectionError as exc:
            log.debug("beat election: leadership history not written yet (%s)", exc)
            with self._lock:
                self._ended[:0] = ended

    def flush(self) -> None:
        """Write what is queued now, in the caller's thread."""
        with self._writing:
            self._terms()
            with self._lock:
                rows, self._rows = self._rows, []
            if not rows:
                return
            try:
                self.store.record_many(rows)
            except ElectionError as exc:
                log.warning("beat election: %d history rows not written yet (%s)", len(rows), exc)
                with self._lock:
                    self._rows[:0] = rows[: self.limit - len(self._rows)]

    def hold(self, burst: bool) -> None:
        """A burst goes on (``burst``): the thread's batches wait; or it is over."""
        self._held_since = (self._held_since or boottime()) if burst else None

    def _held(self) -> bool:
        since = self._held_since
        return (
            since is not None
            and boottime() - since < PAUSE_MAX
            and len(self._rows) < self.limit // 2
        )

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            if not self._held():
                self.flush()
                self._pruning()

    def _pruning(self) -> None:
        """A batch of the retention's deletes, if this beat leads and one is due.

        Between two batches of history, never on the tick thread.
        """
        if self._prune is None or self._term is None or boottime() < self._next_prune:
            return
        self._next_prune = boottime() + self._prune()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        with self._lock:
            if self._term is not None and self._term_written:
                self._ended.append(self._term[:2])
            self._term = None
        self.flush()
