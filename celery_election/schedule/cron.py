"""When a crontab runs across daylight-saving transitions: pure functions over UTC instants.

Celery's crontab reads the fields in local time and converts; at a fall-back it can answer
"due, next in 0 s" on every tick, and it skips or doubles runs around transitions in ways
that depend on the zone. Cron itself has settled rules (Vixie cron, cron(8)), applied here
by :func:`next_run`:

* A *wildcard* job (its minute or hour field starts with ``*``: hourly, ``*/15``) runs at
  every real occurrence of a matching wall-clock minute: both occurrences in a repeated
  hour, none in a skipped one (25 hourly runs on the fall-back day, 23 on the spring one).
* A *fixed-time* job runs once at a repeated wall-clock time (its first occurrence), and
  once right after a gap for its matching times that the gap skipped.

Matching follows Celery's crontab: month, day of month and day of week must all match
(Sunday is 0). Offsets are assumed to be whole minutes (true of every zone since 1972).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta, timezone, tzinfo
from functools import lru_cache
from typing import Any

__all__ = ["CronFields", "next_occurrence", "next_run"]

UTC = timezone.utc
_DAY = timedelta(days=1)
_MINUTE = timedelta(minutes=1)
Segment = tuple[datetime, datetime, timedelta]  # [start, end) in naive UTC, and its offset
_SEARCH_DAYS = 366 * 8  # a crontab no date of 8 years matches (e.g. Feb 30) never runs


@dataclass(frozen=True)
class CronFields:
    """A crontab's fields as sets, and whether cron counts it as a wildcard job."""

    minutes: frozenset[int]
    hours: frozenset[int]
    days_of_month: frozenset[int]
    months: frozenset[int]
    days_of_week: frozenset[int]  # 0 = Sunday
    wildcard: bool

    @classmethod
    def of(cls, c: Any) -> CronFields:
        """The fields of a Celery ``crontab`` (its parsed sets and original text)."""
        wild = str(c._orig_minute).startswith("*") or str(c._orig_hour).startswith("*")
        return cls(frozenset(c.minute), frozenset(c.hour), frozenset(c.day_of_month),
                   frozenset(c.month_of_year), frozenset(c.day_of_week), wild)  # fmt: skip

    def date_matches(self, d: date) -> bool:
        return (
            d.month in self.months
            and d.day in self.days_of_month
            and d.isoweekday() % 7 in self.days_of_week
        )


@lru_cache(maxsize=1024)
def _minutes_of_day(hours: frozenset[int], minutes: frozenset[int]) -> tuple[int, ...]:
    return tuple(h * 60 + m for h in sorted(hours) for m in sorted(minutes))


def next_run(fields: CronFields, tz: tzinfo, after: datetime) -> datetime | None:
    """The first instant after ``after`` at which cron runs the job (UTC); None: never."""
    return _next(fields, tz, after, "wild" if fields.wildcard else "fixed")


def next_occurrence(fields: CronFields, tz: tzinfo, after: datetime) -> datetime | None:
    """The first instant after ``after`` at which the fields match the wall clock, in UTC.

    Every real occurrence counts (both in a repeated hour), and a matching time a gap
    skipped counts at the gap's end: a superset of :func:`next_run`'s runs and of Celery's
    own crontab's, used to tell a real due time from a runaway answer.
    """
    return _next(fields, tz, after, "any")


def _next(fields: CronFields, tz: tzinfo, after: datetime, mode: str) -> datetime | None:
    if after.tzinfo is None:
        after = after.replace(tzinfo=UTC)
    a = after.astimezone(UTC).replace(tzinfo=None)  # naive UTC from here on
    today = (a + _offset(tz, a)).date()
    if len(_segments(tz, today)) == 1 and fields.date_matches(today):
        found = _first_after(fields, tz, today, a, mode)  # no transition within a day:
        if found is not None:  # the days before and after run before and after this
            return found.replace(tzinfo=UTC)
    day = today - _DAY  # a fall-back may repeat the day before
    best: datetime | None = None
    last_day: date | None = None
    for _ in range(_SEARCH_DAYS):
        if fields.date_matches(day):
            found = _first_after(fields, tz, day, a, mode)
            if found is not None and (best is None or found < best):
                best = found
        if best is not None:
            if last_day is None:
                last_day = day + _DAY  # the next day's runs may come first (a fall-back)
            elif day >= last_day:
                break
        day += _DAY
    return None if best is None else best.replace(tzinfo=UTC)


def _offset(tz: tzinfo, utc_naive: datetime) -> timedelta:
    off = utc_naive.replace(tzinfo=UTC).astimezone(tz).utcoffset()
    assert off is not None
    return off


def _first_after(
    fields: CronFields, tz: tzinfo, day: date, a: datetime, mode: str
) -> datetime | None:
    """The first run on local date ``day`` after ``a`` (naive UTC), or None.

    Within one constant-offset span local time and UTC move together, so the span's first
    matching minute is found by bisection; a fixed-time job skips the part of a span that
    repeats wall-clock time already passed, and runs at a span's start for matching
    minutes the jump into it skipped.
    """
    mods = _minutes_of_day(fields.hours, fields.minutes)
    midnight = datetime.combine(day, time())
    best: datetime | None = None
    seen: datetime | None = None  # the highest wall-clock time reached so far
    for i, (start, end, off) in enumerate(_segments(tz, day)):
        first_local = start + off
        if i and mode != "wild" and start > a and seen is not None and seen < first_local:
            hit = _first_minute(mods, midnight, seen, None)  # a gap: [seen, first_local)
            if hit is not None and hit < first_local and (best is None or start < best):
                best = start
        lowest = first_local if mode != "fixed" or seen is None else max(first_local, seen)
        hit = _first_minute(mods, midnight, lowest, a + off)
        if hit is not None and hit < end + off and (best is None or hit - off < best):
            best = hit - off
        seen = end + off if seen is None else max(seen, end + off)
    return best


def _first_minute(
    mods: tuple[int, ...], midnight: datetime, lowest: datetime, above: datetime | None
) -> datetime | None:
    """The first matching minute of the day at or after ``lowest`` and after ``above``."""
    k = -((midnight - lowest) // _MINUTE)  # ceil: minutes from midnight
    if above is not None:
        k = max(k, (above - midnight) // _MINUTE + 1)
    i = bisect.bisect_left(mods, k)
    return midnight + mods[i] * _MINUTE if i < len(mods) else None


@lru_cache(maxsize=4096)
def _segments(tz: tzinfo, day: date) -> tuple[Segment, ...]:
    """The offsets in force around local date ``day``, as constant-offset UTC spans.

    Any instant whose local date is ``day`` lies within a day of ``day``'s UTC midnight
    (offsets stay within +-14 h): offsets read at four UTC midnights find the
    transitions there, each then located to the second (at most one per day assumed).
    """
    probes = [datetime.combine(day, time()) + k * _DAY for k in (-1, 0, 1, 2)]
    offs = [_offset(tz, p) for p in probes]
    if offs[0] == offs[-1] and len(set(offs)) == 1:
        return ((probes[0], probes[-1], offs[0]),)
    out: list[Segment] = []
    start = probes[0]
    for p, q, po, qo in zip(probes, probes[1:], offs, offs[1:], strict=False):
        if po == qo:
            continue
        lo, hi = p, q  # offset po at lo, qo at hi: the change is in (lo, hi]
        while hi - lo > timedelta(seconds=1):
            mid = lo + (hi - lo) / 2
            mid = mid.replace(microsecond=0)
            if mid <= lo:
                mid = lo + timedelta(seconds=1)
            if _offset(tz, mid) == po:
                lo = mid
            else:
                hi = mid
        out.append((start, hi, po))
        start = hi
    out.append((start, probes[-1], offs[-1]))
    return tuple(out)
