"""The operable schedule on a real LeaderScheduler (SQLite and PostgreSQL), in one process.

What an operator does through ``Schedule`` (as the CLI and a web page do) must take effect
on the leader at its next look, with no restart: each test drives beat's loop as ``celery
beat`` does and waits on what was sent (bounded by a deadline, never by a sleep), using a
static entry every second as the clock that shows time passed.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from celery import Celery

from celery_election import metrics
from celery_election.beat import LeaderScheduler
from celery_election.core import runstate
from celery_election.core.clock import boottime
from celery_election.core.runstate import CLAIMED, run_key, run_now_task_id
from celery_election.schedule import Schedule
from celery_election.schedule.records import history_row

from ..conftest import url_for
from ..support.history import ended, run_row

TICK = "beat.tick"  # the static entry that shows time passing


class Counting(LeaderScheduler):
    """A LeaderScheduler that records what it sends (tasks sent by name, ids given)."""

    sent: list[tuple[str, dict[str, Any], str]]

    def send_task(self, name: str, *args: Any, **kwargs: Any) -> Any:
        task_id = kwargs.get("task_id") or uuid.uuid4().hex  # a beat run's: its row's
        self.sent.append((name, dict(kwargs.get("headers") or {}), task_id))
        return type("Result", (), {"id": task_id})()

    def count(self, entry: str, *, run_now: bool | None = None) -> int:
        return sum(
            1
            for _, h, _ in self.sent
            if h.get("election_entry") == entry
            and (run_now is None or bool(h.get("election_run_now")) == run_now)
        )


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.tier2)])
def app(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Celery]:
    app = Celery("ops", broker="memory://", set_as_current=False)
    app.conf.update(
        election_url=url_for(request.param, tmp_path),
        election_table_prefix=f"o{uuid.uuid4().hex[:10]}_",
        election_namespace=f"n{uuid.uuid4().hex[:6]}",
        # a lapse is not these tests' subject: no liveness session, a lease a stall does
        # not outlive (at 1 s liveness a loaded CI run lost its term mid-test), standbys
        # looking every 0.2 s (each handover here is a close's resign)
        election_liveness=False,
        election_ttl=30.0,
        election_poll_interval=0.2,
        election_fallback_interval=1.0,
        beat_schedule={"tick": {"task": TICK, "schedule": 1.0}},
    )
    yield app
    from celery_election.backends import backend_from_url

    b = backend_from_url(app.conf.election_url, table_prefix=app.conf.election_table_prefix)
    b.uninstall()
    b.close()


@pytest.fixture
def ops(app: Celery) -> Iterator[Schedule]:
    s = Schedule(app, actor="operator")
    s.backend.install()
    yield s
    s.close()


@pytest.fixture
def beats(app: Celery, tmp_path: Path) -> Iterator[Callable[[], Counting]]:
    started: list[Counting] = []

    def start() -> Counting:
        s = Counting(app=app, schedule_filename=str(tmp_path / f"beat{len(started)}"))
        s.sent = []
        started.append(s)
        return s

    yield start
    for s in started:
        s.close()


def leading(start: Callable[[], Counting]) -> Counting:
    s = start()
    assert s.wait_for_leadership(10)
    return s


def tick_until(s: Counting, done: Callable[[], bool], timeout: float = 20) -> None:
    deadline = boottime() + timeout
    while not done():
        assert boottime() < deadline, "timed out ticking"
        time.sleep(max(0.0, min(0.02, s.tick())))


def ticks_pass(s: Counting, n: int) -> None:
    """Tick until the static 1 s entry has been sent ``n`` more times (time has passed)."""
    goal = s.count("tick") + n
    tick_until(s, lambda: s.count("tick") >= goal)


@pytest.mark.tier2  # the real-process test (tests/e2e/test_schedule_ops.py) does the same
def test_an_entry_added_edited_paused_resumed_and_removed_at_runtime(
    beats: Callable[[], Counting], ops: Schedule
) -> None:
    s = leading(beats)
    ops.add("report", "ops.report", "every 60s", kwargs={"full": True}, check_task=False)
    tick_until(s, lambda: "report" in s.schedule)  # the next look: no restart
    ticks_pass(s, 2)
    assert s.count("report") == 0  # not due for a minute
    ops.update("report", schedule="every 1s")  # 60 s -> 1 s takes effect at once
    tick_until(s, lambda: s.count("report") >= 2)
    assert s.sent[-1][0] in ("ops.report", TICK)
    ops.pause("report")
    tick_until(s, lambda: "report" not in s.schedule)
    paused_at = s.count("report")
    ticks_pass(s, 3)
    assert s.count("report") == paused_at  # nothing while paused
    ops.resume("report", missed="skip")
    tick_until(s, lambda: any(r.kind == "missed" for r in ops.history("report")))
    missed = next(r for r in ops.history("report") if r.kind == "missed")
    assert missed.count >= 2  # what fell due while paused, not sent
    assert s.count("report") == paused_at  # skipped, not caught up
    tick_until(s, lambda: s.count("report") > paused_at)  # then on schedule again
    ops.pause("report")
    tick_until(s, lambda: "report" not in s.schedule)
    ticks_pass(s, 3)
    before = s.count("report")
    ops.resume("report", missed="catch_up")  # the entry's policy: latest, one run
    tick_until(s, lambda: s.count("report") > before)
    ops.remove("report")
    tick_until(s, lambda: "report" not in s.schedule)
    gone = s.count("report")
    ticks_pass(s, 2)
    assert s.count("report") == gone
    entry = ops.add("report", "ops.report", "every 1s", check_task=False)
    assert entry.total_run_count == 0  # a new entry of the same name starts fresh
    tick_until(s, lambda: s.count("report") > gone)
    actions = [(a.action, a.actor) for a in ops.store.audit(ops.namespace, limit=20)]
    assert actions[::-1] == [
        ("add", "operator"), ("edit", "operator"), ("pause", "operator"),
        ("resume", "operator"), ("pause", "operator"), ("resume", "operator"),
        ("remove", "operator"), ("add", "operator"),
    ]  # fmt: skip


def test_run_now_clicked_twice_at_once_runs_once(
    app: Celery, beats: Callable[[], Counting], ops: Schedule
) -> None:
    s = leading(beats)
    ops.add("job", "ops.job", "every 60s", check_task=False)
    tick_until(s, lambda: "job" in s.schedule)
    other = Schedule(app, actor="second shell")
    answers: list[bool] = []
    barrier = threading.Barrier(2)

    def click(schedule: Schedule) -> None:
        barrier.wait()
        answers.append(schedule.run_now("job"))

    threads = [threading.Thread(target=click, args=(x,)) for x in (ops, other)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    other.close()
    assert sorted(answers) == [False, True]  # one request; the other found it pending
    tick_until(s, lambda: s.count("job", run_now=True) == 1)
    ticks_pass(s, 2)
    assert s.count("job", run_now=True) == 1 and s.count("job") == 1
    runs = ops.history("job")
    sent_id = next(t for _, h, t in s.sent if h.get("election_entry") == "job")
    assert [(r.kind, r.task_id) for r in runs] == [("run_now", sent_id)]


@pytest.mark.tier2  # the real-process test (tests/e2e/test_schedule_ops.py) does the same
def test_a_static_entry_is_paused_and_run_now_but_not_edited_away(
    beats: Callable[[], Counting], ops: Schedule
) -> None:
    s = leading(beats)
    tick_until(s, lambda: s.count("tick") >= 1)
    ops.pause("tick")
    tick_until(s, lambda: "tick" not in s.schedule)
    assert ops.run_now("tick")
    tick_until(s, lambda: s.count("tick", run_now=True) == 1)
    paused = s.count("tick", run_now=False)
    ops.update("tick", grace=30.0)  # policies: yes
    with pytest.raises(Exception, match="static beat_schedule entry"):
        ops.update("tick", schedule="every 5s")
    with pytest.raises(Exception, match="static beat_schedule entry"):
        ops.remove("tick")
    ops.resume("tick")
    tick_until(s, lambda: s.count("tick", run_now=False) > paused)
    listed = {e.name: e for e in ops.list()}
    assert listed["tick"].static and listed["tick"].policies["grace"] == 30.0


def _age_run_state(app: Celery, seconds: float) -> None:
    """Move every stored last run ``seconds`` back: as if every beat had been down since."""
    engine = sa.create_engine(app.conf.election_url.replace("postgresql:", "postgresql+psycopg:"))
    table = f"{app.conf.election_table_prefix}beat_run"
    with engine.begin() as conn:
        conn.execute(
            sa.text(f"UPDATE {table} SET last_run_at = last_run_at - :d"),
            {"d": int(seconds * 1_000_000)},
        )
    engine.dispose()


def test_catch_up_policies_after_every_beat_was_down_five_minutes(
    beats: Callable[[], Counting], ops: Schedule
) -> None:
    first = leading(beats)
    for name, policy in (("latest", {}), ("skip", {"catch_up": "skip"}),
                         ("all", {"catch_up": "all", "catch_up_max": 3})):  # fmt: skip
        ops.add(name, f"ops.{name}", "every 60s", check_task=False, **policy)
    tick_until(first, lambda: {"latest", "skip", "all"} <= set(first.schedule))
    for name in ("latest", "skip", "all"):
        ops.run_now(name)  # not a run of the schedule; then one real run each:
    ops.update("latest", schedule="every 1s")
    ops.update("skip", schedule="every 1s")
    ops.update("all", schedule="every 1s")
    tick_until(
        first, lambda: all(first.count(n, run_now=False) >= 1 for n in ("latest", "skip", "all"))
    )
    for name in ("latest", "skip", "all"):
        ops.update(name, schedule="every 60s")
    tick_until(first, lambda: first.schedule["all"].schedule.run_every.total_seconds() == 60)
    first.close()
    # five and a half minutes with no beat: 5 runs of each fell due, the last 30 s ago
    _age_run_state(first.app, 330)
    second = leading(beats)
    tick_until(second, lambda: second.count("all") == 3 and len(ops.history("skip")) >= 3)
    ticks_pass(second, 2)
    assert second.count("latest") == 1  # Celery's: one run for the five
    assert second.count("skip") == 0  # none: it waits for its next due time
    assert second.count("all") == 3  # each missed run, the latest catch_up_max
    # the outage's rows, the second beat's term: on a loaded machine the first beat's every
    # 1 s phase may find a run late too, and "skip" records that one (its own row, term)
    term = second._fence.loaded_term
    skip_missed = [r for r in ops.history("skip") if r.kind == "missed" and r.term == term]
    all_missed = [r for r in ops.history("all") if r.kind == "missed" and r.term == term]
    assert [r.count for r in skip_missed] == [5]
    assert [r.count for r in all_missed] == [2]  # 5 due, 3 sent, 2 missed
    heads = [h for _, h, _ in second.sent if h.get("election_entry") == "all"]
    assert len({h["election_run"] for h in heads}) == 3  # three distinct runs


@pytest.fixture
def counted() -> Iterator[metrics.LocalCounters]:
    store = metrics.LocalCounters()
    old = metrics.use_counters(store)
    yield store
    metrics.use_counters(old)


def test_overlap_skip_waits_for_the_previous_run_to_finish(
    beats: Callable[[], Counting], ops: Schedule, counted: metrics.LocalCounters
) -> None:
    s = leading(beats)
    ops.add("slow", "ops.slow", "every 1s", check_task=False, overlap="skip")
    tick_until(s, lambda: s.count("slow") == 1)
    ticks_pass(s, 3)  # it "runs" three periods: never finished
    assert s.count("slow") == 1

    def skipped() -> int:  # the history is written in batches, a moment after
        return sum(r.count for r in ops.history("slow") if r.kind == "skipped")

    tick_until(s, lambda: skipped() >= 2)
    task_id = next(t for _, h, t in s.sent if h.get("election_entry") == "slow")
    ended(ops.backend, s._fence.namespace, "slow", task_id)  # what the worker's check writes
    tick_until(s, lambda: s.count("slow") == 2)
    # per-entry metrics, as /metrics exports them
    key = metrics.key(metrics.BEAT, ops.namespace, "slow", "skipped_overlap")
    tick_until(s, lambda: counted.snapshot()[key] == skipped())
    values = counted.snapshot()
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(metrics.collector())
    body = generate_latest(registry).decode()
    labels = f'{{entry="slow",namespace="{ops.namespace}"}}'
    assert f"celery_election_beat_runs_skipped_overlap_total{labels} {float(values[key])}" in body
    assert "celery_election_beat_late_seconds_total{" in body


def test_a_pending_run_now_survives_a_change_of_leader(
    beats: Callable[[], Counting], ops: Schedule
) -> None:
    a = leading(beats)
    b = beats()
    ops.add("job", "ops.job", "every 60s", check_task=False)
    tick_until(a, lambda: "job" in a.schedule)
    a.close()  # hands over; the request arrives while b takes over
    assert ops.run_now("job")
    assert b.wait_for_leadership(10)
    tick_until(b, lambda: b.count("job", run_now=True) == 1)
    ticks_pass(b, 2)
    assert b.count("job", run_now=True) == 1 and a.count("job") == 0


def test_a_run_now_whose_term_ended_before_its_send_is_sent_once_from_its_row(
    beats: Callable[[], Counting], ops: Schedule
) -> None:
    """Window 9 of issue 52: the claim consumed the click and wrote the run's row, then
    the send found this beat's term over (leadership lapsed under load: a loaded run lost
    the click so). The row stays claimed and the run is owed: the beat leading again (here
    the same one, after its back-off, not the store's 30-second recheck) sends it once,
    under the run now's task id; a new leader would find the row."""
    s = leading(beats)
    ops.add("job", "ops.job", "every 60s", check_task=False)
    tick_until(s, lambda: "job" in s.schedule)
    sender, lapsed = s._sender, []
    send_now, lead_now = sender.send_now, sender._lead_now

    def lapse_once(run_now: Any, producer: Any) -> None:
        if not lapsed:  # the term ends between the claim and the send
            lapsed.append(run_now.entry.name)
            sender._lead_now = lambda: None  # type: ignore[method-assign]
        try:
            send_now(run_now, producer)
        finally:
            sender._lead_now = lead_now  # type: ignore[method-assign]

    sender.send_now = lapse_once  # type: ignore[method-assign]
    assert ops.run_now("job")
    tick_until(s, lambda: s.count("job", run_now=True) == 1)
    ticks_pass(s, 2)
    assert lapsed == ["job"] and s.count("job", run_now=True) == 1
    clicked = next(
        a for a in ops.store.audit(ops.namespace) if a.name == "job" and a.action == "run_now"
    )
    ns, election = s._fence.namespace, s._fence.election
    assert election is not None
    stored = election.backend.runs.load(ns, run_key(run_now_task_id(ns, "job", clicked.at)))
    assert stored is not None and stored.row.state != CLAIMED, stored  # confirmed: sent


def test_a_dynamic_entry_counts_from_when_it_was_added_not_from_a_promotion(
    app: Celery, beats: Callable[[], Counting], ops: Schedule
) -> None:
    """Added while no beat ran: its first run is due a period after it was added, whoever
    leads by then (a static entry new to the shared state counts from the promotion)."""
    ops.add("early", "ops.early", "every 60s", check_task=False)
    entry = ops.store.entry
    with ops.backend.engine.begin() as conn:  # added 59 s ago
        conn.execute(sa.update(entry).values(created_at=entry.c.created_at - 59_000_000))
    s = leading(beats)
    tick_until(s, lambda: s.count("early") == 1)  # due within a second, not in a minute
    state = ops.backend.beat.load_runs(ops.namespace)["early"]
    assert state.total_run_count == 1


def test_the_api_without_a_beat_policies_zones_and_last_runs(ops: Schedule) -> None:
    ops.update("tick", catch_up="skip")  # a static entry's first overlay: policies only
    assert ops.get("tick").policies["catch_up"] == "skip" and ops.get("tick").static
    ops.add("cron", "ops.cron", "0 9 * * *", tz="Europe/Paris", check_task=False)
    ops.update("cron", tz="UTC")  # a new zone for the stored crontab
    assert ops.get("cron").spec == {"cron": "0 9 * * *", "tz": "UTC"}
    store = ops.store
    now = store.db_now()
    store.record_many([run_row(ops.namespace, "cron", due=k, sent_at=now + k, task_id=f"t{k}")
                       for k in (1, 2)])  # fmt: skip
    store.record_many([history_row(ops.namespace, "cron", "missed", run_key=3, term=1, count=4,
                                   sent_at=now + 3)])  # fmt: skip
    last = store.last_sent_many([ops.namespace], ["cron", "tick", "nobody"])
    assert set(last) == {"cron"} and last["cron"].task_id == "t2"  # a sent run, the latest


def test_disabled_and_outside_its_window_an_entry_is_not_sent(
    beats: Callable[[], Counting], ops: Schedule
) -> None:
    s = leading(beats)
    now = datetime.now(timezone.utc)
    ops.add("off", "ops.off", "every 1s", check_task=False, enabled=False)
    ops.add("later", "ops.later", "every 1s", check_task=False,
            start_at=now + timedelta(seconds=3))  # fmt: skip
    ops.add("over", "ops.over", "every 1s", check_task=False,
            expires_at=now + timedelta(seconds=2))  # fmt: skip
    tick_until(s, lambda: s.count("over") >= 1)  # inside its window: sent
    assert s.count("off") == 0 and s.count("later") == 0  # disabled; not started yet
    tick_until(s, lambda: s.count("later") >= 1)  # its start came: sent from then
    done = s.count("over")
    assert "over" not in s.schedule  # expired: out of the schedule
    ticks_pass(s, 2)
    assert s.count("over") == done and s.count("off") == 0
    ops.enable("off")
    tick_until(s, lambda: s.count("off") >= 1)


def test_the_leader_prunes_its_runs_past_the_retention_off_the_tick(
    beats: Callable[[], Counting], ops: Schedule, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The beats' rows are the schedule's history: the leader's history thread deletes
    those past ``election_schedule_retention``, batch after batch while whole batches go
    (here 2 rows a batch), never a run still claimed, a worker's own run (workers prune
    theirs) or another namespace's."""
    from celery_election.runs import runonce

    monkeypatch.setattr(runonce, "PRUNE_BATCH", 2)
    s = leading(beats)
    ns, store = s._fence.namespace, ops.store
    now = store.db_now()
    old = now - 31 * 86_400_000_000  # past the 30 days

    def row(name: str, **changes: Any) -> dict[str, Any]:
        return {**run_row(ns, name, due=1, sent_at=old, task_id=f"t-{name}",
                          outcome="SUCCESS"), **changes}  # fmt: skip

    store.record_many([
        row("old"), *(row(f"old{i}") for i in range(4)), row("young", started_at=now),
        row("claimed", state="claimed"),
        row("own", kind=None, entry_key=None), row("elsewhere", namespace="other-ns"),
    ])  # fmt: skip

    def there(name: str, where: str = ns) -> bool:
        return ops.backend.runs.load(where, runstate.run_key(f"t-{name}")) is not None

    tick_until(s, lambda: not any(there(n) for n in ("old", "old0", "old1", "old2", "old3")))
    assert there("young") and there("claimed") and there("own") and there("elsewhere", "other-ns")
