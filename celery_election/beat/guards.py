"""The leader's two cheap guards around Celery's answers: runaways, and unchanged schedules.

* :class:`RunawayGuard`: a schedule that answers "due" again too soon is held, not sent
  (Celery's crontab in a fall-back's repeated hour answers "due, next in 0 s" on every
  tick). No stock scheduler has this guard.
* :class:`SameSchedule`: Celery compares the whole schedule with its copy at every tick
  (O(N) per send); a schedule found equal is trusted while it cannot have changed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from celery.schedules import crontab, schedstate
from celery.schedules import schedule as interval
from celery.utils.time import maybe_make_aware

from ..core.clock import boottime
from ..schedule.cron import CronFields, next_occurrence
from .answers import Answers, shared_answer

__all__ = ["MIN_GAP", "RunawayGuard", "SameSchedule", "is_due_failed", "runaway_hold"]

log = logging.getLogger("celery_election.beat")

MIN_GAP = 1.0  # seconds: a schedule of no known period is not sent twice within this

#: Seconds a schedule found equal to its copy is trusted without comparing it again, as
#: long as it is the same dict, of the same size, not changed through the scheduler.
RECHECK_EVERY = 1.0
#: ... or this many times as long as the last full comparison took, if longer: the
#: safety net costs the tick thread at most 1/20 of its time (10,000 entries took 0.05 s
#: to compare, 1/6 of a burst's CPU when compared every second).
RECHECK_COST = 20.0
#: ... but not within a burst (a tick that sent a full batch answers 0 and the next one
#: goes on with it), for up to this many seconds: the comparisons every second cost a
#: 10,000-entry burst 3.5 % of its tick thread. Stock's tick is as blind between its own
#: comparisons, and the identity checks still run at every tick.
RECHECK_BURST = 10.0


class RunawayGuard:
    """Holds a due entry that its schedule would send again too soon (:func:`runaway_hold`).

    Checked before the run is reserved, so a held send changes no state: Celery re-heaps
    the entry at the end of the hold, and then asks its schedule again. The first held
    send after a run is logged at WARNING, the others at DEBUG; ``count(entry, "held")``
    counts each.
    """

    def __init__(self, count: Callable[[Any, str], None]) -> None:
        self._count = count
        self._warned: dict[str, Any] = {}  # entry name -> the last run its hold was logged for
        self._answers: Answers = {}  # crontab answers shared by a burst (shared_answer)

    def check(self, entry: Any, state: Any) -> Any:
        """Celery's answer ``state``, or a hold (not due) if sending now is a runaway."""
        due, answer = state
        if not due:
            return state
        hold = runaway_hold(entry, self._answers)
        if hold is None:
            return state
        wait, why = hold
        again = self._warned.get(entry.name) == entry.last_run_at
        level = logging.DEBUG if again else logging.WARNING
        self._warned[entry.name] = entry.last_run_at
        log.log(level, "beat election: %s not sent: its schedule %r answered due (next in %ss), "
                "but %s; held %.3fs (runaway guard)", entry.name, entry.schedule, answer, why,
                wait)  # fmt: skip
        self._count(entry, "held")
        return schedstate(False, wait)


def runaway_hold(entry: Any, answers: Answers | None = None) -> tuple[float, str] | None:
    """Seconds to hold a due ``entry`` and why, or None: sending it now is no runaway.

    * A crontab is sent only if its fields matched a wall-clock minute since its last run
      (``cron.next_occurrence``: each real occurrence, and a time a gap skipped at the
      gap's end), so never twice in one minute. Celery's crontab, last run in a fall-back's
      repeated hour before its time, answers due at every tick until that time comes round.
    * An interval (not ``relative``, which realigns to clock boundaries) is not sent again
      within ``run_every`` of its last run.
    * Any other schedule (solar, clocked, custom, relative) is not sent twice within
      :data:`MIN_GAP` (1 s).

    Only a counted run (``total_run_count`` > 0) is "sent" for the last two rules: an
    entry's ``last_run_at`` before its first run is when it appeared, and Celery's own
    tests send ``always due`` entries at once.

    ``answers``: a crontab's next occurrence, shared by equal crontabs whose last runs
    fell in the same minute (a burst's entries).
    """
    last = entry.last_run_at
    if last is None:
        return None
    schedule = entry.schedule
    now = maybe_make_aware(entry.default_now())
    last = maybe_make_aware(last)
    if isinstance(schedule, crontab):
        seen = shared_answer(
            answers, "seen", schedule, last, now,
            lambda: next_occurrence(CronFields.of(schedule), schedule.tz, last),
        )  # fmt: skip
        if seen is not None and seen > now:
            return (seen - now).total_seconds(), (
                f"its fields matched no minute since {last.isoformat()} (its last run, or "
                f"start); next at {seen.astimezone(schedule.tz).isoformat()}"
            )
        return None
    if not entry.total_run_count:
        return None
    if isinstance(schedule, interval) and not schedule.relative:
        period = schedule.run_every.total_seconds()
    else:
        period = MIN_GAP
    left = period - (now - last).total_seconds()
    if left > 0:
        return left, f"it ran {period - left:.3f}s ago ({last.isoformat()}), within {period:g}s"
    return None


class SameSchedule:
    """When Celery's ``schedules_equal`` need not compare the schedule with its copy again.

    A schedule found equal stays equal while it is the same dict, of the same size,
    changed by none of the scheduler's methods (:meth:`changed`: ``add``,
    ``update_from_dict``, ``merge_inplace``, ``install_default_entries``); a schedule
    replaced (a new dict: django-celery-beat's reload, a shelve read again after ``sync``)
    is compared. In case something writes into the dict directly, it is compared again
    every second anyway, or after 20 times as long as the comparison took, for a schedule
    so large that it took longer than 50 ms (not within a burst: :meth:`burst`).
    """

    def __init__(self) -> None:
        self._version = 0  # changes made through the scheduler's own methods
        self._equal: tuple[Any, Any, int, int] | None = None  # (old, new, len, version)
        self._until = 0.0
        self._burst_until = 0.0

    def changed(self) -> None:
        self._version += 1

    def burst(self, going_on: bool) -> None:
        """A tick sent a full batch (``going_on``) or ended the burst."""
        if not going_on:
            self._burst_until = 0.0
        elif not self._burst_until:
            self._burst_until = boottime() + RECHECK_BURST

    def known_equal(self, old: Any, new: Any) -> bool:
        """Whether ``old`` and ``new`` are the pair last found equal, unchanged since."""
        if old is None or new is None or self._equal is None:
            return False
        was_old, was_new, size, version = self._equal
        return (
            old is was_old
            and new is was_new
            and len(new) == size
            and version == self._version
            and boottime() < max(self._until, self._burst_until)
        )

    def found(self, old: Any, new: Any, equal: bool, took: float) -> None:
        """Celery compared ``old`` and ``new`` (a copy: ``took`` 0) and answered ``equal``."""
        if equal and old is not None and new is not None:
            self._equal = (old, new, len(new), self._version)
            self._until = boottime() + max(RECHECK_EVERY, RECHECK_COST * took)
        else:
            self._equal = None


def is_due_failed(entry: Any, max_interval: float) -> tuple[bool, float]:
    """Celery 5.7's answer for an entry whose next run cannot be computed: later, alone."""
    log.error("beat: Cannot calculate the next run of %r, trying again in %ss.",
              entry.name, max_interval, exc_info=True)  # fmt: skip
    return False, max_interval
