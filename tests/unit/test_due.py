"""When a beat entry's run falls due (``core/due.py``), as tables: one row per rule or bound.

No real time: every schedule reads a fixed clock (``nowfun``), and ``now`` is passed in.
Each bound of ``due_times`` is also a mutation (harness/mutations.py): without it a
catch-up counts a one-off that ran, or one due time ten thousand times.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from celery import Celery
from celery.schedules import crontab, schedule

from celery_election.core.due import due_after, due_times, in_window
from celery_election.schedule.spec import ZonedCrontab, from_spec

UTC = timezone.utc
T0 = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)
APP = Celery("due", set_as_current=False)
YEAR = 365 * 86_400


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def utc(y: int, mo: int, d: int, h: int, mi: int = 0) -> datetime:
    return datetime(y, mo, d, h, mi, tzinfo=UTC)


class Fixed:
    """A duck-typed schedule (no Celery): due ``left`` seconds from now, whatever its last run."""

    def __init__(self, left: float) -> None:
        self.left = left

    def remaining_estimate(self, last_run_at: datetime) -> timedelta:
        return timedelta(seconds=self.left)


def every(seconds: float, now: datetime) -> Any:
    return schedule(timedelta(seconds=seconds), app=APP, nowfun=lambda: now)


def berlin_hourly(now: datetime) -> Any:
    return ZonedCrontab("0", "*", "*", "*", "*", tz="Europe/Berlin", app=APP, nowfun=lambda: now)


def berlin_at(hour: int, now: datetime) -> Any:
    return ZonedCrontab("30", str(hour), "*", "*", "*", tz="Europe/Berlin", app=APP,
                        nowfun=lambda: now)  # fmt: skip


def one_off(when: datetime, now: datetime) -> Any:
    once = from_spec({"at": when.isoformat()}, APP)
    once.nowfun = lambda: now
    return once


@pytest.mark.parametrize(
    ("case", "sched", "last", "now", "expected"),
    [
        ("interval: last run + its period", every(10, at(35)), at(0), at(35), at(10)),
        ("interval: not yet due", every(10, at(5)), at(0), at(5), at(10)),
        ("never ran: counted from now", every(10, at(35)), at(35), at(35), at(45)),
        ("far in the past: due long ago", every(10, at(0)), at(-YEAR), at(0), at(-YEAR + 10)),
        ("a duck-typed schedule, no Celery", Fixed(-3), at(-60), at(0), at(-3)),
        ("Celery's crontab: the next minute", crontab(minute="*", app=APP, nowfun=lambda: at(150)),
         at(0), at(150), at(60)),
        # 2026-03-29 Berlin: 02:00 CET does not exist; after 01:00 CET (00:00 UTC) comes
        # 03:00 CEST (01:00 UTC), one real hour later
        ("crontab over the spring gap", berlin_hourly(utc(2026, 3, 29, 6)), utc(2026, 3, 29, 0),
         utc(2026, 3, 29, 6), utc(2026, 3, 29, 1)),
        # 02:30 on the gap day is skipped: cron runs it right after the gap, at 03:00 CEST
        ("a fixed time the gap skipped", berlin_at(2, utc(2026, 3, 29, 6)), utc(2026, 3, 28, 1, 30),
         utc(2026, 3, 29, 6), utc(2026, 3, 29, 1)),
        # 2026-10-25 Berlin: 02:00-03:00 comes twice; hourly runs at each real hour
        ("crontab over the fall-back", berlin_hourly(utc(2026, 10, 25, 6)), utc(2026, 10, 25, 0),
         utc(2026, 10, 25, 6), utc(2026, 10, 25, 1)),
        # 02:30 twice on the fall-back day: a fixed time runs at its first occurrence only
        ("a fixed time repeated", berlin_at(2, utc(2026, 10, 25, 6)), utc(2026, 10, 25, 0, 30),
         utc(2026, 10, 25, 6), utc(2026, 10, 26, 1, 30)),
        ("one-off before its time", one_off(at(20), at(5)), at(0), at(5), at(20)),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)  # fmt: skip
def test_due_after(
    case: str, sched: Any, last: datetime, now: datetime, expected: datetime
) -> None:
    assert due_after(sched, last, now) == expected


@pytest.mark.parametrize(
    ("case", "due", "start", "end", "expected"),
    [
        ("no window", at(10), None, None, at(10)),
        ("unknown stays unknown", None, at(0).isoformat(), at(99).isoformat(), None),
        ("before its start: at its start", at(10), at(30).isoformat(), None, at(30)),
        ("after its start: as it is", at(10), at(5).isoformat(), None, at(10)),
        ("at its end: still due", at(10), None, at(10).isoformat(), at(10)),
        ("after its end: never", at(10), None, at(9).isoformat(), None),
        ("moved to a start after its end: never", at(10), at(30).isoformat(), at(20).isoformat(),
         None),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)  # fmt: skip
def test_in_window(
    case: str, due: datetime | None, start: str | None, end: str | None, expected: datetime | None
) -> None:
    assert in_window(due, start, end) == expected


@pytest.mark.parametrize(
    ("case", "sched", "last", "now", "cap", "expected"),
    [
        ("interval: each missed time", every(10, at(35)), at(0), at(35), None,
         [at(10), at(20), at(30)]),
        ("due exactly now counts", every(10, at(30)), at(0), at(30), None,
         [at(10), at(20), at(30)]),
        ("never ran (last is now): nothing missed", every(10, at(35)), at(35), at(35), None, []),
        ("not yet due: nothing", every(10, at(35)), at(30), at(35), None, []),
        ("cap: at most cap", every(10, at(35)), at(0), at(35), 2, [at(10), at(20)]),
        ("one-off not run: once", one_off(at(20), at(35)), at(0), at(35), None, [at(20)]),
        ("one-off that ran: never again", one_off(at(20), at(35)), at(20), at(35), None, []),
        ("due again at the same time: once", Fixed(-5), at(0), at(35), None, [at(30)]),
        ("due before the last run: nothing", Fixed(-40), at(0), at(35), None, []),
        ("over the spring gap", berlin_hourly(utc(2026, 3, 29, 3)), utc(2026, 3, 28, 23),
         utc(2026, 3, 29, 3), None,
         [utc(2026, 3, 29, 0), utc(2026, 3, 29, 1), utc(2026, 3, 29, 2), utc(2026, 3, 29, 3)]),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)  # fmt: skip
def test_due_times(
    case: str, sched: Any, last: datetime, now: datetime, cap: int | None, expected: list[datetime]
) -> None:
    got = due_times(sched, last, now) if cap is None else due_times(sched, last, now, cap)
    assert got == expected


def test_far_in_the_past_stops_at_the_default_cap() -> None:
    """A 1 s interval last run a year ago: 10,000 due times, not 31 million."""
    times = due_times(every(1, at(0)), at(-YEAR), at(0))
    assert len(times) == 10_000
    assert (times[0], times[-1]) == (at(-YEAR + 1), at(-YEAR + 10_000))
