"""The operable schedule's rules as tables: policies (``decide``), due times, specs.

``decide`` is a pure function of the missed due times, the clock and the entry's policies:
each row below is one situation an operator or an outage creates, and what must happen.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from celery import Celery
from celery.schedules import crontab, schedule

from celery_election.beat.catchup import Decision, decide
from celery_election.core.due import due_times
from celery_election.errors import ConfigurationError
from celery_election.schedule.spec import (
    POLICY_DEFAULTS,
    ZonedCrontab,
    check_policies,
    describe,
    from_spec,
    parse_schedule,
    to_spec,
)

T0 = datetime(2026, 11, 25, 12, 0, tzinfo=timezone.utc)
APP = Celery("rules", set_as_current=False)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def p(**kw: Any) -> dict[str, Any]:
    return check_policies(kw)


# (what, missed due times (s), now (s), policies, skip_before (s), busy, expected)
DECISIONS = [
    ("on time: send", [100], 100.2, p(), None, False, Decision()),
    ("latest after an outage: one run", [10, 20, 30], 30.5, p(), None, False, Decision()),
    ("latest with grace: the last is in time, one run", [10, 20, 30], 30.5, p(grace=5), None,
     False, Decision(skip_to=at(20), kind="missed", count=2)),
    ("latest with grace: all too late", [10, 20, 30], 60, p(grace=5), None, False,
     Decision(skip_to=at(60), kind="missed", count=3)),
    ("skip: late by more than 1 s", [10, 20], 40, p(catch_up="skip"), None, False,
     Decision(skip_to=at(40), kind="missed", count=2)),
    ("skip: on time is sent", [10], 10.5, p(catch_up="skip"), None, False, Decision()),
    ("skip: the missed go, the one in time stays", [10, 20], 20.5, p(catch_up="skip"), None,
     False, Decision(skip_to=at(10), kind="missed", count=1)),
    ("all: each run, stored as its due time", [10, 20, 30], 30.5, p(catch_up="all"), None,
     False, Decision(send_as=at(10))),
    ("all: at most catch_up_max", [10, 20, 30, 40], 40.5, p(catch_up="all", catch_up_max=2),
     None, False, Decision(skip_to=at(20), kind="missed", count=2)),
    ("all with grace: the too late are missed first", [10, 20, 30], 30.5,
     p(catch_up="all", grace=15), None, False, Decision(skip_to=at(10), kind="missed", count=1)),
    ("resumed skipping: due while paused is missed", [10, 20, 30], 30.5, p(), 25, False,
     Decision(skip_to=at(25), kind="missed", count=2)),
    ("resumed skipping: nothing due before it", [30], 30.5, p(), 25, False, Decision()),
    ("overlap: the previous run still runs", [10], 10.5, p(overlap="skip"), None, True,
     Decision(skip_to=at(10.5), kind="skipped", count=1)),
    ("nothing due: send (Celery decided)", [], 5, p(catch_up="skip"), None, False, Decision()),
]  # fmt: skip


@pytest.mark.parametrize(
    ("times", "now", "policies", "skip_before", "busy", "expected"),
    [row[1:] for row in DECISIONS],
    ids=[row[0] for row in DECISIONS],
)
def test_decide(
    times: list[float],
    now: float,
    policies: dict[str, Any],
    skip_before: float | None,
    busy: bool,
    expected: Decision,
) -> None:
    got = decide(
        [at(t) for t in times],
        at(now),
        policies,
        skip_before=None if skip_before is None else at(skip_before),
        busy=busy,
    )
    assert got == expected


def test_due_times_of_an_interval_a_crontab_and_a_one_off() -> None:
    every = schedule(timedelta(seconds=10), app=APP, nowfun=lambda: at(35))
    assert due_times(every, at(0), at(35)) == [at(10), at(20), at(30)]
    assert due_times(every, at(30), at(35)) == []
    assert len(due_times(every, at(0), at(35), cap=2)) == 2
    minutely = crontab(minute="*", app=APP, nowfun=lambda: at(150))
    assert due_times(minutely, at(0), at(150)) == [at(60), at(120)]
    once = from_spec({"at": at(20).isoformat()}, APP)
    once.nowfun = lambda: at(35)
    assert due_times(once, at(0), at(35)) == [at(20)]
    assert due_times(once, at(20), at(35)) == []  # it ran: never again
    assert once.is_due(at(0)).is_due and not once.is_due(at(20)).is_due


def test_a_zoned_crontab_is_read_in_its_own_time_zone() -> None:
    nine_paris = from_spec({"cron": "0 9 * * *", "tz": "Europe/Paris"}, APP)
    assert isinstance(nine_paris, ZonedCrontab)
    nine_paris.nowfun = lambda: datetime(2026, 11, 25, 8, 30, tzinfo=timezone.utc)
    # 09:00 in Paris in winter is 08:00 UTC: due since the last run the day before
    assert nine_paris.is_due(datetime(2026, 11, 24, 8, 0, 1, tzinfo=timezone.utc)).is_due
    nine_paris.nowfun = lambda: datetime(2026, 11, 25, 7, 30, tzinfo=timezone.utc)
    assert not nine_paris.is_due(datetime(2026, 11, 24, 8, 0, 1, tzinfo=timezone.utc)).is_due
    assert nine_paris != from_spec({"cron": "0 9 * * *", "tz": "UTC"}, APP)
    assert to_spec(nine_paris) == {"cron": "0 9 * * *", "tz": "Europe/Paris"}


SPECS = [
    ("every 10s", {"every": 10.0}, "every 10s"),
    ("10", {"every": 10.0}, "every 10s"),
    ("every 5 minutes", {"every": 300.0}, "every 5m"),
    ("2h", {"every": 7200.0}, "every 2h"),
    ("*/5 * * * *", {"cron": "*/5 * * * *"}, "cron */5 * * * * (app time zone)"),
    ("at 2026-12-01T10:00:00+00:00", {"at": "2026-12-01T10:00:00+00:00"},
     "once at 2026-12-01T10:00:00+00:00"),
    ("sunrise 48.85 2.35", {"solar": "sunrise", "lat": 48.85, "lon": 2.35},
     "at sunrise (48.85, 2.35)"),
]  # fmt: skip


@pytest.mark.parametrize(("text", "spec", "words"), SPECS)
def test_schedules_in_words(text: str, spec: dict[str, Any], words: str) -> None:
    assert parse_schedule(text) == spec
    assert describe(spec) == words
    assert to_spec(from_spec(spec, APP)) == spec  # a spec survives the round trip


BAD = [
    ("*/5 * * 99 *", {}, "bad crontab"),
    ("0 9 * * *", {"tz": "Mars/Base"}, "unknown time zone 'Mars/Base'"),
    ("every 0s", {}, "must be > 0"),
    ("at tomorrow", {}, "ISO 8601"),
    ("at 2026-12-01T10:00:00", {}, "has no zone"),
    ("sunrise 200 2", {}, "bad solar schedule"),
    ("whenever", {}, "cannot read the schedule"),
]


@pytest.mark.parametrize(("text", "kw", "says"), BAD)
def test_a_bad_schedule_is_one_line_that_says_what_to_write(
    text: str, kw: dict[str, Any], says: str
) -> None:
    with pytest.raises(ConfigurationError) as info:
        parse_schedule(text, **kw)
    assert says in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("policies", "says"),
    [
        ({"catch_up": "some"}, "catch_up must be one of latest, skip, all"),
        ({"overlap": "queue"}, "overlap must be one of allow, skip"),
        ({"catch_up_max": 0}, "catch_up_max must be a number >= 1"),
        ({"grace": -1}, "grace must be a number >= 0"),
        ({"overlap_timeout": 0}, "overlap_timeout must be a number >= 0"),
        ({"grace": "soon"}, "grace must be a number"),
    ],
)
def test_bad_policies_are_refused(policies: dict[str, Any], says: str) -> None:
    with pytest.raises(ConfigurationError, match=says):
        check_policies(policies)
    assert check_policies({}) == POLICY_DEFAULTS
