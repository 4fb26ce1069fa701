"""The dead-man's switch per beat entry as tables: when an entry is overdue, and by how much.

``overdue`` and ``grace_for`` are pure; ``entry_overdue`` applies them to an entry, its
stored run state and its open run (``schedule/overdue.py``). Each row is one situation a
dead beat, a stopped worker or an operator creates, and the seconds it must read.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from celery import Celery

from celery_election import metrics
from celery_election.schedule.api import Entry
from celery_election.schedule.overdue import entry_overdue, grace_for, overdue
from celery_election.schedule.records import RunRecord

APP = Celery("overdue", set_as_current=False)
S = 1_000_000  # microseconds a second


# (what, period, cap, grace)
GRACES = [
    ("one period when shorter than the cap", 10.0, 300.0, 10.0),
    ("the cap when the period is longer", 86400.0, 300.0, 300.0),
    ("the cap without a period (a one-off)", None, 300.0, 300.0),
    ("the cap for a period not known (0)", 0.0, 60.0, 60.0),
]


@pytest.mark.parametrize(("what", "period", "cap", "grace"), GRACES, ids=[g[0] for g in GRACES])
def test_grace(what: str, period: float | None, cap: float, grace: float) -> None:
    assert grace_for(period, cap) == grace


# (what, now, grace, due, open_due, overdue seconds)
RULES = [
    ("not due yet", 100.0, 5.0, 120.0, None, 0.0),
    ("due, within its grace", 100.0, 5.0, 96.0, None, 0.0),
    ("due, exactly at the end of its grace", 100.0, 5.0, 95.0, None, 0.0),
    ("due and not sent past its grace", 100.0, 5.0, 90.0, None, 5.0),
    ("never due again (a one-off that ran)", 100.0, 5.0, None, None, 0.0),
    ("sent, not finished, within its grace", 100.0, 5.0, 150.0, 97.0, 0.0),
    ("sent, not finished past its grace", 100.0, 5.0, 150.0, 80.0, 15.0),
    ("unfinished and unsent: the older deadline counts", 100.0, 5.0, 85.0, 60.0, 35.0),
    ("unsent older than the unfinished run", 100.0, 5.0, 60.0, 85.0, 35.0),
    ("nothing known", 100.0, 5.0, None, None, 0.0),
]


@pytest.mark.parametrize(
    ("what", "now", "grace", "due", "open_due", "seconds"), RULES, ids=[r[0] for r in RULES]
)
def test_overdue(
    what: str, now: float, grace: float, due: float | None, open_due: float | None, seconds: float
) -> None:
    assert overdue(now, grace, due=due, open_due=open_due) == pytest.approx(seconds)


NOW = datetime.now(timezone.utc).replace(microsecond=0)
NOW_US = int(NOW.timestamp()) * S


def entry(spec: dict[str, Any] | None = None, *, ran: float | None = -5.0, **kw: Any) -> Entry:
    """An entry that last ran ``ran`` seconds from now (None: never)."""
    last = None if ran is None else NOW_US + int(ran * S)
    return Entry("e", "t.x", {"every": 10} if spec is None else spec, last_run_us=last, **kw)


def run(due: float | None, sent: float) -> RunRecord:
    """A sent run that has not finished: due and sent that many seconds from now."""
    due_us = None if due is None else NOW_US + int(due * S)
    sent_us = NOW_US + int(sent * S)
    return RunRecord(1, "k", "run", 0, 1, due_us, sent_us, "tid", 1, None, None, None)


def iso(seconds: float) -> str:
    return (NOW + timedelta(seconds=seconds)).isoformat()


# (what, entry, open run, cap, overdue seconds): every 10 s unless said, grace min(10, cap)
ENTRIES = [
    ("ran 5 s ago: due in 5 s", entry(), None, 300.0, 0.0),
    ("ran 30 s ago: due 20 s ago, 10 s of grace", entry(ran=-30), None, 300.0, 10.0),
    ("the cap below the period", entry(ran=-30), None, 4.0, 16.0),
    ("paused: owes nothing", entry(ran=-300, paused=True), None, 300.0, 0.0),
    ("disabled: owes nothing", entry(ran=-300, enabled=False), None, 300.0, 0.0),
    ("never ran: not judged", entry(ran=None), None, 300.0, 0.0),
    ("never ran, a run unfinished", entry(ran=None), run(-400, -399), 300.0, 100.0),
    ("sent on time, finishing", entry(ran=-2), run(-2, -2), 300.0, 0.0),
    ("sent, unfinished for 25 s", entry(ran=-2), run(-25, -25), 300.0, 15.0),
    ("a run now (no due time): its send", entry(ran=-2), run(None, -25), 300.0, 15.0),
    ("not started yet", entry(ran=-300, start_at=iso(60)), None, 300.0, 0.0),
    ("expired: never due again", entry(ran=-300, expires_at=iso(-200)), None, 300.0, 0.0),
    ("a one-off not sent", entry({"at": iso(-100)}, ran=-400), None, 30.0, 70.0),
    ("a one-off that ran", entry({"at": iso(-100)}, ran=-99), None, 30.0, 0.0),
    (
        "a one-off that expired before its time, never sent",
        entry({"at": iso(-100)}, ran=-400, expires_at=iso(-150)),
        None,
        30.0,
        0.0,
    ),
    ("hourly cron, 2 h since", entry({"cron": "0 * * * *"}, ran=-7200), None, 300.0, None),
    ("no schedule known (a custom one)", entry({}, ran=-9000), None, 300.0, 0.0),
]


@pytest.mark.parametrize(
    ("what", "e", "open_run", "cap", "seconds"), ENTRIES, ids=[r[0] for r in ENTRIES]
)
def test_entry_overdue(
    what: str, e: Entry, open_run: RunRecord | None, cap: float, seconds: float | None
) -> None:
    got = entry_overdue(e, open_run, NOW_US, cap, APP)
    if seconds is None:  # cron: due at the first whole hour after the last run, then 300 s
        last = NOW - timedelta(seconds=7200)
        due = last.replace(minute=0, second=0) + timedelta(hours=1)
        seconds = (NOW - due).total_seconds() - 300
    assert got == pytest.approx(seconds, abs=0.01)


@pytest.fixture
def counting() -> Iterator[None]:
    pytest.importorskip("prometheus_client")
    old = metrics.use_counters(metrics.LocalCounters())
    try:
        yield
    finally:
        metrics.use_counters(old)


def samples(body: bytes) -> dict[tuple[str, str], float]:
    """(namespace, entry) -> value of each overdue sample in a /metrics body."""
    out = {}
    for line in body.decode().splitlines():
        if line.startswith("celery_election_beat_entry_overdue_seconds{"):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', line))
            out[labels["namespace"], labels["entry"]] = float(line.rsplit(" ", 1)[1])
    return out


def test_the_exporter_takes_the_largest_value_of_each_entry_over_its_sources(
    counting: None,
) -> None:
    """A worker and its embedded beat's host may both watch: one series per entry."""
    a = metrics.add_overdue_source(lambda: {("ns", "x"): 0.0, ("ns", "y"): 4.0})
    b = metrics.add_overdue_source(lambda: {("ns", "x"): 7.5})

    def broken() -> dict[tuple[str, str], float]:
        raise RuntimeError("the database is down")

    c = metrics.add_overdue_source(broken)
    try:
        assert samples(metrics.render()[0]) == {("ns", "x"): 7.5, ("ns", "y"): 4.0}
    finally:
        for remove in (a, b, c):
            remove()
    assert "beat_entry_overdue_seconds" not in metrics.render()[0].decode()
