"""A dead-man's switch per beat entry: how long each entry is overdue.

An entry is *overdue* once a run of it fell due and was not sent, or (for an entry whose
runs report their end: workers with ``init_app``) was sent and not finished, within its
*grace*: one period of the entry, at most ``election_beat_overdue_grace``. Read from the
shared database (the run state and the run history), not from the beat's memory, so any
process can judge it, the leading beat's followers included, and it still holds when the
leader itself is gone.

``overdue`` and ``grace_for`` are the rule (pure, tests/unit/test_overdue.py);
``entry_due`` says when an entry falls due (the page's next due time too, one rule);
``entry_overdue`` applies it to an entry; ``OverdueWatch`` serves it as
``celery_election_beat_entry_overdue_seconds`` (``metrics.exporter.add_overdue_source``)
and the schedule page shows it (``observer.py``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from ..backends.schema import entry_key
from ..core.due import due_after, in_window
from ..metrics import exporter
from ..settings import ElectionSettings
from .api import Entry, Schedule
from .records import RunRecord
from .spec import from_spec

if TYPE_CHECKING:  # the Celery side's types; nothing from Celery is loaded here
    from celery import Celery

__all__ = ["OverdueWatch", "entry_due", "entry_overdue", "grace_for", "overdue", "overdue_by_entry"]

log = logging.getLogger("celery_election.schedule")


def grace_for(period: float | None, cap: float) -> float:
    """An entry's grace: one period, at most ``cap`` (no period known: ``cap``).

    One period: a run may be late until the next one falls due, not longer.
    """
    return cap if period is None or period <= 0 else min(period, cap)


def overdue(now: float, grace: float, *, due: float | None, open_due: float | None) -> float:
    """Seconds past the entry's deadline (0: on time); times in seconds on one clock.

    ``due``: when the entry falls due after its last run (None: never again, or not
    known). ``open_due``: when the oldest run that owes a finish fell due (None: none
    owes one). Each must be sent, or finished, within ``grace`` of falling due.
    """
    late = max((now - t for t in (due, open_due) if t is not None), default=0.0)
    return max(0.0, late - grace)


def entry_due(
    entry: Entry, last_us: int | None, now: datetime, app: Any
) -> tuple[datetime | None, float | None]:
    """(When ``entry`` falls due after its run at ``last_us``, seen at ``now``; its period, s).

    ``core.due`` on this host's clock, which cancels out: the last run's (database) clock.
    One that never ran (``last_us`` None) counts from now, as a beat that has just loaded
    it does. None: never due again, as the beat sends it: a one-off that ran, a due time
    past the entry's end (``in_window``, a one-off's too), or now past its end. The rule
    of the page's next due time and of the overdue seconds alike.
    """
    sched = from_spec(entry.spec, app=app)
    sched.nowfun = lambda: now  # Celery's clock read once: a second reading drifts
    ran = now if last_us is None else datetime.fromtimestamp(last_us / 1e6, tz=timezone.utc)
    due = due_after(sched, ran, now)
    if "at" in entry.spec:  # one run at a time: due until it ran, then never
        if last_us is not None and ran >= sched.at:
            return None, None
        period: float | None = None
    else:
        period = (due_after(sched, due, now) - due).total_seconds()
    if entry.expires_at and now >= datetime.fromisoformat(entry.expires_at):
        return None, period  # expired: owes nothing
    return in_window(due, entry.start_at, entry.expires_at), period


def entry_overdue(
    entry: Entry, open_run: RunRecord | None, now_us: int, cap: float, app: Any
) -> float:
    """Seconds ``entry`` is overdue at ``now_us`` (database clock); 0 while on time.

    A paused or disabled entry owes nothing. An entry that never ran is judged by its
    open runs only (a beat counts its first due time from when it loaded the entry).
    """
    if not entry.enabled or entry.paused:
        return 0.0
    due = period = None
    if entry.spec and entry.last_run_us is not None:
        try:
            at, period = entry_due(entry, entry.last_run_us, datetime.now(timezone.utc), app)
            due = None if at is None else at.timestamp()
        except Exception as exc:  # a schedule Celery cannot compute: judge the runs only
            log.debug("celery-election: due time of %s: %s", entry.name, exc)
    open_due = None
    if open_run is not None:
        open_due = (open_run.due_at or open_run.sent_at) / 1e6
    return overdue(now_us / 1e6, grace_for(period, cap), due=due, open_due=open_due)


def overdue_by_entry(
    schedule: Schedule, cap: float, entries: list[Entry] | None = None
) -> dict[str, float]:
    """Each entry of ``schedule`` (or ``entries``, as listed) with its overdue seconds.

    Two reads of the database besides the listing (the open runs, its clock).
    """
    if entries is None:
        entries = schedule.list()
    opened = schedule.store.open_runs(schedule.run_namespaces, [e.name for e in entries])
    now_us = schedule.store.db_now()
    return {
        e.name: entry_overdue(e, opened.get(entry_key(e.name)), now_us, cap, schedule.app)
        for e in entries
    }


class OverdueWatch:
    """Each entry's overdue seconds for /metrics, read from the database at a scrape.

    At most once every ``every`` seconds whatever the number of scrapers. Every worker and
    beat with a metrics port runs one, so the alert takes the largest value over them
    (``examples/prometheus/alerts.yml``) and fires whoever died.
    """

    def __init__(self, app: Celery, *, every: float = 1.0) -> None:
        self.app = app
        self.every = every
        self.cap = ElectionSettings.from_app(app).beat_overdue_grace
        self._schedule: Schedule | None = None
        self._cached: tuple[float, dict[tuple[str, str], float]] | None = None
        self._failing = False
        self._lock = threading.Lock()
        self._remove: Callable[[], None] | None = None

    def start(self) -> OverdueWatch:
        """Export from now on."""
        self._remove = exporter.add_overdue_source(self.read)
        return self

    def read(self) -> dict[tuple[str, str], float]:
        """(namespace, entry) -> overdue seconds; {} while the database does not answer."""
        with self._lock:
            now = time.monotonic()
            if self._cached is None or now - self._cached[0] >= self.every:
                self._cached = (now, self._read())
            return self._cached[1]

    def _read(self) -> dict[tuple[str, str], float]:
        try:
            if self._schedule is None:
                self._schedule = Schedule(self.app, actor="metrics", check_tasks=False)
            values = overdue_by_entry(self._schedule, self.cap)
        except Exception as exc:  # a scrape must answer: the entries' series go missing
            if not self._failing:
                log.warning("celery-election: entries' overdue seconds not read (%s)", exc)
            self._failing = True
            return {}
        self._failing = False
        ns = self._schedule.namespace
        return {(ns, name): seconds for name, seconds in values.items()}

    def close(self) -> None:
        """Stop exporting; close the connection of its own."""
        if self._remove is not None:
            self._remove()
            self._remove = None
        with self._lock:
            if self._schedule is not None:
                self._schedule.close()
                self._schedule = None
