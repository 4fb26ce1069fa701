"""Cron's daylight-saving rules for the operable schedule's crontabs (``beat/cron.py``).

No real time: ``next_run`` is a pure function of the fields, the zone and an instant, and
``ZonedCrontab`` is read through a fake clock. The rules (Vixie cron, cron(8)): a wildcard
job (minute or hour field starting with ``*``) runs at every real occurrence; a fixed-time
job runs once at a repeated time (its first occurrence) and once right after a gap that
skipped its time. The full sweep over every zone is ``benchmarks/cron_dst.py``.
"""

from __future__ import annotations

from datetime import date, datetime, time, timedelta, timezone
from zoneinfo import ZoneInfo

import celery
import pytest
from celery import Celery
from celery.schedules import crontab

from celery_election.core.due import due_times
from celery_election.schedule.cron import CronFields, next_occurrence, next_run
from celery_election.schedule.spec import ZonedCrontab
from harness.cron_reference import fields_of, function_runs, sweep

UTC = timezone.utc


def day_runs(cron: str, zone: str, day: date) -> list[str]:
    """The runs whose instant falls on local date ``day`` (local wall-clock times, offsets)."""
    tz = ZoneInfo(zone)
    start = datetime.combine(day, time(), tz).astimezone(UTC) - timedelta(hours=3)
    end = datetime.combine(day + timedelta(days=1), time(), tz).astimezone(UTC) + timedelta(hours=3)
    runs = function_runs(fields_of(cron), tz, start, end)
    return [t.astimezone(tz).strftime("%H:%M%z") for t in runs if t.astimezone(tz).date() == day]


BERLIN_FALL, BERLIN_SPRING = date(2026, 10, 25), date(2026, 3, 29)


def test_hourly_runs_at_every_real_hour_25_on_the_fall_back_day_23_on_the_spring_one() -> None:
    fall = day_runs("0 * * * *", "Europe/Berlin", BERLIN_FALL)
    assert len(fall) == 25
    assert fall[2:4] == ["02:00+0200", "02:00+0100"]  # the repeated hour, twice
    spring = day_runs("0 * * * *", "Europe/Berlin", BERLIN_SPRING)
    assert len(spring) == 23
    assert spring[1:3] == ["01:00+0100", "03:00+0200"]  # 02:00 never happened: no run


def test_more_frequent_wildcard_jobs_run_at_every_real_occurrence() -> None:
    assert len(day_runs("*/15 * * * *", "Europe/Berlin", BERLIN_FALL)) == 25 * 4
    assert len(day_runs("*/15 * * * *", "Europe/Berlin", BERLIN_SPRING)) == 23 * 4
    # a wildcard minute in a fixed hour is a wildcard job too (cron(8)): both 02:xx hours
    assert day_runs("*/20 2 * * *", "Europe/Berlin", BERLIN_FALL) == [
        "02:00+0200", "02:20+0200", "02:40+0200", "02:00+0100", "02:20+0100", "02:40+0100",
    ]  # fmt: skip
    assert day_runs("*/20 2 * * *", "Europe/Berlin", BERLIN_SPRING) == []


def test_a_fixed_time_in_the_repeated_hour_runs_once_at_its_first_occurrence() -> None:
    assert day_runs("30 2 * * *", "Europe/Berlin", BERLIN_FALL) == ["02:30+0200"]
    assert day_runs("30 1-3 * * *", "Europe/Berlin", BERLIN_FALL) == [
        "01:30+0200", "02:30+0200", "03:30+0100",
    ]  # fmt: skip


def test_a_fixed_time_in_a_skipped_hour_runs_once_right_after_the_gap() -> None:
    assert day_runs("30 2 * * *", "Europe/Berlin", BERLIN_SPRING) == ["03:00+0200"]
    # several skipped times, and the gap's end itself: one run
    assert day_runs("0,30 2,3 * * *", "Europe/Berlin", BERLIN_SPRING) == [
        "03:00+0200", "03:30+0200",
    ]  # fmt: skip


def test_the_day_after_a_gap_or_fold_is_a_plain_day() -> None:
    assert day_runs("30 2 * * *", "Europe/Berlin", BERLIN_SPRING + timedelta(days=1)) == [
        "02:30+0200"
    ]
    assert day_runs("30 2 * * *", "Europe/Berlin", BERLIN_FALL + timedelta(days=1)) == [
        "02:30+0100"
    ]


@pytest.mark.parametrize(
    ("zone", "day", "cron", "runs"),
    [
        # Santiago moves at midnight: 00:00-00:59 is skipped in September...
        ("America/Santiago", date(2026, 9, 6), "30 0 * * *", ["01:00-0300"]),
        ("America/Santiago", date(2026, 9, 6), "0 * * * *", 23),
        # ... and in April 23:00-23:59 of the Saturday repeats
        ("America/Santiago", date(2026, 4, 4), "30 23 * * *", ["23:30-0300"]),
        ("America/Santiago", date(2026, 4, 4), "0 * * * *", 25),
        # Lord Howe shifts by 30 minutes: 02:00-02:29 skipped, 01:30-01:59 repeated
        ("Australia/Lord_Howe", date(2026, 10, 4), "15 2 * * *", ["02:30+1100"]),
        ("Australia/Lord_Howe", date(2026, 4, 5), "45 1 * * *", ["01:45+1100"]),
        ("Australia/Lord_Howe", date(2026, 4, 5), "*/15 * * * *", 96 + 2),
        ("Australia/Lord_Howe", date(2026, 4, 5), "0 * * * *", 24),
        # Chatham: 02:45-03:44 skipped in September, repeated in April
        ("Pacific/Chatham", date(2026, 9, 27), "0 3 * * *", ["03:45+1345"]),
        ("Pacific/Chatham", date(2026, 4, 5), "0 3 * * *", ["03:00+1345"]),
        # Troll moves by two hours at 01:00 UTC: 01:00-02:59 skipped, then repeated
        ("Antarctica/Troll", date(2026, 3, 29), "30 1 * * *", ["03:00+0200"]),
        ("Antarctica/Troll", date(2026, 3, 29), "0 * * * *", 22),
        ("Antarctica/Troll", date(2026, 10, 25), "0 * * * *", 26),
        ("Antarctica/Troll", date(2026, 10, 25), "30 1 * * *", ["01:30+0200"]),
    ],
)
def test_zones_with_unusual_transitions(
    zone: str, day: date, cron: str, runs: list[str] | int
) -> None:
    got = day_runs(cron, zone, day)
    assert (len(got) if isinstance(runs, int) else got) == runs


def test_next_run_is_strictly_after_and_none_when_no_date_matches() -> None:
    berlin = ZoneInfo("Europe/Berlin")
    f = fields_of("30 2 * * *")
    at = datetime(2026, 10, 25, 0, 30, tzinfo=UTC)  # 02:30 CEST, the first occurrence
    assert next_run(f, berlin, at - timedelta(microseconds=1)) == at
    assert next_run(f, berlin, at) == datetime(2026, 10, 26, 1, 30, tzinfo=UTC)
    assert next_run(fields_of("0 0 29 2 1"), berlin, at) is None  # a Monday 29/2: 2044
    naive = datetime(2026, 10, 25, 0, 29)  # naive is read as UTC, as Celery does
    assert next_run(f, berlin, naive) == at


def test_next_occurrence_counts_both_occurrences_and_a_skipped_time_at_the_gaps_end() -> None:
    """The runaway guard's question: did the fields match any wall-clock minute since?"""
    berlin = ZoneInfo("Europe/Berlin")
    f = fields_of("30 2 * * *")
    first = datetime(2026, 10, 25, 0, 30, tzinfo=UTC)
    assert next_occurrence(f, berlin, first) == first + timedelta(hours=1)  # 02:30 CET too
    spring = datetime(2026, 3, 29, 0, 0, tzinfo=UTC)
    assert next_occurrence(f, berlin, spring) == datetime(2026, 3, 29, 1, 0, tzinfo=UTC)


def test_wildcard_follows_cron8_minute_or_hour_starting_with_a_star() -> None:
    assert CronFields.of(crontab(minute=0)).wildcard  # hour "*"
    assert CronFields.of(crontab(minute="*/15", hour=2)).wildcard
    assert not CronFields.of(crontab(minute=30, hour=2)).wildcard
    assert not CronFields.of(crontab(minute=0, hour="0-23")).wildcard  # cron(8): no star


class Clock:
    def __init__(self, at: datetime) -> None:
        self.at = at

    def __call__(self) -> datetime:
        return self.at


def test_zoned_crontab_is_due_by_the_rules_through_a_fall_back() -> None:
    """The operable schedule's crontab, asked as beat asks it (``is_due``, fake clock)."""
    app = Celery("dst", set_as_current=False)
    clock = Clock(datetime(2026, 10, 24, 23, 0, tzinfo=UTC))  # 01:00 CEST
    nightly = ZonedCrontab("30", "2", "*", "*", "*", tz="Europe/Berlin", app=app, nowfun=clock)
    hourly = ZonedCrontab("0", "*", "*", "*", "*", tz="Europe/Berlin", app=app, nowfun=clock)
    sent: dict[str, list[datetime]] = {"nightly": [], "hourly": []}
    last = {name: clock.at for name in sent}
    while clock.at < datetime(2026, 10, 25, 5, 0, tzinfo=UTC):
        for name, sched in (("nightly", nightly), ("hourly", hourly)):
            due, _ = sched.is_due(last[name])
            if due:
                sent[name].append(clock.at)
                last[name] = clock.at
        clock.at += timedelta(seconds=20)
    assert [t.strftime("%H:%M") for t in sent["nightly"]] == ["00:30"]  # UTC: 02:30 CEST
    assert [t.strftime("%H:%M") for t in sent["hourly"]] == ["00:00", "01:00", "02:00", "03:00",
                                                            "04:00"]  # fmt: skip
    # Celery's own crontab, same clock: it skips the repeated hour's run (celery #10107)
    stock = crontab(minute=0, app=Celery("stock", set_as_current=False, timezone="Europe/Berlin"),
                    nowfun=clock)  # fmt: skip
    clock.at = last_stock = datetime(2026, 10, 24, 23, 0, tzinfo=UTC)
    stock_sent = 0
    while clock.at < datetime(2026, 10, 25, 5, 0, tzinfo=UTC):
        if stock.is_due(last_stock)[0]:
            stock_sent, last_stock = stock_sent + 1, clock.at
        clock.at += timedelta(seconds=20)
    if celery.VERSION[:2] >= (5, 7):  # Celery 5.3 and 5.5 sent all 5
        assert stock_sent == 4


def test_zoned_crontab_due_times_after_an_outage_over_a_gap() -> None:
    """The catch-up policies count missed runs with the same rules (``due_times``)."""
    app = Celery("dst", set_as_current=False)
    now = datetime(2026, 3, 29, 6, 0, tzinfo=UTC)
    hourly = ZonedCrontab("0", "*", "*", "*", "*", tz="Europe/Berlin", app=app, nowfun=lambda: now)
    last = datetime(2026, 3, 28, 23, 0, tzinfo=UTC)  # 00:00 CET; down until 08:00 CEST
    times = due_times(hourly, last, now)
    berlin = ZoneInfo("Europe/Berlin")
    assert [t.astimezone(berlin).strftime("%H") for t in times] == [
        "01", "03", "04", "05", "06", "07", "08",
    ]  # fmt: skip


def test_zoned_crontab_still_pickles_and_compares() -> None:
    import pickle

    c = ZonedCrontab("30", "2", "*", "*", "*", tz="Europe/Berlin")
    again = pickle.loads(pickle.dumps(c))
    assert again == c and again.remaining_estimate is not None
    assert again._fields == c._fields


#: Zones whose rules are hard: transitions at midnight, 30-minute and 2-hour shifts, a
#: southern-hemisphere pair, Morocco's Ramadan shifts, the US and EU rules.
HARD_ZONES = [
    "America/Santiago", "Pacific/Chatham", "Antarctica/Troll", "Australia/Lord_Howe",
    "America/Havana", "Asia/Beirut", "Africa/Casablanca", "Asia/Gaza",
    "Europe/Berlin", "America/New_York", "Pacific/Easter", "America/Nuuk",
]  # fmt: skip


def test_next_run_equals_the_brute_force_reference_in_hard_zones() -> None:
    """Every run around every transition of 2025-2026, minute by minute (the sample)."""
    result = sweep(HARD_ZONES, [2025, 2026])
    print(
        f"{result.zones} zones, {result.transitions} transitions, {result.runs} runs, "
        f"{len(result.differences or [])} differences"
    )
    assert result.differences == []
    assert result.zones >= 10 and result.transitions >= 40
