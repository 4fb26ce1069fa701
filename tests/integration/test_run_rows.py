"""The run rows on every backend: memory, SQLite, PostgreSQL, MariaDB (and both drivers).

Each transition is core/runstate.py's pure function (table-tested in tests/unit/test_runstate.py);
a store applies it atomically: the memory one under its lock, SQL with one conditional write
that races lose and read again. These tests hold every store to the same answers, and the
guard (runs/runonce.py) to its rules with real liveness sessions: two guards in this process stand
for two worker processes, each with a session of its own.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest
import sqlalchemy as sa

from celery_election.backends import MemoryBackend
from celery_election.core import runstate
from celery_election.core.clock import FakeClock
from celery_election.core.lease import Bid
from celery_election.core.runstate import ENDED, SENT, STARTED, Delivery, run_key
from celery_election.errors import BackendUnavailableError
from celery_election.runs.runonce import RunGuard
from harness.cluster import wait_until

from ..conftest import EVERY_KIND, claim_run, make_backend

NS = "runs"
ALIVE = lambda worker: True  # noqa: E731
DEAD = lambda worker: False  # noqa: E731


@pytest.fixture(params=EVERY_KIND, scope="module")
def backend(request: pytest.FixtureRequest, tmp_path_factory: Any) -> Iterator[Any]:
    """One installed backend per kind for the module: each test's runs have ids of their
    own (installing 11 tables per test cost more than the tests)."""
    yield from make_backend(request.param, tmp_path_factory.mktemp("runs"))


@pytest.fixture(params=[k for k in EVERY_KIND if k != "memory"], scope="module")
def sql_backend(request: pytest.FixtureRequest, tmp_path_factory: Any) -> Iterator[Any]:
    yield from make_backend(request.param, tmp_path_factory.mktemp("runs"))


def delivery(task_id: str, token: str = "d1", worker: str | None = "w1", *,
             acks_late: bool = False, put_off: tuple[str, ...] = (), retries: int = 0
             ) -> Delivery:  # fmt: skip
    return Delivery("proj.job", 0, task_id, token, worker, acks_late, put_off, retries)


def new_id() -> str:
    return uuid.uuid4().hex


def test_the_first_start_runs_and_a_second_delivery_is_skipped(backend: Any) -> None:
    tid = new_id()
    first = backend.runs.start(NS, delivery(tid), ALIVE, task_name="proj.job", hostname="h1")
    assert (first.verdict, first.reason) == ("run", "started")
    again = backend.runs.start(NS, delivery(tid, "d2", "w2"), DEAD)
    assert (again.verdict, again.reason) == ("skip", "started")  # acknowledged early
    stored = backend.runs.load(NS, run_key(tid))
    assert stored.row.state == STARTED and stored.row.delivery == "d1" and stored.row.attempt == 1
    assert stored.row.task_id == tid and stored.task_name == "proj.job"
    assert stored.hostname == "h1"
    assert stored.created_us > 1_600_000_000_000_000  # the database's clock, epoch us
    assert stored.ended_us is None


@pytest.mark.parametrize("acks_late", [False, True])
def test_a_beat_runs_first_delivery_starts_its_claimed_row_in_one_statement(
    sql_backend: Any, acks_late: bool
) -> None:
    """The claim wrote the row: its first delivery moves it to started with one UPDATE
    (its row read back in the same transaction where RETURNING is missing); a second
    delivery finds it started and is judged as any (skipped, or put off while its starter
    lives); a flagged delivery of a run nobody claimed inserts its row as any."""
    import sqlalchemy as sa

    ns, me = f"fast-{new_id()[:8]}", new_id()
    term = sql_backend.elect(Bid(ns, me, "beat", 30.0)).lease.term
    assert claim_run(sql_backend.beat, ns, me, term, "job", None, 5, pending=True).won
    tid = runstate.run_task_id(ns, "job", 5)
    d = replace(delivery(tid, acks_late=acks_late), claimed=True)
    statements: list[str] = []

    def seen(conn: Any, cursor: Any, statement: str, *rest: Any) -> None:
        statements.append(statement)

    sa.event.listen(sql_backend.engine, "before_cursor_execute", seen)
    try:
        first = sql_backend.runs.start(ns, d, ALIVE, hostname="h1")
    finally:
        sa.event.remove(sql_backend.engine, "before_cursor_execute", seen)
    assert (first.verdict, first.reason) == ("run", "started") and first.row.attempt == 1
    writes = [s for s in statements if s.lstrip().upper().startswith(("UPDATE", "INSERT"))]
    assert len(writes) == 1 and writes[0].lstrip().upper().startswith("UPDATE"), statements
    again = sql_backend.runs.start(ns, replace(d, token="d2", worker="w2"), ALIVE)
    expect = ("defer", "running") if acks_late else ("skip", "started")
    assert (again.verdict, again.reason) == expect
    stored = sql_backend.runs.load(ns, run_key(tid))
    assert (stored.row.state, stored.row.delivery, stored.row.attempt) == (STARTED, "d1", 1)
    assert stored.row.entry == "job" and stored.row.term == term and stored.hostname == "h1"
    other = new_id()  # flagged, but no claim wrote its row: inserted
    assert sql_backend.runs.start(ns, replace(delivery(other), claimed=True), ALIVE).run


def test_keys_are_per_namespace_and_per_retry(backend: Any) -> None:
    tid = new_id()
    assert backend.runs.start(NS, delivery(tid), ALIVE).run
    assert backend.runs.start("other", delivery(tid), ALIVE).run
    assert backend.runs.start(NS, delivery(tid, retries=1), ALIVE).run
    assert backend.runs.load(NS, run_key(tid, 1)) is not None


def test_only_the_starting_delivery_ends_the_run_and_only_once(backend: Any) -> None:
    tid = new_id()
    backend.runs.start(NS, delivery(tid), ALIVE)
    assert not backend.runs.finish(NS, run_key(tid), "d2", "IGNORED")  # a skipped copy's
    assert backend.runs.finish(NS, run_key(tid), "d1", "SUCCESS")
    assert not backend.runs.finish(NS, run_key(tid), "d1", "FAILURE")
    stored = backend.runs.load(NS, run_key(tid))
    assert (stored.row.state, stored.row.outcome) == (ENDED, "SUCCESS")
    assert stored.ended_us >= stored.created_us
    done = backend.runs.start(NS, delivery(tid, "d3", acks_late=True), DEAD)
    assert (done.verdict, done.reason) == ("skip", "finished")


def test_acks_late_waits_for_a_live_starter_and_takes_a_dead_ones_run_over(backend: Any) -> None:
    tid = new_id()
    key = run_key(tid)
    assert backend.runs.start(NS, delivery(tid, acks_late=True), ALIVE).run
    asked: list[str] = []

    def alive(worker: str) -> bool:
        asked.append(worker)
        return True

    wait = backend.runs.start(NS, delivery(tid, "d2", "w2", acks_late=True), alive)
    assert (wait.verdict, wait.reason, asked) == ("defer", "running", ["w1"])
    over = backend.runs.start(NS, delivery(tid, "d3", "w3", acks_late=True), DEAD)
    assert (over.verdict, over.reason) == ("run", "taken over")
    stored = backend.runs.load(NS, key).row
    assert (stored.attempt, stored.delivery, stored.worker) == (2, "d3", "w3")
    assert not backend.runs.finish(NS, key, "d1", "SUCCESS")  # the dead one's body: not its
    assert backend.runs.finish(NS, key, "d3", "SUCCESS")


def test_a_copy_put_off_by_its_own_try_runs_the_row_that_try_started(backend: Any) -> None:
    """The try's start committed and its answer was lost: the copy names the try."""
    tid = new_id()
    assert backend.runs.start(NS, delivery(tid, "t1"), ALIVE).run
    other = backend.runs.start(NS, delivery(tid, "t2", put_off=("t0",)), ALIVE)
    assert (other.verdict, other.reason) == ("skip", "started")  # another try's row
    own = backend.runs.start(NS, delivery(tid, "t3", put_off=("t0", "t1")), ALIVE)
    assert (own.verdict, own.reason) == ("run", "own")
    assert backend.runs.load(NS, run_key(tid)).row.delivery == "t3"


def test_a_released_run_is_started_again_by_its_next_delivery(backend: Any) -> None:
    tid = new_id()
    backend.runs.start(NS, delivery(tid), ALIVE)
    assert not backend.runs.release(NS, run_key(tid), "d9")
    assert backend.runs.release(NS, run_key(tid), "d1")
    assert backend.runs.load(NS, run_key(tid)).row.state == SENT
    assert backend.runs.start(NS, delivery(tid, "d2", "w2"), ALIVE).run


def race(backend: Any, ids: list[str], *, acks_late: bool = False) -> list[str]:
    """Four processes deliver each run at once: the runs each process's start ran."""
    won: list[str] = []
    barrier = threading.Barrier(4)

    def deliver(n: int) -> None:
        barrier.wait()
        for tid in ids:
            d = delivery(tid, f"r{n}", f"x{n}", acks_late=acks_late)
            if backend.runs.start(NS, d, lambda w: w != "w1").run:  # w1: dead
                won.append(tid)

    threads = [threading.Thread(target=deliver, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return won


def test_racing_deliveries_start_each_run_exactly_once(backend: Any) -> None:
    ids = [new_id() for _ in range(20)]
    assert sorted(race(backend, ids)) == sorted(ids)


def test_racing_acks_late_takeovers_of_a_dead_run_run_it_once(backend: Any) -> None:
    ids = [new_id() for _ in range(10)]
    for tid in ids:
        backend.runs.start(NS, delivery(tid, acks_late=True), ALIVE)  # then w1 died
    # each once: the others found a live taker
    assert sorted(race(backend, ids, acks_late=True)) == sorted(ids)


def test_operators_read_the_newest_runs(backend: Any) -> None:
    a, b = new_id(), new_id()
    for d in (delivery(a), delivery(b), delivery(a, retries=1)):
        backend.runs.start(NS, d, ALIVE)
    assert {r.key for r in backend.runs.newest(NS)} >= {run_key(a), run_key(b)}
    mine = backend.runs.newest(NS, task_id=a)
    assert len(mine) == 2 and {r.row.task_id for r in mine} == {a}
    assert len(backend.runs.newest(NS, limit=1)) == 1
    assert backend.runs.load(NS, run_key("never")) is None


def test_old_runs_are_pruned_in_batches_per_namespace(backend: Any) -> None:
    """Rows older than the retention go, a batch at a time; other namespaces' stay (a
    run whose row is pruned would run again if delivered)."""
    ns = f"prune-{new_id()[:8]}"
    old = [new_id() for _ in range(3)]
    for tid in old:
        backend.runs.start(ns, delivery(tid), ALIVE)
    backend.runs.start("other", delivery(old[0]), ALIVE)
    assert backend.runs.prune(ns, 3600) == 0  # none is an hour old
    assert backend.runs.prune(ns, -3600, history=True) == 0  # a beat's prune: not these
    # older than an hour from now: all of them (no wait for the database's clock to move)
    assert backend.runs.prune(ns, -3600, batch=2) == 2
    assert backend.runs.prune(ns, -3600, batch=2) == 1
    assert backend.runs.prune(ns, -3600) == 0
    assert [backend.runs.load(ns, run_key(t)) for t in old] == [None] * 3
    assert backend.runs.load("other", run_key(old[0])) is not None


def test_a_row_a_0_2_worker_wrote_reads_as_started_then_ended(sql_backend: Any) -> None:
    """A rolling upgrade: 0.2 workers insert start records with no state; a 0.3 worker
    reads one as started (skipped, at most once) and, once finished, as ended."""
    backend = sql_backend
    t = backend.runs.table
    tid = new_id()
    old = {"namespace": NS, "run_key": run_key(tid), "task_id": tid, "task_name": "proj.job",
           "hostname": "h0", "pid": 7, "attempt": 1, "started_at": 1}  # fmt: skip
    with backend.engine.begin() as conn:
        conn.execute(sa.insert(t).values(old))
    late = backend.runs.start(NS, delivery(tid, acks_late=True), DEAD)
    assert (late.verdict, late.reason) == ("skip", "started")  # nobody to ask
    with backend.engine.begin() as conn:
        conn.execute(sa.update(t).where(t.c.run_key == run_key(tid)).values(finished_at=2))
    assert backend.runs.start(NS, delivery(tid), DEAD).reason == "finished"


# -- the guard: each "process" a liveness session of its own --------------------------------


def guards(backend: Any) -> tuple[RunGuard, RunGuard]:
    return (RunGuard(lambda: backend, NS, liveness=1.0),
            RunGuard(lambda: backend, NS, liveness=1.0))  # fmt: skip


@pytest.mark.parametrize("acks_late", [False, True])
def test_the_guard_runs_a_delivered_run_once(backend: Any, acks_late: bool) -> None:
    one, two = guards(backend)
    try:
        tid = new_id()
        first = one.enter(tid, 0, "proj.job", "celery@h1", acks_late=acks_late)
        assert first.run and first.reason == "started"
        # the first runs: a second delivery is skipped, or (acks_late) waits for it
        second = two.enter(tid, 0, "proj.job", "celery@h2", acks_late=acks_late)
        assert (second.verdict, second.reason) == (
            ("defer", "running") if acks_late else ("skip", "started"))  # fmt: skip
        one.finish(first, "SUCCESS")  # acknowledged early: the end waits for a start
        if not acks_late:
            third = two.enter(tid, 0, "proj.job", "celery@h3", acks_late=acks_late)
            assert (third.verdict, third.reason) == ("skip", "started")  # skipped all the same
            assert one.enter(new_id(), 0, "proj.job", "celery@h1", acks_late=False).run
        third = two.enter(tid, 0, "proj.job", "celery@h3", acks_late=acks_late)
        assert (third.verdict, third.reason) == ("skip", "finished")
        # a retry of the task is a run of its own
        assert two.enter(tid, 1, "proj.job", "celery@h1", acks_late=acks_late).run
    finally:
        one.close()
        two.close()


def test_an_early_acknowledged_runs_end_rides_on_the_next_start_or_is_written_alone(
    backend: Any,
) -> None:
    """A run acknowledged early ends with the process's next start (one commit for both),
    or alone when the timer (or the process's exit) flushes it; a start that fails keeps
    the ends for the next. Under acks_late the end is written at once (a redelivery
    would take a dead worker's run over)."""
    one, other = guards(backend)
    try:
        runs = [new_id() for _ in range(4)]

        def state(tid: str) -> str:
            stored = backend.runs.load(NS, run_key(tid))
            return stored.row.state

        first = one.enter(runs[0], 0, "proj.job", "h1", acks_late=False)
        one.finish(first, "SUCCESS")
        assert state(runs[0]) == STARTED and one._timer is not None  # waits, timer armed
        one.enter(runs[1], 0, "proj.job", "h1", acks_late=False)
        assert state(runs[0]) == ENDED  # it rode on that start
        one.finish(one.enter(runs[2], 0, "proj.job", "h1", acks_late=False), "SUCCESS")
        real = backend.runs.start

        def refused(*args: Any, **kwargs: Any) -> Any:
            backend.runs.start = real  # the next start gets through
            raise BackendUnavailableError("the database did not answer")

        backend.runs.start = refused
        with pytest.raises(BackendUnavailableError):
            one.enter(new_id(), 0, "proj.job", "h1", acks_late=False)
        assert state(runs[2]) == STARTED  # the end was not written: it waits still
        one.flush()  # what the timer does
        assert state(runs[2]) == ENDED
        late = one.enter(runs[3], 0, "proj.job", "h1", acks_late=True)
        one.finish(late, "FAILURE")
        assert state(runs[3]) == ENDED  # at once
    finally:
        one.close()
        other.close()


def test_the_guard_takes_over_a_dead_processs_run_under_acks_late(backend: Any) -> None:
    """Window 4 and 5 of issue 52: the redelivery of a run whose worker died runs it (a
    resent copy or not), while a copy beside a live worker's run never does."""
    one, two = guards(backend)
    try:
        tid = new_id()
        assert one.enter(tid, 0, "proj.job", "h1", acks_late=True).run
        assert two.enter(tid, 0, "proj.job", "h2", acks_late=True).verdict == "defer"
        one.close()  # the process dies: its session ends with it

        # the server ends the dead session in its own time (a loaded CI run found it still
        # on): until then the copy is put off again, as the redelivered copy would be
        def redelivered() -> Any:
            back = two.enter(tid, 0, "proj.job", "h2", acks_late=True)
            assert back.verdict != "defer" or back.reason == "running", back
            return None if back.verdict == "defer" else back

        back = wait_until(redelivered, 10.0, "the server to end the dead process's session")
        assert (back.verdict, back.reason, back.attempt) == ("run", "taken over", 2)
    finally:
        two.close()


def test_the_guard_prunes_once_in_a_while(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each process prunes at most every PRUNE_EVERY s, sooner while whole batches go."""
    from celery_election.runs import runonce

    clock = FakeClock()
    backend = MemoryBackend(clock=clock)
    monkeypatch.setattr(runonce, "PRUNE_BATCH", 2)
    monkeypatch.setattr(runonce.time, "monotonic", clock.monotonic)
    old = [new_id() for _ in range(5)]
    for tid in old:
        backend.runs.start(NS, delivery(tid), ALIVE)
    clock.advance(601)
    guard = RunGuard(lambda: backend, NS, retention=600, liveness=None)

    def deliver() -> int:  # a new run; how many old rows are left
        guard.enter(new_id(), 0, "proj.job", "h", acks_late=False)
        return sum(backend.runs.load(NS, run_key(t)) is not None for t in old)

    assert deliver() == 3  # the first delivery prunes a batch
    assert deliver() == 3  # not due again yet
    clock.advance(runonce.PRUNE_EVERY / 10)  # a whole batch went: due again soon
    assert deliver() == 1
    clock.advance(runonce.PRUNE_EVERY / 10)
    assert deliver() == 0  # the last one: a batch that was not whole
    assert len(backend.runs.newest(NS)) == 4  # the deliveries' own, none old


def test_a_prune_that_fails_never_fails_the_delivery(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Pruning is housekeeping: lost to contention (a chaos run saw a deadlock), the run
    still runs, and the next prune tries again."""
    from celery_election.errors import BackendUnavailableError

    backend = MemoryBackend()

    def refused(*args: Any, **kwargs: Any) -> int:
        raise BackendUnavailableError("refused a run's prune (lock contention)")

    monkeypatch.setattr(backend.runs, "prune", refused)
    guard = RunGuard(lambda: backend, NS, retention=600, liveness=None)
    caplog.set_level("WARNING", logger="celery_election.runs.runonce")
    verdict = guard.enter(new_id(), 0, "proj.job", "h", acks_late=False)
    assert verdict.run and verdict.reason == "started"
    assert "could not prune old runs" in caplog.text


@pytest.mark.parametrize("column", ["state", "attempt", "delivery", "finished_at"])
def test_a_write_decided_on_a_stale_read_changes_nothing(sql_backend: Any, column: str) -> None:
    """The SQL store's one condition: the row is still what the transition read. Another
    writer changed ``column`` in between (a finish, a takeover, a 0.2 worker's rerun or
    end): the write loses, and the caller reads again."""
    backend = sql_backend
    store = backend.runs
    tid = new_id()
    assert store.start(NS, delivery(tid, acks_late=True), ALIVE).run
    raw = store._read(NS, run_key(tid))
    stale = SimpleNamespace(**raw._asdict())
    setattr(stale, column, {"state": "sent", "attempt": 0, "delivery": "d0",
                            "finished_at": 1}[column])  # fmt: skip
    taken = store.load(NS, run_key(tid)).row
    assert not store._write(NS, run_key(tid), stale, replace(taken, delivery="d9"))
    assert store.load(NS, run_key(tid)).row.delivery == "d1"
    assert store._write(NS, run_key(tid), raw, replace(taken, delivery="d9"))


def test_a_run_reaped_as_lost_is_closed_by_its_own_delivery(sql_backend: Any) -> None:
    """Its worker was paused past its liveness, not dead: the body went on to its end."""
    store = sql_backend.runs
    tid = new_id()
    store.start(NS, delivery(tid), ALIVE)
    raw = store._read(NS, run_key(tid))
    lost = runstate.reap(store.load(NS, run_key(tid)).row, DEAD)
    assert lost is not None and store._write(NS, run_key(tid), raw, lost)
    assert not store.finish(NS, run_key(tid), "d2", "SUCCESS")  # not its delivery
    assert store.finish(NS, run_key(tid), "d1", "SUCCESS")
    assert store.load(NS, run_key(tid)).row.outcome == "SUCCESS"
