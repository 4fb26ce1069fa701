"""The tick ledger refuses a stale leader's claim: at most once, even in a split brain.

A leader paused past its lease wakes up still holding (token, old term). By then another
beat leads under a newer term. Whatever the stale one believes, its claims are refused by
the database, so only the real leader's ticks are sent.
"""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from celery_election.backends import SQLBackend, backend_from_url
from celery_election.beat import LeaderScheduler, _us
from celery_election.clock import boottime
from celery_election.errors import BackendUnavailableError

from ..conftest import expire, token, unique_prefix

NS = "beat-ledger"


@pytest.fixture
def sql(sql_url: str) -> Iterator[SQLBackend]:
    b = backend_from_url(sql_url, table_prefix=unique_prefix())
    assert isinstance(b, SQLBackend)
    b.install()
    yield b
    b.uninstall()
    b.close()


def test_a_stale_leaders_claims_are_refused(sql: SQLBackend) -> None:
    a, b = token(), token()
    old = sql.elect(NS, a, "beat-a", 30.0).lease
    assert old is not None
    assert sql.claim_tick(NS, a, old.term, "job", 1_000_000)
    # a is paused past its lease; b takes over
    expire(sql, NS)
    assert not sql.claim_tick(NS, a, old.term, "job", 2_000_000)  # expired: refused already
    new = sql.elect(NS, b, "beat-b", 30.0)
    assert new.won and new.lease is not None and new.lease.term > old.term
    # a resumes, still believing it leads: every claim it makes is refused
    for due in (2_000_000, 3_000_000):
        assert not sql.claim_tick(NS, a, old.term, "job", due)
    assert not sql.claim_tick(NS, a, new.lease.term, "job", 2_000_000)  # b's term, a's token
    assert sql.claim_tick(NS, b, new.lease.term, "job", 2_000_000)
    assert not sql.claim_tick(NS, b, new.lease.term, "job", 2_000_000)  # once only
    assert sql.beat_entries(NS) == {"job": (2_000_000, 2)}


def test_resend_takes_over_only_unconfirmed_ticks(sql: SQLBackend) -> None:
    a, b = token(), token()
    old = sql.elect(NS, a, "beat-a", 30.0).lease
    assert old is not None
    assert sql.claim_tick(NS, a, old.term, "sent", 1_000_000)
    sql.confirm_tick(NS, "sent", 1_000_000)
    assert sql.claim_tick(NS, a, old.term, "lost", 1_000_000)  # a dies before sending it
    expire(sql, NS)
    new = sql.elect(NS, b, "beat-b", 30.0).lease
    assert new is not None
    assert sql.unconfirmed_ticks(NS, new.term) == [("lost", 1_000_000, old.term)]
    assert not sql.reclaim_tick(NS, a, old.term, "lost", 1_000_000, old.term)  # stale
    assert sql.reclaim_tick(NS, b, new.term, "lost", 1_000_000, old.term)
    assert not sql.reclaim_tick(NS, b, new.term, "lost", 1_000_000, old.term)  # once
    assert sql.unconfirmed_ticks(NS, new.term) == []


class Counting(LeaderScheduler):
    """A LeaderScheduler that counts what it actually sends."""

    sent: list[tuple[str, int]]

    def apply_async(self, entry: Any, producer: Any = None, advance: bool = True, **kw: Any) -> Any:
        headers = entry.options.get("headers") or {}
        self.sent.append((entry.name, headers.get("election_due")))
        return None


def make_scheduler(app: Celery, tmp_path: Path, name: str) -> Counting:
    s = Counting(app=app, schedule_filename=str(tmp_path / f"{name}-schedule"))
    s.sent = []
    return s


def ledger_conf(tmp_path: Path) -> dict[str, Any]:
    """One entry every second, elected on a SQLite file in ``tmp_path``."""
    return dict(
        election_url=f"sqlite:///{tmp_path}/election.db",
        election_namespace=f"n{uuid.uuid4().hex[:6]}",
        election_ttl=2.0,
        beat_schedule={"job": {"task": "ledger.job", "schedule": 1.0}},
    )


def leading_scheduler(app: Celery, tmp_path: Path, name: str) -> Counting:
    """A scheduler of ``app`` that has become the leader."""
    s = make_scheduler(app, tmp_path, name)
    assert s._election is not None and s._election.elector is not None
    assert s._election.elector.wait_for_leadership(10)
    return s


def test_two_schedulers_one_stale_send_each_tick_once(tmp_path: Path) -> None:
    app = Celery("ledger", broker="memory://", set_as_current=False)
    app.conf.update(ledger_conf(tmp_path))
    a = leading_scheduler(app, tmp_path, "a")
    assert a._election is not None and a._election.elector is not None
    stale = a._election.leadership()
    assert stale is not None
    b = make_scheduler(app, tmp_path, "b")
    assert b._election is not None and b._election.elector is not None
    try:
        # a leads and sends one tick
        _tick_until(a, lambda: len(a.sent) >= 1)
        # a stalls: every database call of its backend hangs (the guard its SQLite calls
        # hold), like a paused process. Its lease expires and b takes over.
        guard = a._election.backend._fork_guard
        guard.acquire()
        try:
            expire(b._election.backend, b._election.namespace)
            assert b._election.elector.wait_for_leadership(10)
        finally:
            guard.release()
        # a resumes; at worst it still believes it leads (here: for the whole test)
        a._election.leadership = lambda: stale  # type: ignore[method-assign]
        before = len(a.sent)
        _tick_until(b, lambda: len(b.sent) >= 3, also=a)
        assert len(a.sent) == before, "the stale leader sent a tick"
        dues = [due for _, due in a.sent + b.sent]
        assert len(dues) == len(set(dues)), "a tick was sent twice"
    finally:
        b.close()
        a.close()


def test_a_retried_claim_is_ours_only_under_our_term(sql: SQLBackend) -> None:
    """``retry=True``: the first attempt may have committed with its answer lost."""
    a, b = token(), token()
    old = sql.elect(NS, a, "beat-a", 30.0).lease
    assert old is not None
    assert sql.claim_tick(NS, a, old.term, "job", 1_000_000)
    assert not sql.claim_tick(NS, a, old.term, "job", 1_000_000)  # a plain claim: once
    assert sql.claim_tick(NS, a, old.term, "job", 1_000_000, retry=True)
    expire(sql, NS)
    new = sql.elect(NS, b, "beat-b", 30.0).lease
    assert new is not None
    assert not sql.claim_tick(NS, b, new.term, "job", 1_000_000, retry=True)  # a's claim


def test_a_claim_whose_answer_was_lost_is_retried_not_dropped(tmp_path: Path) -> None:
    """Regression (chaos run, PostgreSQL restart): a failed claim lost its tick for good
    although the same process kept leading. Now it is retried, and sent exactly once."""
    app = Celery("ledger", broker="memory://", set_as_current=False)
    app.conf.update(ledger_conf(tmp_path))
    s = leading_scheduler(app, tmp_path, "a")
    assert s._election is not None
    backend = s._election.backend
    real = backend.claim_tick
    failures: list[int] = []

    def commit_then_fail(*args: Any, **kwargs: Any) -> bool:
        result = real(*args, **kwargs)
        if not failures:  # the first claim commits, then its answer is lost
            failures.append(args[4])
            raise BackendUnavailableError("connection lost after commit")
        return bool(result)

    backend.claim_tick = commit_then_fail
    try:
        _tick_until(s, lambda: len(s.sent) >= 3)
    finally:
        s.close()
    dues = [due for _, due in s.sent]
    assert failures and failures[0] == dues[0], "the tick whose claim failed was not sent"
    assert len(dues) == len(set(dues))
    assert all(b - a == 1_000_000 for a, b in itertools.pairwise(dues)), dues


def test_a_beat_with_a_wrong_clock_keeps_to_the_database_clock(tmp_path: Path) -> None:
    """Regression (chaos run, one process's clock an hour fast): due times come from the
    database's clock, so a fast beat neither claims ticks an hour ahead nor makes the
    next leader wait an hour."""
    conf = ledger_conf(tmp_path)
    fast = Celery("fast", broker="memory://", set_as_current=False)
    fast.conf.update(conf)
    fast.now = lambda: datetime.now(timezone.utc) + timedelta(hours=1)  # type: ignore[method-assign]
    a = leading_scheduler(fast, tmp_path, "a")
    _tick_until(a, lambda: len(a.sent) >= 2)
    a.close()  # resigns
    now_us = time.time() * 1_000_000
    assert all(abs(due - now_us) < 10_000_000 for _, due in a.sent), (a.sent, now_us)
    fine = Celery("fine", broker="memory://", set_as_current=False)
    fine.conf.update(conf)
    b = leading_scheduler(fine, tmp_path, "b")
    try:
        _tick_until(b, lambda: len(b.sent) >= 2)
    finally:
        b.close()
    dues = [due for _, due in a.sent + b.sent]
    assert len(dues) == len(set(dues))
    assert 0 < b.sent[0][1] - a.sent[-1][1] <= 5_000_000, dues  # no hour-long gap


def _tick_until(s: Counting, done: Any, also: Counting | None = None, timeout: float = 15) -> None:
    import time

    deadline = boottime() + timeout
    while not done():
        assert boottime() < deadline, "timed out ticking"
        for sched in (s, also) if also is not None else (s,):
            sched.tick()
        time.sleep(0.05)


def test_due_keys_are_nominal_not_send_times() -> None:
    from datetime import datetime, timezone

    from celery.schedules import crontab, schedule

    from celery_election.beat import _anchor, next_due

    every = schedule(2.5)
    now = datetime(2026, 1, 1, 12, 0, 1, 700_000, tzinfo=timezone.utc)
    start = _anchor(every, now)
    assert _us(start) % 2_500_000 == 0 and start <= now  # every beat computes the same
    assert next_due(every, start) == datetime(2026, 1, 1, 12, 0, 2, 500_000, tzinfo=timezone.utc)
    cron = crontab(minute="*/15")
    assert next_due(cron, now) == datetime(2026, 1, 1, 12, 15, tzinfo=timezone.utc)
    assert next_due(cron, datetime(2026, 1, 1, 12, 15, tzinfo=timezone.utc)) == datetime(
        2026, 1, 1, 12, 30, tzinfo=timezone.utc
    )


def test_solar_due_keys_are_whole_seconds_and_stable() -> None:
    from datetime import datetime, timezone

    from celery.schedules import solar

    from celery_election.beat import next_due

    sunset = solar("sunset", 48.85, 2.35)  # Paris
    last = datetime(2026, 6, 1, 12, 0, tzinfo=timezone.utc)
    first = next_due(sunset, last)
    assert first.microsecond == 0 and first > last
    assert next_due(sunset, last) == first  # the same key every time it is computed
    following = next_due(sunset, first)
    assert 23 * 3600 < (following - first).total_seconds() < 25 * 3600


def test_banner_and_runtime_schedule_changes(tmp_path: Path) -> None:
    from celery.schedules import crontab

    app = Celery("banner", broker="memory://", set_as_current=False)
    app.conf.update(
        election_url=f"sqlite:///{tmp_path}/e.db",  # no init_app: the settings suffice
        election_namespace="shop",
        election_ttl=2.0,
        beat_schedule={"one": {"task": "x.one", "schedule": 1.0}},
    )
    lazy = LeaderScheduler(app=app, lazy=True, schedule_filename=str(tmp_path / "lazy"))
    assert "election ->" in lazy.info and "namespace='shop-beat'" in lazy.info
    assert lazy._election is None  # the banner's lazy scheduler starts nothing
    s = make_scheduler(app, tmp_path, "s")
    try:
        assert s._election is not None and s._election.elector is not None
        assert s._election.elector.wait_for_leadership(10)
        _tick_until(s, lambda: any(n == "one" for n, _ in s.sent))
        # an entry added while running is picked up, claimed and sent
        s.schedule["two"] = s.Entry(
            name="two", task="x.two", schedule=1.0, app=app, last_run_at=None
        )
        s.schedule["cron"] = s.Entry(
            name="cron", task="x.cron", schedule=crontab(minute="*"), app=app
        )
        _tick_until(s, lambda: any(n == "two" for n, _ in s.sent))
        dues = {n: [d for m, d in s.sent if m == n] for n in ("one", "two")}
        for name, ds in dues.items():
            assert len(ds) == len(set(ds)), f"{name} sent twice"
            assert all(d % 1_000_000 == 0 for d in ds)  # epoch-aligned nominal seconds
        stored = s._election.backend.beat_entries("shop-beat")
        assert {"one", "two"} <= set(stored)
    finally:
        s.close()
        s.close()  # beat closes twice: idempotent


def test_sending_does_not_make_every_tick_rebuild_the_heap(tmp_path: Path) -> None:
    app = Celery("heap", broker="memory://", set_as_current=False)
    app.conf.update(
        election_url=f"sqlite:///{tmp_path}/e.db",
        election_ttl=2.0,
        beat_schedule={f"e{i}": {"task": "x.e", "schedule": 1.0} for i in range(5)},
    )
    s = make_scheduler(app, tmp_path, "s")
    rebuilds = 0
    populate = s.populate_heap

    def counting(*args: Any, **kw: Any) -> None:
        nonlocal rebuilds
        rebuilds += 1
        populate(*args, **kw)

    s.populate_heap = counting  # type: ignore[method-assign]
    try:
        assert s._election is not None and s._election.elector is not None
        assert s._election.elector.wait_for_leadership(10)
        _tick_until(s, lambda: len(s.sent) >= 15)  # three rounds of five sends
        # once at promotion (and at most once more if leadership changed hands)
        assert rebuilds <= 2, f"the heap was rebuilt {rebuilds} times for {len(s.sent)} sends"
    finally:
        s.close()
