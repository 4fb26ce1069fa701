"""The beat fence on every backend: a run is claimed once, by the leader that holds the lease.

A leader paused past its lease wakes up still holding (token, old term). By then another
beat leads under a newer term. Whatever the stale one believes, its claims are refused by
the database, so only the real leader's runs are sent.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from celery_election.backends.base import RunRequest, RunState
from celery_election.beat import LeaderScheduler
from celery_election.beat.burst_costs import held
from celery_election.core.clock import boottime
from celery_election.core.lease import Bid
from celery_election.errors import BackendUnavailableError

from ..conftest import (
    EVERY_KIND,
    EVERY_SQL,
    by_entry,
    claim_run,
    expire,
    make_backend,
    one_driver_each,
    token,
    url_for,
)

NS = "beat-runs"


@pytest.fixture(params=EVERY_KIND)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """Every backend, PostgreSQL and MariaDB through each of their drivers."""
    yield from make_backend(request.param, tmp_path)


@pytest.fixture(params=one_driver_each(EVERY_SQL))
def sql_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return url_for(request.param, tmp_path)


def test_a_stale_leaders_claims_are_refused(backend: Any) -> None:
    store = backend.beat
    a, b = token(), token()
    old = backend.elect(Bid(NS, a, "beat-a", 30.0)).lease
    first = claim_run(store, NS, a, old.term, "job", None, 1_000_000)
    assert first.won and first.state == RunState(1_000_000, 1, old.term)
    again = claim_run(store, NS, a, old.term, "job", None, 1_500_000)  # the first run: once
    assert not again.won and again.state == first.state and again.leading
    # a is paused past its lease; b takes over
    expire(backend, NS)
    stale = claim_run(store, NS, a, old.term, "job", first.state, 2_000_000)
    assert not stale.won and not stale.leading and stale.state == first.state
    new = backend.elect(Bid(NS, b, "beat-b", 30.0))
    assert new.won and new.lease.term > old.term
    # a resumes, still believing it leads: every claim it makes is refused
    for at in (2_000_000, 3_000_000):
        refused = claim_run(store, NS, a, old.term, "job", first.state, at)
        assert not refused.won and not refused.leading
    assert not claim_run(store, NS, a, new.lease.term, "job", first.state, 2_000_000).won
    won = claim_run(store, NS, b, new.lease.term, "job", first.state, 2_000_000)
    assert won.won and won.state == RunState(2_000_000, 2, new.lease.term)
    # the same run once only: whoever saw the old state is refused and told the new one
    late = claim_run(store, NS, b, new.lease.term, "job", first.state, 2_100_000)
    assert not late.won and late.leading and late.state == won.state
    assert store.load_runs(NS) == {"job": won.state}
    assert store.load_runs("other") == {}


def test_entries_and_namespaces_are_apart(backend: Any) -> None:
    store = backend.beat
    a = token()
    lease = backend.elect(Bid(NS, a, "beat-a", 30.0)).lease
    long_name = "x" * 400  # hashed into the key: any name fits a MySQL primary key
    for name in ("job", "Job", "job ", long_name):
        assert claim_run(store, NS, a, lease.term, name, None, 5).won
    assert set(store.load_runs(NS)) == {"job", "Job", "job ", long_name}
    # another namespace's leader cannot advance this one's entries, nor see them
    assert not claim_run(store, "elsewhere", a, lease.term, "job", None, 6).won


def test_a_claim_may_set_the_run_count_and_the_entrys_identity(backend: Any) -> None:
    """Adopting an operator's edit or starting a re-created entry fresh is a claim too:
    the same compare-and-set on (last run, run count), under the same fence."""
    store = backend.beat
    a, b = token(), token()
    lease = backend.elect(Bid(NS, a, "beat-a", 30.0)).lease
    plain = claim_run(store, NS, a, lease.term, "job", None, 1_000_000)
    assert plain.state == RunState(1_000_000, 1, lease.term, None)  # identity: any entry
    fresh = claim_run(
        store, NS, a, lease.term, "job", plain.state, 900_000, total_run_count=0, identity="id:7"
    )
    assert fresh.won and fresh.state == RunState(900_000, 0, lease.term, "id:7")
    assert store.load_runs(NS) == {"job": fresh.state}
    # the compare-and-set is on (last run, run count): the old state no longer matches
    again = claim_run(store, NS, a, lease.term, "job", plain.state, 2_000_000, identity="id:8")
    assert not again.won and again.state == fresh.state
    nxt = claim_run(store, NS, a, lease.term, "job", fresh.state, 2_000_000, identity="id:7")
    assert nxt.won and nxt.state == RunState(2_000_000, 1, lease.term, "id:7")
    # the fence holds for these claims as for any run
    expire(backend, NS)
    assert backend.elect(Bid(NS, b, "beat-b", 30.0)).won
    stale = claim_run(
        store, NS, a, lease.term, "job", nxt.state, 3_000_000, total_run_count=50, identity="x"
    )
    assert not stale.won and not stale.leading and store.load_runs(NS) == {"job": nxt.state}
    first = claim_run(store, NS, a, lease.term, "new", None, 5, total_run_count=9, identity="i")
    assert not first.won and store.load_runs(NS) == {"job": nxt.state}


def test_a_claim_compares_the_last_run_and_the_run_count(backend: Any) -> None:
    """A run dropped by a policy moves the last run and keeps the count (beat/ops.py): a claim
    made from the state before it must be refused, though the counts match."""
    store = backend.beat
    a = token()
    lease = backend.elect(Bid(NS, a, "beat-a", 30.0)).lease
    first = claim_run(store, NS, a, lease.term, "job", None, 1_000_000)
    dropped = claim_run(store, NS, a, lease.term, "job", first.state, 2_000_000, total_run_count=1)
    assert dropped.won and dropped.state == RunState(2_000_000, 1, lease.term)
    stale = claim_run(store, NS, a, lease.term, "job", first.state, 3_000_000)
    assert not stale.won and stale.state == dropped.state
    # and the count, not only the last run: an adopted edit keeps the time, sets the count
    edited = claim_run(store, NS, a, lease.term, "job", dropped.state, 2_000_000, total_run_count=7)
    assert edited.won and edited.state == RunState(2_000_000, 7, lease.term)
    stale = claim_run(store, NS, a, lease.term, "job", dropped.state, 4_000_000)
    assert not stale.won and stale.state == edited.state
    assert store.load_runs(NS) == {"job": edited.state}


def test_a_claim_under_an_old_term_of_the_same_token_is_refused(backend: Any) -> None:
    """An elector keeps its token when it is elected again: the term alone fences its old
    term's claims, first runs (single and batch) included."""
    store = backend.beat
    a = token()
    old = backend.elect(Bid(NS, a, "beat-a", 30.0)).lease
    expire(backend, NS)
    new = backend.elect(Bid(NS, a, "beat-a", 30.0)).lease
    assert new.term > old.term
    single = claim_run(store, NS, a, old.term, "job", None, 5)
    assert not single.won and not single.leading
    (batch,) = store.claim_runs(NS, a, old.term, [RunRequest("job", None, 5)])
    assert not batch.won and not batch.leading
    assert store.load_runs(NS) == {}


def test_a_batch_claim_decides_each_run_as_alone(backend: Any) -> None:
    """claim_runs (a burst): each request is the compare-and-set of its own state; the
    ones that lose report what is stored, the others are written, in one call."""
    store = backend.beat
    a = token()
    lease = backend.elect(Bid(NS, a, "beat-a", 30.0)).lease
    first = store.claim_runs(NS, a, lease.term, [RunRequest(f"e{i}", None, 1_000 + i)
                                                 for i in range(4)])  # fmt: skip
    assert [c.won for c in first] == [True] * 4
    assert [c.state for c in first] == [RunState(1_000 + i, 1, lease.term) for i in range(4)]
    e0, e1, _e2, e3 = (c.state for c in first)
    assert e0 is not None and e1 is not None and e3 is not None
    other_count = RunState(e3.last_run_us, 9, e3.term)  # same last run, another count
    out = store.claim_runs(NS, a, lease.term, [
        RunRequest("e0", e0, 5_000),  # as stored: wins
        RunRequest("e1", RunState(999, 1, lease.term), 5_000),  # another last run: lost
        RunRequest("e2", None, 5_000),  # "never ran", but it did: lost
        RunRequest("e3", other_count, 5_000),  # another run count: lost
        RunRequest("new", None, 7, total_run_count=3, identity="id:1"),  # first run: wins
        RunRequest("gone", e0, 5_000),  # a state for an entry with none: lost
    ])  # fmt: skip
    assert [c.won for c in out] == [True, False, False, False, True, False]
    assert all(c.leading for c in out)
    assert out[0].state == RunState(5_000, 2, lease.term)
    assert [c.state for c in out[1:4]] == [e1, first[2].state, e3]
    assert out[4].state == RunState(7, 3, lease.term, "id:1")
    assert out[5].state is None
    assert store.load_runs(NS) == {"e0": out[0].state, "e1": e1, "e2": first[2].state,
                                   "e3": e3, "new": out[4].state}  # fmt: skip
    # two entries in the same state: a claim of one leaves the other as it was
    twins = store.claim_runs(
        NS, a, lease.term, [RunRequest("x", None, 9), RunRequest("y", None, 9)]
    )
    (x,) = store.claim_runs(NS, a, lease.term, [RunRequest("x", twins[0].state, 10)])
    assert x.won and store.load_runs(NS)["y"] == twins[1].state
    with pytest.raises(ValueError):
        store.claim_runs(NS, a, lease.term, [RunRequest("x", None, 1), RunRequest("x", None, 2)])


def test_a_batch_claim_keeps_the_fence(backend: Any) -> None:
    """A wrong token, a stale term or an expired lease refuses the whole batch (updates
    and first runs alike, told they do not lead); the new leader's batch wins."""
    store = backend.beat
    a, b = token(), token()
    old = backend.elect(Bid(NS, a, "beat-a", 30.0)).lease
    (seed,) = store.claim_runs(NS, a, old.term, [RunRequest("job", None, 1_000)])
    assert seed.won and seed.state is not None
    before = store.load_runs(NS)

    def burst(tok: str, term: int) -> list[Any]:
        return store.claim_runs(NS, tok, term, [RunRequest("job", seed.state, 2_000),
                                                RunRequest("fresh", None, 2_000)])  # fmt: skip

    def refused(claims: list[Any]) -> bool:
        return all(not c.won and not c.leading for c in claims)

    assert refused(burst(b, old.term))  # a wrong token, the right term
    assert refused(burst(a, old.term + 1))  # a term that is not the lease's
    assert refused(burst(a, old.term - 1))
    assert store.load_runs(NS) == before
    expire(backend, NS)  # a paused past its lease
    assert refused(burst(a, old.term))
    assert store.load_runs(NS) == before
    new = backend.elect(Bid(NS, b, "beat-b", 30.0))
    assert new.won and new.lease.term > old.term
    assert refused(burst(a, old.term))  # a resumes, still believing it leads
    assert store.load_runs(NS) == before
    won = burst(b, new.lease.term)
    assert [c.won for c in won] == [True, True]
    assert won[0].state == RunState(2_000, 2, new.lease.term)
    # the same runs once only: a second claim from the same states is refused
    again = burst(b, new.lease.term)
    assert [c.won for c in again] == [False, False] and all(c.leading for c in again)
    assert [c.state for c in again] == [c.state for c in won]


def test_a_batch_larger_than_one_statement_keeps_order_and_the_fence(backend: Any) -> None:
    """More requests than one statement carries (BATCH): answers in request order."""
    from celery_election.backends.sql_beat import BATCH

    store = backend.beat
    a = token()
    lease = backend.elect(Bid(NS, a, "beat-a", 30.0)).lease
    n = BATCH + 37
    names = [f"job-{i:05d}" for i in range(n)]
    first = store.claim_runs(NS, a, lease.term, [RunRequest(x, None, i) for i, x in
                                                 enumerate(names)])  # fmt: skip
    assert all(c.won for c in first)
    assert [c.state.last_run_us for c in first] == list(range(n))
    # every other one from a stale state: exactly those lose, in both statements
    requests = [RunRequest(x, c.state if i % 2 == 0 else RunState(-1, 1, lease.term), 10**6)
                for i, (x, c) in enumerate(zip(names, first, strict=True))]  # fmt: skip
    out = store.claim_runs(NS, a, lease.term, requests)
    assert [c.won for c in out] == [i % 2 == 0 for i in range(n)]
    stored = store.load_runs(NS)
    assert sum(s.total_run_count == 2 for s in stored.values()) == (n + 1) // 2


def test_install_adds_the_identity_column_to_an_older_beat_table(sql_url: str) -> None:
    """Tables made before beat_run.identity get it from install(); their rows read as
    "any entry of that name" (None), nothing pending, and are claimed as before."""
    import sqlalchemy as sa

    from celery_election.backends import SQLBackend, backend_from_url
    from celery_election.backends.schema import entry_key

    prefix = f"t{uuid.uuid4().hex[:10]}_"
    b = backend_from_url(sql_url, table_prefix=prefix)
    assert isinstance(b, SQLBackend)
    try:
        b.install()
        old = sa.MetaData()  # beat_run as the previous version made it
        t = sa.Table(
            f"{prefix}beat_run",
            old,
            *[
                sa.Column(c.name, c.type, primary_key=c.primary_key, nullable=c.nullable)
                for c in b.beat_run.columns
                if c.name != "identity"
            ],
        )
        with b.engine.begin() as conn:
            conn.execute(sa.text(f"DROP TABLE {prefix}beat_run"))
            old.create_all(conn)
            conn.execute(t.insert().values(namespace=NS, entry_key=entry_key("job"),
                         entry_name="job", last_run_at=5, total_run_count=3, term=1,
                         updated_at=5))  # fmt: skip
        assert b.install() == []  # no table created, a column added
        added = {c["name"] for c in sa.inspect(b.engine).get_columns(t.name)}
        assert "identity" in added
        assert b.install() == []  # idempotent
        state = b.beat.load_runs(NS)["job"]
        assert state == RunState(5, 3, 1, None)
        a = token()
        lease = b.elect(Bid(NS, a, "beat-a", 30.0)).lease
        assert b.beat.pending_runs(NS) == []
        won = claim_run(b.beat, NS, a, lease.term, "job", state, 10, identity="id:1", pending=True)
        assert won.won and b.beat.load_runs(NS)["job"] == RunState(10, 4, lease.term, "id:1")
        assert by_entry(b.beat.pending_runs(NS))["job"].run == 5
    finally:
        b.uninstall()
        b.close()


class Counting(LeaderScheduler):
    """A LeaderScheduler that counts what it really sends (its tasks are sent by name)."""

    sent: list[tuple[str, int]]

    def send_task(self, name: str, *args: Any, **kwargs: Any) -> None:
        headers = kwargs.get("headers") or {}
        self.sent.append((name, headers["election_run"]))


def make_scheduler(app: Celery, tmp_path: Path, name: str) -> Counting:
    s = Counting(app=app, schedule_filename=str(tmp_path / f"{name}-schedule"))
    s.sent = []
    return s


def runs_conf(url: str) -> dict[str, Any]:
    """One entry every second."""
    return dict(
        election_url=url,
        election_table_prefix=f"t{uuid.uuid4().hex[:10]}_",
        election_namespace=f"n{uuid.uuid4().hex[:6]}",
        election_ttl=2.0,
        beat_schedule={"job": {"task": "runs.job", "schedule": 1.0}},
    )


def leading_scheduler(app: Celery, tmp_path: Path, name: str) -> Counting:
    """A scheduler of ``app`` that has become the leader."""
    s = make_scheduler(app, tmp_path, name)
    assert s.wait_for_leadership(10)
    return s


def app_for(url: str, name: str = "runs", conf: dict[str, Any] | None = None) -> Celery:
    app = Celery(name, broker="memory://", set_as_current=False)
    app.conf.update(conf or runs_conf(url))
    return app


def drop_tables(app: Celery) -> None:
    from celery_election.backends import backend_from_url

    b = backend_from_url(app.conf.election_url, table_prefix=app.conf.election_table_prefix)
    b.uninstall()
    b.close()


def test_a_stale_scheduler_sends_nothing_and_each_run_goes_once(
    sql_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="celery_election")  # shown if it fails
    # The takeover below is made by expire(), not by time: a 10 s lease without the
    # liveness delta keeps a loaded machine from ending a's or b's term on its own.
    conf = {**runs_conf(sql_url), "election_ttl": 10.0, "election_liveness": False}
    app = app_for(sql_url, conf=conf)
    a = leading_scheduler(app, tmp_path, "a")
    assert a._fence.election is not None
    stale = a._fence.election.leadership()
    assert stale is not None
    b = make_scheduler(app, tmp_path, "b")
    assert b._fence.election is not None and b._fence.election.elector is not None
    try:
        # bounds of 30 s: on MariaDB under a full suite a leader here sent nothing for
        # 15 s (not found why; _state says what each believed if it happens again)
        _tick_until(a, lambda: len(a.sent) >= 1, timeout=30)

        # a's elector is cut off from the database (as if paused) and b takes over; then
        # a resumes, still believing it leads (here: for the whole test)
        def cut(*args: Any, **kwargs: Any) -> Any:
            raise BackendUnavailableError("cut off")

        for step in ("elect", "renew", "resign"):
            setattr(a._fence.election.backend, step, cut)
        expire(b._fence.election.backend, b._fence.election.namespace)
        assert b._fence.election.elector.wait_for_leadership(10)
        a._fence.election.leadership = lambda: stale  # type: ignore[method-assign]
        before = len(a.sent)
        _tick_until(b, lambda: len(b.sent) >= 3, also=a, timeout=30)
        assert len(a.sent) == before, "the stale leader sent a run"
        runs = [run for _, run in a.sent + b.sent]
        assert len(runs) == len(set(runs)), f"a run was sent twice: {runs}"
        assert a._fence.leadership() is None, "the stale leader did not notice its term ended"
    finally:
        b.close()
        a.close()
        drop_tables(app)


def test_a_claim_whose_answer_was_lost_is_retried_not_dropped(tmp_path: Path) -> None:
    """Regression (chaos run, PostgreSQL restart): a failed claim lost its run for good
    although the same process kept leading. Now it is retried, and sent exactly once."""
    app = app_for(f"sqlite:///{tmp_path}/election.db")
    s = leading_scheduler(app, tmp_path, "a")
    assert s._fence.election is not None
    store = s._fence.election.store
    real = store.claim_runs
    failures: list[int] = []
    assert s._take_lead() is not None  # promoted: the new entry is recorded (run count 0)
    recorded = store.load_runs(s._fence.election.namespace)["job"]
    assert recorded.total_run_count == 0

    def commit_then_fail(*args: Any, **kwargs: Any) -> Any:
        result = real(*args, **kwargs)
        if not failures:  # the first run's claim commits, then its answer is lost
            failures.append(args[3][0].last_run_us)
            raise BackendUnavailableError("connection lost after commit")
        return result

    store.claim_runs = commit_then_fail  # type: ignore[method-assign]
    try:
        _tick_until(s, lambda: len(s.sent) >= 3)
    finally:
        s.close()
    runs = [run for _, run in s.sent]
    assert failures, "the claim was never made"
    # the first run (after the state recorded at promotion) was sent although its answer
    # was lost; the next run follows the time that claim stored
    assert runs[:2] == [recorded.last_run_us, failures[0]], (failures, runs)
    assert len(runs) == len(set(runs)), runs


def test_a_run_due_alone_keeps_when_it_fell_due(tmp_path: Path) -> None:
    """Regression: one entry due alone was claimed by a statement of its own, which left
    its row without its due time (a burst's batch kept it): its history showed no
    lateness. An entry's claim is a batch of one now."""
    from celery_election.backends import backend_from_url
    from celery_election.schedule.store import schedule_store

    app = app_for(f"sqlite:///{tmp_path}/election.db")
    s = leading_scheduler(app, tmp_path, "a")
    ns = s._fence.namespace
    try:
        _tick_until(s, lambda: len(s.sent) >= 2)
    finally:
        s.close()
    b = backend_from_url(app.conf.election_url, table_prefix=app.conf.election_table_prefix)
    try:
        store = schedule_store(b)
        assert store is not None
        runs = [r for r in store.history([ns], "job") if r.kind == "run"]
        assert len(runs) >= 2, runs
        assert all(r.due_at is not None and r.sent_at >= r.due_at for r in runs), runs
    finally:
        b.uninstall()
        b.close()


def test_a_beat_with_a_wrong_clock_keeps_to_the_database_clock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression (chaos run, one process's clock an hour fast): the shared state is on the
    database's clock, so a fast beat neither stores runs an hour ahead nor makes the next
    leader wait an hour."""
    conf = runs_conf(f"sqlite:///{tmp_path}/election.db")
    real_now = Celery.now
    hour = timedelta(hours=1)
    with monkeypatch.context() as m:  # every Celery clock of this process an hour fast
        m.setattr(Celery, "now", lambda self: real_now(self) + hour)
        a = leading_scheduler(app_for("", "fast", conf), tmp_path, "a")
        _tick_until(a, lambda: len(a.sent) >= 2)
        assert a._fence.offset_us < -3_500_000_000, "the hour was not measured"
        stored = a._fence.runs["job"].last_run_us
        a.close()  # resigns
    now_us = datetime.now(timezone.utc).timestamp() * 1_000_000
    assert abs(stored - now_us) < 10_000_000, "a fast host stored its own clock"
    fine = app_for("", "fine", conf)
    b = leading_scheduler(fine, tmp_path, "b")
    try:
        _tick_until(b, lambda: len(b.sent) >= 1)
        assert b.sent[0][1] == stored, "the next leader did not resume from the shared state"
    finally:
        b.close()
        drop_tables(fine)


class Shifting(Celery):
    """An app whose clock a test can move (Celery's clock plus ``shift``)."""

    shift = timedelta(0)

    def now(self) -> datetime:
        return super().now() + self.shift


def test_the_clock_offset_is_measured_on_the_real_clock_while_a_step_holds_it(
    tmp_path: Path,
) -> None:
    """A burst's step holds Celery's clock (beat/burst_costs.py); the offset read inside it
    is measured against the clock as it is, not the step's held instant: held, a clock
    that moved an hour on since the step began measured the database an hour ahead."""
    app = Shifting("shifting", broker="memory://", set_as_current=False)
    app.conf.update(runs_conf(f"sqlite:///{tmp_path}/election.db"))
    s = leading_scheduler(app, tmp_path, "a")
    try:
        s.tick()  # promoted: the offset measured once (about 0)
        assert abs(s._fence.offset_us) < 1_000_000
        with held(app):
            app.shift = timedelta(hours=1)  # the real clock moves on; the held reading not
            s._fence._next_offset = 0.0  # due for its next reading
            s._fence.measure_offset()
        assert s._fence.offset_us < -3_500_000_000, "measured on the held reading"
    finally:
        s.close()
        drop_tables(app)


def _tick_until(
    s: Counting, done: Callable[[], bool], also: Counting | None = None, timeout: float = 15
) -> None:
    """Drive beat's loop as ``celery beat`` does, until ``done()`` (bounded, not timed)."""
    import time

    deadline = boottime() + timeout
    while not done():
        assert boottime() < deadline, f"timed out ticking: {_state(s)}; also {_state(also)}"
        delays = [sched.tick() for sched in ((s, also) if also is not None else (s,))]
        time.sleep(max(0.0, min(0.05, *delays)))


def _state(s: Counting | None) -> str:
    """What a scheduler believes and what its namespace holds (for a timed-out tick)."""
    if s is None or s._fence.election is None:
        return "-"
    election, fence = s._fence.election, s._fence
    elector = election.elector
    return (
        f"leadership={fence.leadership()} lost_term={fence._lost_term} "
        f"loaded_term={fence.loaded_term} elector_term={getattr(elector, 'term', None)} "
        f"liveness={getattr(elector, 'liveness', None)} sent={s.sent} "
        f"lease={election.backend.current(election.namespace)} "
        f"runs={election.store.load_runs(election.namespace)} "
        f"pending={election.store.pending_runs(election.namespace)}"
    )


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
    assert lazy._fence.election is None  # the banner's lazy scheduler starts nothing
    s = make_scheduler(app, tmp_path, "s")
    try:
        assert s.wait_for_leadership(10)
        _tick_until(s, lambda: any(n == "x.one" for n, _ in s.sent))
        # an entry added while running is picked up, claimed and sent
        s.schedule["two"] = s.Entry(
            name="two", task="x.two", schedule=1.0, app=app, last_run_at=None
        )
        s.schedule["cron"] = s.Entry(
            name="cron", task="x.cron", schedule=crontab(minute="*"), app=app
        )
        _tick_until(s, lambda: any(n == "x.two" for n, _ in s.sent))
        for task in ("x.one", "x.two"):
            runs = [r for n, r in s.sent if n == task]
            assert len(runs) == len(set(runs)), f"{task} sent twice"
        assert s._fence.election is not None
        stored = s._fence.election.store.load_runs("shop-beat")
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
        assert s.wait_for_leadership(10)
        _tick_until(s, lambda: len(s.sent) >= 15)  # three rounds of five sends
        # once at promotion (and at most once more if leadership changed hands)
        assert rebuilds <= 2, f"the heap was rebuilt {rebuilds} times for {len(s.sent)} sends"
    finally:
        s.close()


@pytest.mark.parametrize("setting", ["election_beat_missed", "election_beat_resend_unconfirmed"])
def test_retired_settings_say_what_happens_now(
    tmp_path: Path, setting: str, caplog: pytest.LogCaptureFixture
) -> None:
    # (a Celery worker started in-process by an earlier test may have raised the root
    # logger's level: capture at WARNING whatever ran before)
    caplog.set_level(logging.WARNING, logger="celery_election")
    app = Celery("retired", broker="memory://", set_as_current=False)
    app.conf.update(election_url="memory://", beat_schedule={})
    app.conf[setting] = "skip"
    s = LeaderScheduler(app=app, schedule_filename=str(tmp_path / "s"))
    s.close()
    assert any(setting in r.getMessage() and "no longer used" in r.getMessage()
               for r in caplog.records)  # fmt: skip


def test_uninstall_drops_the_ledger_tables_of_earlier_versions(sql_url: str) -> None:
    import sqlalchemy as sa

    from celery_election.backends import SQLBackend, backend_from_url

    prefix = f"t{uuid.uuid4().hex[:10]}_"
    b = backend_from_url(sql_url, table_prefix=prefix)
    assert isinstance(b, SQLBackend)
    try:
        b.install()
        with b.engine.begin() as conn:  # what 0.1's install() left behind
            for name in ("beat_state", "beat_ledger"):
                conn.execute(sa.text(f"CREATE TABLE {prefix}{name} (x INTEGER)"))
        b.uninstall()
        left = [t for t in sa.inspect(b.engine).get_table_names() if t.startswith(prefix)]
        assert left == []
    finally:
        b.close()
