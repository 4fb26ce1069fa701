"""Beat keeps every schedule's own semantics; the election only fences the send.

On the memory backend (no I/O): leadership is won for real by each scheduler's own
elector, and the shared run state is seeded through the store as another leader would
have left it. Each test ticks a fixed number of times: beat's ``tick()`` handles at most
one due entry per call, so the count of ticks bounds the work, not a clock.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any
from zoneinfo import ZoneInfo

import celery
import pytest
from celery import Celery
from celery.beat import Scheduler
from celery.schedules import BaseSchedule, crontab, schedstate, schedule

from celery_election import process as process_module
from celery_election.backends import MemoryBackend
from celery_election.beat import LeaderSchedulerMixin
from celery_election.beat import fence as fence_module
from celery_election.core.clock import FakeClock as VirtualClock
from celery_election.core.clock import boottime
from celery_election.core.lease import Bid
from celery_election.runs.once import RESENT

from ..conftest import claim_run

NS = "default-beat"


class Recording(LeaderSchedulerMixin, Scheduler):
    """The mixin over Celery's plain Scheduler; records what it really sends."""

    sent: list[str]

    def send_task(self, name: str, *args: Any, **kwargs: Any) -> None:
        self.sent.append(name)


@pytest.fixture
def shared(monkeypatch: pytest.MonkeyPatch) -> MemoryBackend:
    """One memory "database" for every scheduler the test starts, on a clock that moves
    only when the test moves it: its electors' leases, lock threads and election loops
    wait on it, so no lease runs out mid-tick on a loaded machine.

    The hosts' clocks (what each beat measures its offset on) read the same clock. On the
    real clock a second beat measured its offset seconds after the first on a loaded
    machine, while the database's wall stood still: it read the first beat's run that
    many seconds late, and the runaway guard held its next run.
    """
    clock = VirtualClock(wall_start_us=time.time_ns() // 1000)
    backend = MemoryBackend(clock)
    monkeypatch.setattr(process_module, "backend_from_url", lambda url, **kw: backend)
    wall = lambda app: fence_module.EPOCH + timedelta(microseconds=clock.wall_us())  # noqa: E731
    monkeypatch.setattr(fence_module, "real_now", wall)
    return backend


@pytest.fixture
def started() -> Iterator[list[Recording]]:
    schedulers: list[Recording] = []
    yield schedulers
    for s in schedulers:
        s.close()


def leader(app: Celery, started: list[Recording]) -> Recording:
    s = Recording(app=app)
    started.append(s)
    s.sent = []
    assert s.wait_for_leadership(5)
    return s


def make_app(schedule_: dict[str, Any], **conf: Any) -> Celery:
    """An app on the shared memory database, whose clock moves only when the test moves
    it: a takeover here is a resign's (memory wakeups), never an expiry.

    On the real clock, an elector starved past its lease in the middle of a tick (a loaded
    run) left the run just sent unmarked, and its next term sent it again (resent, as
    designed): a test that counts sends took that for a second run.
    """
    app = Celery(f"t{uuid.uuid4().hex[:6]}", broker="memory://", set_as_current=False)
    app.conf.update(election_url="memory://", election_ttl=30.0, beat_schedule=schedule_, **conf)
    return app


def ticks(s: Recording, n: int = 10) -> None:
    for _ in range(n):
        s.tick()


def seed(backend: MemoryBackend, entry: str, last_run_at: datetime, count: int = 1) -> None:
    """Leave the run state another leader would have left, then step down."""
    token = uuid.uuid4().hex
    lease = backend.elect(Bid(NS, token, "old-leader", 30.0)).lease
    assert lease is not None
    us = round(last_run_at.timestamp() * 1_000_000)
    assert claim_run(backend.beat, NS, token, lease.term, entry, None, us).won
    for n in range(1, count):
        state = backend.beat.load_runs(NS)[entry]
        assert claim_run(backend.beat, NS, token, lease.term, entry, state, us + n).won
    assert backend.resign(NS, token, lease.term)


class IsDueOnly(BaseSchedule):  # type: ignore[misc]
    """Celery's whole contract for a custom schedule: ``is_due`` (no remaining_estimate)."""

    def is_due(self, last_run_at: datetime) -> schedstate:
        return schedstate(True, 3600.0)


class Broken(BaseSchedule):  # type: ignore[misc]
    def is_due(self, last_run_at: datetime) -> schedstate:
        raise ValueError("cannot compute")


def test_a_custom_schedule_with_only_is_due_runs(shared: MemoryBackend, started: list[Any]) -> None:
    s = leader(make_app({"custom": {"task": "t.custom", "schedule": IsDueOnly()}}), started)
    ticks(s)
    assert s.sent == ["t.custom"]  # due once, then "next check in an hour"
    assert shared.beat.load_runs(NS)["custom"].total_run_count == 1


@pytest.mark.parametrize(("broker", "said"), [("memory://", True), ("amqp://localhost//", False)])
def test_the_beat_says_at_start_what_a_broker_without_confirms_guarantees(
    shared: MemoryBackend, started: list[Any], caplog: pytest.LogCaptureFixture,
    broker: str, said: bool,
) -> None:  # fmt: skip
    """Redis, SQS (here the memory transport): one line at start; RabbitMQ confirms."""
    app = make_app({"custom": {"task": "t.custom", "schedule": IsDueOnly()}})
    app.conf.broker_url = broker
    with caplog.at_level(logging.INFO, "celery_election.beat"):
        started.append(Recording(app=app))
    lines = [r.getMessage() for r in caplog.records if "publisher confirms" in r.getMessage()]
    assert len(lines) == int(said)
    assert not said or "memory broker has no publisher confirms" in lines[0]


def test_a_failing_entry_does_not_stop_the_others(
    shared: MemoryBackend, started: list[Any], caplog: pytest.LogCaptureFixture
) -> None:
    app = make_app(
        {
            "broken": {"task": "t.broken", "schedule": Broken()},
            "good": {"task": "t.good", "schedule": IsDueOnly()},
        }
    )
    s = leader(app, started)
    ticks(s)
    assert s.sent == ["t.good"]
    logged = [r.getMessage() for r in caplog.records]
    assert any("Cannot calculate the next run of 'broken'" in m for m in logged)


@pytest.mark.parametrize(("deadline", "sent"), [(None, ["t.daily"]), (60, [])])
def test_a_missed_cron_run_on_takeover_follows_the_starting_deadline(
    shared: MemoryBackend, started: list[Any], deadline: int | None, sent: list[str]
) -> None:
    """Stock Celery after a restart: one catch-up run, unless the missed run is older than
    ``beat_cron_starting_deadline``. A new leader behaves the same with the shared state."""
    now = datetime.now(timezone.utc)
    hour = (now - timedelta(hours=2)).hour  # the run fell due two hours ago, unsent
    daily = crontab(hour=hour, minute=0)
    seed(shared, "daily", now - timedelta(hours=26))  # the old leader's last run: yesterday
    app = make_app(
        {"daily": {"task": "t.daily", "schedule": daily}}, beat_cron_starting_deadline=deadline
    )
    s = leader(app, started)
    ticks(s)
    assert s.sent == sent
    ticks(s)
    assert s.sent == sent  # once at most: the claim moved the shared state on


def test_a_relative_daily_interval_follows_the_apps_timezone(
    shared: MemoryBackend, started: list[Any]
) -> None:
    """``relative=True`` rounds to local midnight in the app's timezone, not UTC midnight.

    Last run D-1 20:00 UTC; now D 10:00 UTC. The next run rounds down to the day of
    D 20:00 UTC: in Tokyo (+9) that is D+1 00:00 Tokyo = D 15:00 UTC, five hours away;
    read as UTC it would be D 00:00 UTC, due at once.
    """
    tokyo = ZoneInfo("Asia/Tokyo")
    now = datetime(2026, 11, 23, 10, 0, tzinfo=timezone.utc)
    every_day = schedule(timedelta(days=1), relative=True, nowfun=lambda: now.astimezone(tokyo))
    seed(shared, "daily", datetime(2026, 11, 22, 20, 0, tzinfo=timezone.utc))
    app = make_app({"daily": {"task": "t.daily", "schedule": every_day}}, timezone="Asia/Tokyo")
    s = leader(app, started)
    ticks(s)
    assert s.sent == []
    entry = s.schedule["daily"]
    # the same instant (host and database share one clock here), on the app's clock
    assert entry.last_run_at == datetime(2026, 11, 22, 20, 0, tzinfo=timezone.utc)
    assert entry.last_run_at.utcoffset() == timedelta(hours=9)  # adopted in local time
    due, wait = entry.is_due()
    assert not due and wait == pytest.approx(5 * 3600, abs=1)


def test_a_follower_sends_nothing_and_a_new_leader_resumes_the_shared_state(
    shared: MemoryBackend, started: list[Any]
) -> None:
    clock = [datetime.now(timezone.utc)]
    app = make_app({"every": {"task": "t.every", "schedule": IsDueOnly(nowfun=lambda: clock[0])}})
    a = leader(app, started)
    b = Recording(app=app)  # the same database: a follower
    started.append(b)
    b.sent = []
    ticks(a)
    ticks(b)
    assert (a.sent, b.sent) == (["t.every"], [])
    a.close()  # resigns: b takes over at once (memory wakeups)
    assert b.wait_for_leadership(5)
    clock[0] += timedelta(seconds=0.5)
    ticks(b)
    assert b.sent == []  # due again 0.5 s after a's run: the runaway guard holds it (1 s)
    clock[0] += timedelta(seconds=1.5)
    ticks(b)
    # IsDueOnly is due whenever asked: b runs it once more, as the run after a's
    assert b.sent == ["t.every"]
    assert shared.beat.load_runs(NS)["every"].total_run_count == 2
    assert b.schedule["every"].total_run_count == 2  # adopted, then advanced


def test_a_run_reserved_while_not_leading_is_refused_and_leaves_the_state_as_it_was(
    shared: MemoryBackend, started: list[Any]
) -> None:
    """Leadership lost between the heap's "due" and Celery's reserve: the run is refused
    (never sent) and the entry Celery's reserve returned keeps the state it had (before
    this test only a tick that lost its lease at that instant reached it)."""
    from celery_election.beat.runs import NOT_LEADING

    app = make_app({"job": {"task": "t.job", "schedule": IsDueOnly()}})
    leader(app, started)
    follower = Recording(app=app)
    started.append(follower)
    entry = follower.schedule["job"]
    was = (entry.last_run_at, entry.total_run_count)
    run = follower._reserve(entry)
    assert run.claim == NOT_LEADING and run.lead is None  # refused: never sent
    assert (run.next_entry.last_run_at, run.next_entry.total_run_count) == was


def test_a_burst_goes_out_in_one_tick_with_one_batch_claim(
    shared: MemoryBackend, started: list[Any]
) -> None:
    """Every entry due at one instant: one tick reserves them all, claims them in one
    claim_runs call and sends each once (stock: a tick and a full comparison each)."""
    n = 50
    app = make_app({f"e{i}": {"task": f"t.e{i}", "schedule": IsDueOnly()} for i in range(n)})
    s = leader(app, started)
    before = dict(shared.calls)
    assert s.tick() == 0
    assert sorted(s.sent) == sorted(f"t.e{i}" for i in range(n))
    assert shared.calls.get("claim_runs", 0) - before.get("claim_runs", 0) == 1
    ticks(s)  # due again in an hour: nothing more
    assert len(s.sent) == n
    assert {r.total_run_count for r in shared.beat.load_runs(NS).values()} == {1}


def test_a_scheduler_closed_under_its_tick_ends_the_beat(
    shared: MemoryBackend, started: list[Any]
) -> None:
    """SIGTERM's handler closes the scheduler mid-send and its SystemExit is lost there (a
    library's cleanup replaced it, and the error was caught): the scheduler raises it
    itself, and Celery's service loop stops instead of sleeping on, closed."""
    app = make_app({f"e{i}": {"task": f"t.e{i}", "schedule": IsDueOnly()} for i in range(3)})
    s = leader(app, started)

    def closed_mid_send(name: str, *args: Any, **kwargs: Any) -> None:
        s.sent.append(name)
        s.close()  # the handler ran here; what it raised never left the send

    s.send_task = closed_mid_send  # type: ignore[method-assign]
    with pytest.raises(SystemExit):
        s.tick()
    assert s.sent  # the burst had begun


def test_a_stale_leaders_burst_sends_nothing(shared: MemoryBackend, started: list[Any]) -> None:
    """The lease ends under a leader that still trusts it: its whole batch is refused."""
    app = make_app({f"e{i}": {"task": f"t.e{i}", "schedule": IsDueOnly()} for i in range(5)})
    s = leader(app, started)
    shared.expire(NS)
    assert shared.elect(Bid(NS, uuid.uuid4().hex, "other", 30.0)).won
    ticks(s)
    assert s.sent == []
    assert shared.beat.load_runs(NS) == {}


def test_the_schedule_is_compared_again_only_when_it_can_have_changed(
    shared: MemoryBackend, started: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stock compares every entry at every tick; here a schedule found equal is trusted
    until the scheduler changes it (add, update_from_dict, ...) or replaces it."""
    from celery_election.beat import guards

    monkeypatch.setattr(guards, "RECHECK_EVERY", 3600.0)
    app = make_app({f"e{i}": {"task": f"t.e{i}", "schedule": schedule(3600)} for i in range(3)})
    s = leader(app, started)
    s.tick()
    compared: list[int] = []
    stock = Scheduler.schedules_equal

    def counting(self: Any, old: Any, new: Any) -> bool:
        compared.append(1)
        return bool(stock(self, old, new))

    monkeypatch.setattr(Scheduler, "schedules_equal", counting)
    ticks(s)
    assert compared == []
    s.add(name="added", task="t.added", schedule=IsDueOnly())
    ticks(s, 2)
    assert len(compared) == 1  # the change is seen, then trusted again
    assert s.sent == ["t.added"]
    s.schedule = dict(s.schedule)  # a new dict (a reload): compared again
    ticks(s, 2)
    assert len(compared) == 2


# -- the runaway guard (fake clocks: no real time) ------------------------------------------


class Stock(Scheduler):
    """Celery's plain Scheduler, unguarded, recording its sends."""

    sent: list[str]

    def send_task(self, name: str, *args: Any, **kwargs: Any) -> None:
        self.sent.append(name)


class FakeClock:
    def __init__(self, at: datetime) -> None:
        self.at = at

    def __call__(self) -> datetime:
        return self.at

    def run(self, s: Scheduler, seconds: float, step: float = 0.001) -> None:
        """Tick every ``step`` s of fake time, ``seconds`` included (beat would tick faster)."""
        end = self.at + timedelta(seconds=seconds)
        while self.at <= end:
            s.tick()
            self.at += timedelta(seconds=step)


def held(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelname == "WARNING" and "runaway guard" in r.getMessage()
    ]


def test_a_crontab_in_the_repeated_hour_is_sent_once_by_the_leader_and_at_every_tick_by_stock(
    shared: MemoryBackend, started: list[Any], caplog: pytest.LogCaptureFixture
) -> None:
    """Beat started at 02:00 CET inside the fall-back's repeated hour (fold=1), Berlin.

    Celery's crontab(hour=2, minute=30) then answers "due, next in 0 s" at every tick until
    02:30 CET: stock sends it 2001 times in 2 s. The leader's guard sees that the crontab's
    fields matched no wall-clock minute since the entry's start and holds it until the
    repeated 02:30 comes: one send in the hour, one WARNING.
    """
    berlin = ZoneInfo("Europe/Berlin")
    start = datetime(2026, 10, 25, 1, 0, tzinfo=timezone.utc)  # 02:00 CET, fold=1
    assert start.astimezone(berlin).fold == 1
    results = {}
    for kind in ("stock", "leader"):
        clock = FakeClock(start)
        nightly = crontab(hour=2, minute=30, nowfun=lambda c=clock: c().astimezone(berlin))
        app = make_app({"nightly": {"task": "t.nightly", "schedule": nightly}},
                       timezone="Europe/Berlin")  # fmt: skip
        s: Scheduler
        if kind == "stock":
            s = Stock(app=app)
            s.sent = []
        else:
            s = leader(app, started)
        clock.run(s, 2.0)  # 2001 ticks
        in_two_seconds = len(s.sent)  # type: ignore[attr-defined]
        clock.run(s, 3600 - 2.0, step=1.0)  # the rest of the repeated hour, a tick a second
        results[kind] = (in_two_seconds, len(s.sent))  # type: ignore[attr-defined]
        if kind == "leader":
            assert shared.beat.load_runs(NS)["nightly"].total_run_count == 1
            run = s.schedule["nightly"].last_run_at.astimezone(berlin)
            assert (run.hour, run.minute, run.utcoffset()) == (2, 30, timedelta(hours=1))
    assert results["leader"] == (0, 1)  # once, at the repeated 02:30 (wall clock)
    if celery.VERSION[:2] >= (5, 5):  # Celery 5.3's crontab is not due in that hour at all
        assert results["stock"][0] == 2001  # the bug: every tick
        assert len(held(caplog)) == 1
        assert "nightly" in held(caplog)[0] and "answered due (next in 0" in held(caplog)[0]


class Runaway(BaseSchedule):  # type: ignore[misc]
    """A custom schedule that keeps answering "due, next in 0 s"."""

    def is_due(self, last_run_at: datetime) -> schedstate:
        return schedstate(True, 0)


def test_the_guard_holds_a_custom_schedule_that_keeps_answering_due(
    shared: MemoryBackend, started: list[Any], caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock(datetime(2026, 11, 26, 12, 0, tzinfo=timezone.utc))
    app = make_app({"loop": {"task": "t.loop", "schedule": Runaway(nowfun=clock)}})
    stock = Stock(app=app)
    stock.sent = []
    clock.run(stock, 0.999)
    assert len(stock.sent) == 1000
    clock.at = datetime(2026, 11, 26, 13, 0, tzinfo=timezone.utc)
    s = leader(app, started)
    clock.run(s, 0.999)
    assert s.sent == ["t.loop"]  # no known period: not twice within 1 s
    assert len(held(caplog)) == 1  # logged once, with the schedule's answer
    assert "loop not sent" in held(caplog)[0] and "(next in 0s)" in held(caplog)[0]
    clock.run(s, 0.5)
    assert s.sent == ["t.loop"] * 2  # a second after its run it is sent again (then held)
    assert shared.beat.load_runs(NS)["loop"].total_run_count == 2


class EarlyInterval(schedule):  # type: ignore[misc]
    """An interval that answers due before its period is over."""

    def is_due(self, last_run_at: datetime) -> schedstate:
        return schedstate(True, 0)


def test_an_interval_is_not_sent_twice_within_its_period(
    shared: MemoryBackend, started: list[Any]
) -> None:
    clock = FakeClock(datetime(2026, 11, 26, 12, 0, tzinfo=timezone.utc))
    app = make_app({"i": {"task": "t.i", "schedule": EarlyInterval(timedelta(seconds=10),
                                                                   nowfun=clock)}})  # fmt: skip
    s = leader(app, started)
    clock.run(s, 9.9, step=0.1)
    assert s.sent == ["t.i"]
    clock.run(s, 0.2, step=0.1)
    assert s.sent == ["t.i"] * 2  # at 10 s


class EveryMinuteAlwaysDue(crontab):  # type: ignore[misc]
    """A crontab (every minute) whose answer is always "due now"."""

    def is_due(self, last_run_at: datetime) -> schedstate:
        return schedstate(True, 0)


def test_a_crontab_is_not_sent_twice_in_one_minute(
    shared: MemoryBackend, started: list[Any]
) -> None:
    clock = FakeClock(datetime(2026, 11, 26, 12, 0, 30, tzinfo=timezone.utc))
    app = make_app({"m": {"task": "t.m", "schedule": EveryMinuteAlwaysDue(nowfun=clock)}})
    s = leader(app, started)
    clock.at = datetime(2026, 11, 26, 12, 1, 0, tzinfo=timezone.utc)
    clock.run(s, 59.0, step=0.5)
    assert s.sent == ["t.m"]  # 12:01:00, then held for the rest of the minute
    clock.run(s, 1.5, step=0.5)
    assert s.sent == ["t.m"] * 2  # 12:02:00


def test_a_close_inside_a_tick_only_marks_it_closed_till_the_close_at_exit(
    shared: MemoryBackend, started: list[Any]
) -> None:
    """Celery's SIGTERM handler closes the scheduler where the signal found it: mid-tick,
    inside a publish. Closing there wrote into the interrupted write of the broker's socket
    and hung (the e2e singleton-requeue test's beat, twice in a day). Now the handler's
    close only marks it closed; its SystemExit unwinds the tick, and beat's close at exit
    (``Service.start``'s ``finally``) closes."""
    s = leader(make_app({"e": {"task": "t.e", "schedule": IsDueOnly()}}), started)
    leading_then: list[bool] = []

    def interrupted(name: str, *args: Any, **kwargs: Any) -> None:
        s.close()  # what Service.sync calls from the handler
        leading_then.append(s._fence.leadership() is not None)  # nothing closed yet
        raise SystemExit()

    s.send_task = interrupted  # type: ignore[method-assign]
    with pytest.raises(SystemExit):
        s.tick()
    with pytest.raises(SystemExit):
        s.tick()  # had the handler's SystemExit been lost, the next tick stops the beat
    s.close()  # beat's close at exit
    assert leading_then == [True] and s._fence.leadership() is None


def test_after_a_close_inside_a_tick_the_broker_link_is_dropped_without_the_protocol(
    shared: MemoryBackend, started: list[Any]
) -> None:
    """The handler's SystemExit broke into a read of the broker's socket mid-frame: the
    confirm waited out its timeout, and Celery's close at exit (5.6 on: it releases the
    connection, whose channel close waits for the broker's reply) read for ever (a CI
    run's beat, its stacks in the log). After such a close the connection is collected
    (closed without a word to the broker); a beat closed between ticks releases it."""
    calls: list[str] = []

    class Link:
        def collect(self) -> None:
            calls.append("collect")

        def release(self) -> None:
            calls.append("release")

    def run(interrupt: bool) -> None:
        s = leader(make_app({"e": {"task": "t.e", "schedule": IsDueOnly()}}), started)

        def interrupted(name: str, *args: Any, **kwargs: Any) -> None:
            s.close()
            raise SystemExit()

        if interrupt:
            s.send_task = interrupted  # type: ignore[method-assign]
            with pytest.raises(SystemExit):
                s.tick()
        s.__dict__["connection"] = Link()  # Celery's cached connection, as a send left it
        s.close()

    run(interrupt=True)
    assert calls == ["collect"]
    calls.clear()
    run(interrupt=False)
    assert "collect" not in calls  # released as Celery does (5.6 on), or left (before)


# -- a large schedule's costs (issue 37: a burst of 10,000 entries) --------------------------


def test_a_new_leader_records_and_retires_its_entries_in_batches(
    shared: MemoryBackend, started: list[Any], tmp_path: Any
) -> None:
    """Promotion stored each new entry (and retired each removed one) with a claim of its
    own: 10,000 entries took 40 s before the first send. Now one batch each."""
    from celery_election.beat import LeaderScheduler

    seed(shared, "removed-1", datetime(2024, 1, 1, tzinfo=timezone.utc))
    seed(shared, "removed-2", datetime(2024, 1, 1, tzinfo=timezone.utc), count=3)
    before = shared.calls.get("claim_runs", 0)
    entries = {f"e{i}": {"task": f"t.e{i}", "schedule": crontab(minute="*")} for i in range(30)}
    s = LeaderScheduler(app=make_app(entries), schedule_filename=str(tmp_path / "schedule"))
    started.append(s)
    assert s.wait_for_leadership(5)
    s.tick()
    assert shared.calls["claim_runs"] - before == 2
    runs = shared.beat.load_runs(NS)
    term = shared.current(NS).term  # type: ignore[union-attr]
    assert set(entries) <= {name for name, r in runs.items() if r.term == term and r.identity == ""}
    assert runs["removed-1"].identity == runs["removed-2"].identity == "-"
    assert runs["removed-2"].total_run_count == 3  # retired as it was, not run again


def test_a_large_schedule_is_compared_again_less_often(
    shared: MemoryBackend, started: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The once-a-second safety net costs at most 1/20 of the tick thread: a comparison
    that took 0.2 s is not made again for 4 s (10,000 entries: 1/6 of a burst's CPU)."""
    from celery_election.beat import guards
    from celery_election.beat import scheduler as scheduler_module

    clock = [1000.0]
    monkeypatch.setattr(scheduler_module, "boottime", lambda: clock[0])
    monkeypatch.setattr(guards, "boottime", lambda: clock[0])
    app = make_app({f"e{i}": {"task": f"t.e{i}", "schedule": schedule(3600)} for i in range(3)})
    s = leader(app, started)
    s.tick()
    compared: list[float] = []
    stock = Scheduler.schedules_equal

    def slow(self: Any, old: Any, new: Any) -> bool:
        compared.append(clock[0])
        clock[0] += 0.2
        return bool(stock(self, old, new))

    monkeypatch.setattr(Scheduler, "schedules_equal", slow)
    clock[0] += 1.5
    s.tick()
    assert len(compared) == 1  # past the second: compared (it took 0.2 s)
    clock[0] += 3.5
    ticks(s, 3)
    assert len(compared) == 1  # 3.5 s < 20 x 0.2 s
    clock[0] += 1.0
    s.tick()
    assert len(compared) == 2


def test_the_safety_comparison_waits_for_the_end_of_a_burst(
    shared: MemoryBackend, started: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tick that sent a full batch is followed by another at once: the comparison every
    second waits until the burst is over (at most guards.RECHECK_BURST s), then runs again.
    The collector is off meanwhile, and on again once the burst is over (burst_costs.py)."""
    import gc

    from celery_election.beat import guards
    from celery_election.beat import scheduler as scheduler_module

    clock = [1000.0]
    monkeypatch.setattr(scheduler_module, "boottime", lambda: clock[0])
    monkeypatch.setattr(guards, "boottime", lambda: clock[0])
    monkeypatch.setattr(scheduler_module, "BURST", 2)
    app = make_app({f"e{i}": {"task": f"t.e{i}", "schedule": IsDueOnly()} for i in range(5)})
    s = leader(app, started)
    compared: list[float] = []
    stock = Scheduler.schedules_equal

    def counting(self: Any, old: Any, new: Any) -> bool:
        compared.append(clock[0])
        return bool(stock(self, old, new))

    monkeypatch.setattr(Scheduler, "schedules_equal", counting)
    was = gc.isenabled()
    gc.enable()
    try:
        assert s.tick() == 0  # the heap is built; a full batch of 2 went out
        assert not gc.isenabled()
        for _ in range(2):  # the burst goes on, seconds apart: not compared
            clock[0] += 2.0
            s.tick()
        assert gc.isenabled()
    finally:
        (gc.enable if was else gc.disable)()
    assert len(s.sent) == 5 and compared == []  # the last batch (1) ended the burst
    clock[0] += 2.0
    s.tick()
    assert len(compared) == 1  # the safety net again


def test_due_times_are_asked_once_per_tick_for_equal_crontabs() -> None:
    """The history's due time: a burst's entries share their crontab and ran within one
    minute, so one answer serves them all; a crontab in another zone (its __eq__ leaves
    the zone out) or with other fields, a last run in another minute, or a subclass is
    asked itself."""
    from celery_election.beat import LeaderScheduler
    from celery_election.beat.fence import BeatFence
    from celery_election.beat.ops import ScheduleOps

    asked: list[Any] = []

    class Counted(crontab):  # type: ignore[misc]
        def remaining_estimate(self, last: datetime) -> timedelta:
            asked.append(self)
            return super().remaining_estimate(last)  # type: ignore[no-any-return]

    app = make_app({})
    s = ScheduleOps(BeatFence(app), dict, LeaderScheduler.Entry)  # offset 0: not measured
    now = datetime.now(timezone.utc)  # Celery's schedules read the real clock
    last = (now - timedelta(minutes=2)).replace(second=0, microsecond=0)
    run = round(last.timestamp() * 1_000_000)
    a, b = crontab(minute="*", app=app), crontab(minute="*", app=app)
    due = s._due_after(a, run, now)
    assert abs((due - (last + timedelta(minutes=1))).total_seconds()) < 1
    assert s._due_after(b, run + 59_000_000, now) is due  # the same minute
    earlier = s._due_after(b, run - 1, now)  # the minute before
    assert abs((earlier - last).total_seconds()) < 1
    kolkata = crontab(minute="0", app=make_app({}, timezone="Asia/Kolkata"))
    utc = crontab(minute="0", app=app)
    assert kolkata == utc
    assert s._due_after(kolkata, run, now) != s._due_after(utc, run, now)
    other_hours = crontab(minute="*", hour=str((last.hour + 12) % 24), app=app)
    assert s._due_after(other_hours, run, now) != due
    custom = [Counted(minute="*", app=app) for _ in range(2)]
    for c in custom:
        s._due_after(c, run, now)
    assert asked == custom


class Headed(Recording):
    """Records each send's headers too."""

    headers: list[dict[str, Any]]

    def send_task(self, name: str, *args: Any, **kwargs: Any) -> None:
        self.sent.append(name)
        self.headers.append(dict(kwargs.get("headers") or {}))


def test_a_reserved_run_carries_its_claim_to_one_send(
    shared: MemoryBackend, started: list[Any]
) -> None:
    """A reserved run waits in the ledger for its send: Celery's tick sends the entry
    reserve was given, ``apply_async(advance=True)`` the one it returned. The first send
    of that entry's name takes it: another, sent later unreserved (a "run now"), goes
    out as an unreserved send, not as the claimed run again. Nothing reaches a shelve."""
    import pickle

    s = Headed(app=make_app({"job": {"task": "t.job", "schedule": IsDueOnly()}}))
    started.append(s)
    s.sent, s.headers = [], []
    assert s.wait_for_leadership(5)
    entry = s.schedule["job"]
    new = s.reserve(entry)
    assert list(s._ledger) == ["job"]
    assert vars(pickle.loads(pickle.dumps(new))).keys() == vars(new).keys()
    s.apply_async(entry, advance=False)  # as Celery's tick sends it
    assert s._ledger == {}
    s._sender.ledger.flush()  # the tick's settle: the broker took it, no longer pending
    assert "election_run" in s.headers[-1]
    s.apply_async(new, advance=False)  # the twin, unreserved: no run of its own
    assert len(s.sent) == 2 and "election_run" not in s.headers[-1]
    assert "election_term" in s.headers[-1]
    newer = s.reserve(new)  # a twin that kept an attribute is reserved again (next())
    s.apply_async(newer, advance=False)
    assert s.headers[-1]["election_run"] != s.headers[0]["election_run"]
    s._sender.ledger.flush()
    s.apply_async(s.schedule["job"])  # advance=True: the entry reserve returns is sent
    assert len(s.sent) == 4 and "election_run" in s.headers[-1]
    runs = [h["election_run"] for h in s.headers if "election_run" in h]
    assert len(runs) == len(set(runs)) == 3


def test_a_run_claimed_in_one_term_is_sent_once_by_the_next(
    shared: MemoryBackend, started: list[Any]
) -> None:
    """A run claimed through Celery's reserve and not sent when its term ended is pending
    in the store: the next term (here this process's own, after a resign) sends it at its
    promotion, under the same run key and task id, and the first term's late send of it
    does not go out (a claim goes out only under the term that won it)."""
    s = Headed(app=make_app({"job": {"task": "t.job", "schedule": IsDueOnly()}},
                            election_resign_backoff=0.05))  # fmt: skip
    started.append(s)
    s.sent, s.headers = [], []
    assert s.wait_for_leadership(5)
    first = s._fence.leadership()
    assert first is not None
    entry = s.schedule["job"]
    s.reserve(entry)  # claimed under the first term; its send waits in the ledger
    assert [run.claim.term for run in s._ledger.values() if run.claim] == [first.term]
    election = s._fence.election
    assert election is not None and election.elector is not None
    election.elector.resign()
    clock = shared.clock
    assert isinstance(clock, VirtualClock)
    deadline = boottime() + 10
    while (lead := s._fence.leadership()) is None or lead.term == first.term:
        assert boottime() < deadline, "no newer term"
        clock.advance(0.05)  # the resign back-off, on the test's clock
        time.sleep(0.01)
    # Celery's tick sends the first term's run now: the newer term is promoted first,
    # which sends the run pending in the store; the first term's send does not go out
    assert s.apply_async(entry, advance=False) is None
    assert s.sent == ["t.job"]
    recovered = s.headers[-1]
    assert recovered["election_term"] == lead.term and recovered["election_run"] == 0
    assert recovered[RESENT] == 1  # the first term's may have gone out: not a redelivery
    s._sender.ledger.flush()  # the tick's settle: the broker took it, no longer pending
    s.apply_async(s.schedule["job"])  # a run reserved and claimed in the newer term goes
    assert s.sent == ["t.job", "t.job"] and s.headers[-1]["election_term"] == lead.term
    assert s.headers[-1]["election_run"] != 0 and RESENT not in s.headers[-1]  # a new run
