"""A brute-force reference for cron's daylight-saving rules, to check ``beat/cron.py`` against.

It shares nothing with the code it checks but the field sets: it steps every UTC minute,
reads the wall clock with ``zoneinfo`` and applies Vixie cron's loop as cron(8) states it.
The highest wall-clock minute reached so far is cron's "virtual time": a minute above it
by more than one means the clock jumped (a gap: fixed-time jobs run now for the skipped
minutes that match); a minute at or below it was seen before (a repeated hour: only
wildcard jobs run). Matching: month, day of month and day of week all match (Celery's).
"""

from __future__ import annotations

import zoneinfo
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any
from zoneinfo import ZoneInfo

from celery.schedules import crontab

from celery_election.schedule.cron import CronFields, next_run

UTC = timezone.utc
MINUTE = timedelta(minutes=1)
WINDOW = timedelta(days=2)  # checked on each side of a transition

#: Representative crontabs (minute hour day-of-month month day-of-week): fixed times in
#: the gap or repeated hour of the common rules (02:00-03:00 in Europe and the US, 01:00-
#: 03:00 in Antarctica/Troll, 02:00-02:30 / 01:30-02:00 on Lord Howe, 02:45-03:45 on
#: Chatham, around midnight in Santiago and Havana), hourly and more frequent wildcard
#: jobs, a wildcard minute in a fixed hour, fixed hour lists, a weekday.
CRONTABS = [
    "30 2 * * *", "0 2 * * *", "15 2 * * *", "45 1 * * *", "0 1 * * *", "30 1 * * *",
    "0 3 * * *", "59 2 * * *", "0 0 * * *", "30 0 * * *", "30 23 * * *", "50 2 * * *",
    "0 * * * *", "*/15 * * * *", "*/20 2 * * *", "30 1-3 * * *", "0,30 0-3 * * 0",
]  # fmt: skip


def fields_of(text: str) -> CronFields:
    m, h, dom, moy, dow = text.split()
    return CronFields.of(crontab(m, h, dow, dom, moy))


def _matches(f: CronFields, local: datetime) -> bool:
    return (
        local.minute in f.minutes
        and local.hour in f.hours
        and local.month in f.months
        and local.day in f.days_of_month
        and local.isoweekday() % 7 in f.days_of_week
    )


def reference_runs(
    fields: Sequence[CronFields], tz: ZoneInfo, start: datetime, end: datetime
) -> list[list[datetime]]:
    """Each crontab's runs in (start, end], by stepping every UTC minute (start: on a minute)."""
    runs: list[list[datetime]] = [[] for _ in fields]
    virtual = start.astimezone(tz).replace(tzinfo=None, fold=0)
    u = start
    while u < end:
        u += MINUTE
        local = u.astimezone(tz).replace(tzinfo=None, fold=0)
        if local > virtual:
            skipped = []
            s = virtual + MINUTE
            while s < local:  # the clock jumped: the minutes it skipped
                skipped.append(s)
                s += MINUTE
            for f, out in zip(fields, runs, strict=True):
                if _matches(f, local) or (not f.wildcard and any(_matches(f, x) for x in skipped)):
                    out.append(u)
            virtual = local
        else:  # seen before: a repeated hour
            for f, out in zip(fields, runs, strict=True):
                if f.wildcard and _matches(f, local):
                    out.append(u)
    return runs


def function_runs(f: CronFields, tz: ZoneInfo, start: datetime, end: datetime) -> list[datetime]:
    """The runs in (start, end] as ``next_run`` gives them, one after the other."""
    out: list[datetime] = []
    t: datetime | None = start
    while True:
        t = next_run(f, tz, t) if t is not None else None
        if t is None or t > end:
            return out
        out.append(t)


def transitions(tz: ZoneInfo, years: Iterable[int]) -> list[datetime]:
    """Instants (UTC, to the minute) at which the zone's offset changes in these years."""
    out = []
    for year in years:
        t = datetime(year, 1, 1, tzinfo=UTC)
        end = datetime(year + 1, 1, 1, tzinfo=UTC)
        step = timedelta(hours=3)
        off = t.astimezone(tz).utcoffset()
        while t < end:
            nxt = t + step
            noff = nxt.astimezone(tz).utcoffset()
            if noff != off:
                lo, hi = t, nxt
                while hi - lo > MINUTE:
                    mid = lo + (hi - lo) / 2
                    mid = mid.replace(second=0, microsecond=0)
                    if mid <= lo:
                        mid = lo + MINUTE
                    if mid.astimezone(tz).utcoffset() == off:
                        lo = mid
                    else:
                        hi = mid
                out.append(hi)
            t, off = nxt, noff
    return out


@dataclass
class Sweep:
    zones: int = 0
    transitions: int = 0
    windows: int = 0
    runs: int = 0
    differences: list[str] | None = None


def sweep(zones: Iterable[str], years: Sequence[int], crontabs: Sequence[str] = CRONTABS) -> Sweep:
    """Compare ``next_run`` with the reference around every transition of these zones."""
    result = Sweep(differences=[])
    assert result.differences is not None
    fields = [fields_of(c) for c in crontabs]
    for name in sorted(zones):
        tz = ZoneInfo(name)
        found = transitions(tz, years)
        if not found:
            continue
        result.zones += 1
        result.transitions += len(found)
        windows: list[list[Any]] = []
        for t in found:  # merge windows that overlap (transitions days apart)
            if windows and t - WINDOW <= windows[-1][1]:
                windows[-1][1] = t + WINDOW
            else:
                windows.append([t - WINDOW, t + WINDOW])
        for start, end in windows:
            result.windows += 1
            expected = reference_runs(fields, tz, start, end)
            for text, f, want in zip(crontabs, fields, expected, strict=True):
                got = function_runs(f, tz, start, end)
                result.runs += len(want)
                if got != want:
                    extra = sorted(set(got) - set(want))[:3]
                    missing = sorted(set(want) - set(got))[:3]
                    result.differences.append(
                        f"{name} {text!r} {start:%Y-%m-%d}: next_run also {extra}, lacks {missing}"
                    )
    return result


def zones_with_transitions(years: Sequence[int]) -> list[str]:
    return sorted(z for z in zoneinfo.available_timezones() if transitions(ZoneInfo(z), years))
