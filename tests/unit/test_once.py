"""Run once on the workers, eagerly on the memory backend: once_task, leader_task(once=True),
and the check the worker step puts on every task for the beat's runs (runs/once.py)."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery, states

from celery_election import MemoryBackend, init_app, leader_task, metrics, once_task
from celery_election.core import runstate
from celery_election.core.clock import boottime
from celery_election.core.lease import Bid
from celery_election.core.runstate import Delivery
from celery_election.election.shared_state import SharedLeadership
from celery_election.errors import BackendUnavailableError
from celery_election.metrics.counters import LocalCounters
from celery_election.runs import once, runonce
from celery_election.runs.once import HEADER, RESENT, ROWS, OnceTask, guard_registered
from celery_election.runs.runonce import RunGuard, run_key

from ..support.apps import new_app

NS = "unit"


@pytest.fixture
def backend() -> Iterator[MemoryBackend]:
    """The worker's guard on a memory backend, and counters to read; removed after."""
    b = MemoryBackend()
    guard = RunGuard(lambda: b, NS)
    runonce.use(guard)
    counts = LocalCounters()
    metrics.use_counters(counts)
    try:
        yield b
    finally:
        runonce.use(None)
        guard.close()  # its liveness session's threads end with the test
        metrics.use_counters(None)


@pytest.fixture
def app() -> Celery:
    return init_app(new_app(election_namespace=NS))


def counted(task: Any, outcome: str) -> int:
    store = metrics.counters.in_use()
    assert store is not None
    return store.snapshot().get(metrics.key(metrics.TASK, task.name, outcome), 0)


def test_a_once_task_runs_once_per_task_id(
    app: Celery, backend: MemoryBackend, caplog: pytest.LogCaptureFixture
) -> None:
    ran: list[int] = []

    @once_task(app=app, shared=False)
    def job(x: int) -> int:
        ran.append(x)
        return x

    tid = uuid.uuid4().hex
    assert job.apply((1,), task_id=tid).get() == 1
    with caplog.at_level(logging.WARNING, "celery_election.runs.once"):
        second = job.apply((1,), task_id=tid)
    assert second.state == states.IGNORED and ran == [1]
    assert counted(job, "duplicate") == 1
    skipped = [r for r in caplog.records if "skipped" in r.getMessage()]
    assert len(skipped) == 1 and job.name in skipped[0].getMessage()
    assert tid in skipped[0].getMessage()
    stored = backend.runs.load(NS, run_key(tid))
    assert stored.row.outcome == "SUCCESS" and stored.ended_us is not None
    assert job.apply((2,)).get() == 2 and ran == [1, 2]  # another id: another run


def test_a_failed_run_is_finished_too_and_a_retry_is_a_run_of_its_own(
    app: Celery, backend: MemoryBackend
) -> None:
    @app.task(base=OnceTask, shared=False)
    def fails() -> None:
        raise ValueError("boom")

    tid = uuid.uuid4().hex
    assert fails.apply(task_id=tid).state == states.FAILURE
    assert fails.apply(task_id=tid).state == states.IGNORED  # its end rode on this start
    assert backend.runs.load(NS, run_key(tid)).row.outcome == "FAILURE"
    assert fails.apply(task_id=tid, retries=1).state == states.FAILURE


def started_by(backend: MemoryBackend, tid: str, worker: str, *, acks_late: bool) -> None:
    """A worker process (liveness token ``worker``) started the run and has not ended it."""
    d = Delivery("t", 0, tid, uuid.uuid4().hex, worker, acks_late)
    assert backend.runs.start(NS, d, lambda w: True).run


def test_acks_late_runs_again_only_a_run_whose_worker_died(
    app: Celery, backend: MemoryBackend
) -> None:
    """Any copy (the beat's resend too: window 4 of issue 52) of a run whose worker died
    mid-run runs it; a copy beside a live worker's run waits (put off: eagerly, skipped)."""
    ran: list[int] = []

    @once_task(app=app, shared=False, acks_late=True)
    def late() -> None:
        ran.append(1)

    tid = uuid.uuid4().hex
    live = backend.keys.holder_session("live-worker", 1.0)
    assert live is not None and live.acquire(1.0)  # that worker's process lives
    try:
        started_by(backend, tid, "live-worker", acks_late=True)
        assert late.apply(task_id=tid, headers={RESENT: 2}).state == states.IGNORED
        assert ran == [] and counted(late, "deferred") == 1
    finally:
        live.close()  # it dies: its session ends with it
    late.apply(task_id=tid, headers={RESENT: 2})  # a copy sent again: it runs the run
    assert ran == [1]
    assert backend.runs.load(NS, run_key(tid)).row.attempt == 2
    assert late.apply(task_id=tid).state == states.IGNORED  # it finished: never again
    assert ran == [1] and counted(late, "duplicate") == 1


def test_by_default_a_run_whose_worker_died_is_not_run_again(
    app: Celery, backend: MemoryBackend
) -> None:
    ran: list[int] = []

    @once_task(app=app, shared=False)
    def early() -> None:
        ran.append(1)

    tid = uuid.uuid4().hex
    started_by(backend, tid, "dead-worker", acks_late=False)
    assert early.apply(task_id=tid).state == states.IGNORED and ran == []


def test_a_database_that_cannot_say_runs_nothing(app: Celery, backend: MemoryBackend) -> None:
    @once_task(app=app, shared=False)
    def job() -> None:
        raise AssertionError("must not run")

    backend.fail(BackendUnavailableError("down"))
    result = job.apply()
    assert result.state == states.FAILURE and isinstance(result.result, BackendUnavailableError)
    assert counted(job, "deferred") == 1


def test_the_worker_check_guards_only_beat_runs(app: Celery, backend: MemoryBackend) -> None:
    """A user's plain task, wrapped as the worker step wraps it: the run header decides."""
    ran: list[str] = []

    @app.task(shared=False)
    def plain(tag: str) -> None:
        ran.append(tag)

    assert guard_registered(app) >= 1
    assert guard_registered(app) >= 1  # idempotent: wrapped once
    tid = uuid.uuid4().hex
    plain.apply(("a",), task_id=tid)
    plain.apply(("b",), task_id=tid)  # no run header: not the beat's, not checked
    run = {HEADER: 7, "election_term": 3}
    plain.apply(("c",), task_id=tid, headers=run)
    assert plain.apply(("d",), task_id=tid, headers=run).state == states.IGNORED
    assert ran == ["a", "b", "c"] and counted(plain, "duplicate") == 1


def test_a_beat_run_starts_and_ends_the_row_its_beat_claimed(
    app: Celery, backend: MemoryBackend
) -> None:
    """A standalone beat claims in its own namespace, not the workers': the message names
    it (``ROWS``), so the worker starts and ends that row, the run's one record."""
    ran: list[str] = []

    @app.task(shared=False)
    def job(tag: str) -> None:
        ran.append(tag)

    guard_registered(app)
    term = backend.elect(Bid("unit-beat", "me", "beat", 30.0)).lease.term
    tid = runstate.run_task_id("unit-beat", "job", 5)
    backend.runs.claim("unit-beat", term, [("job", 0, tid)])
    run = {HEADER: 0, ROWS: "unit-beat"}
    job.apply(("a",), task_id=tid, headers=run)
    assert job.apply(("b",), task_id=tid, headers=run).state == states.IGNORED
    stored = backend.runs.load("unit-beat", runstate.run_key(tid))
    assert ran == ["a"] and stored is not None and stored.row.state == runstate.ENDED
    assert backend.runs.load(NS, runstate.run_key(tid)) is None  # no second record


def test_a_beat_run_that_nothing_checks_is_warned_of_once(
    app: Celery, caplog: pytest.LogCaptureFixture
) -> None:
    """Window 11 of issue 52: a worker without ``--election`` (or a spawned child, or a task
    registered after the worker step) runs beat runs unchecked: one WARNING per task,
    naming the fix; a checked task and a message that is not a beat run say nothing."""
    from celery_election.runs.once import warn_unchecked

    @app.task(shared=False)
    def unchecked() -> None:
        pass

    @app.task(shared=False)
    def checked() -> None:
        pass

    bare, wrapped = app.tasks[unchecked.name], app.tasks[checked.name]
    once._wrap(type(wrapped))  # as the worker step wraps what is registered then
    run = {"headers": {HEADER: 7}}
    with caplog.at_level(logging.WARNING, "celery_election.runs.once"):
        for task, request in [(bare, {}), (bare, run), (bare, run), (wrapped, run)]:
            task.push_request(**request)
            try:
                warn_unchecked(task)
            finally:
                task.pop_request()
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1 and unchecked.name in warned[0] and "--election" in warned[0]


def test_a_once_leader_task_records_only_on_the_leader(
    app: Celery, backend: MemoryBackend, clean_env: None
) -> None:
    ran: list[int] = []

    @leader_task(app=app, shared=False, once=True, on_follower="skip")
    def lead() -> None:
        ran.append(1)

    record = SharedLeadership.create()
    from celery_election.election import shared_state

    shared_state.use(record)
    try:
        tid = uuid.uuid4().hex
        record.write(None, None)
        assert lead.apply(task_id=tid).state == states.IGNORED  # a follower: no start
        assert backend.runs.load(NS, run_key(tid)) is None
        record.write(5, boottime() + 10)
        guard_registered(app)  # the worker's check on top: still one record, one run
        lead.apply(task_id=tid, headers={HEADER: 1})
        assert lead.apply(task_id=tid).state == states.IGNORED
        assert ran == [1] and backend.runs.load(NS, run_key(tid)).row.attempt == 1
    finally:
        shared_state.use(None)
        record.close()


def test_a_worker_defers_a_beat_run_while_the_database_cannot_say(
    backend: MemoryBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a real (in-process) worker: neither run nor dropped, and still checked after."""
    import time

    from celery_election import testing
    from celery_election.runs import once

    app = init_app(
        new_app(election_namespace=NS, broker_transport_options={"polling_interval": 0.01})
    )
    ran: list[str] = []

    @app.task(shared=False)
    def beat_job(tag: str) -> None:
        ran.append(tag)

    monkeypatch.setattr(once, "DEFER", 0.05)
    # the worker sets the root logger's level (Celery's log setup): the next tests' back
    monkeypatch.setattr(logging.root, "level", logging.root.level)
    guard_registered(app)
    tid = uuid.uuid4().hex
    backend.fail(BackendUnavailableError("down"))
    with testing.worker(app, perform_ping_check=False):
        beat_job.apply_async(("first",), task_id=tid, headers={HEADER: 9})
        deadline = time.monotonic() + 10
        while counted(beat_job, "deferred") < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert counted(beat_job, "deferred") >= 2 and ran == []
        backend.fail(None)
        while not ran and time.monotonic() < deadline:
            time.sleep(0.01)
        assert ran == ["first"]
        beat_job.apply_async(("again",), task_id=tid, headers={HEADER: 9})
        while counted(beat_job, "duplicate") < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
    assert ran == ["first"] and counted(beat_job, "duplicate") == 1


@pytest.mark.parametrize("acks_late", [False, True])
def test_a_put_off_delivery_runs_the_run_its_own_try_recorded(
    backend: MemoryBackend, monkeypatch: pytest.MonkeyPatch, acks_late: bool
) -> None:
    """In a real (in-process) worker: the database took the run's start and its answer
    was lost. The put-off copy names its try, finds the row that try started its own and
    runs it (one body): by default too, and though the beat had sent it again."""
    import time

    from celery_election import testing
    from celery_election.runs import once

    app = init_app(
        new_app(election_namespace=NS, broker_transport_options={"polling_interval": 0.01})
    )
    ran: list[str] = []

    @app.task(shared=False, acks_late=acks_late)
    def beat_job(tag: str) -> None:
        ran.append(tag)

    monkeypatch.setattr(once, "DEFER", 0.05)
    guard_registered(app)
    store = backend.runs
    started = store.start

    def committed_then_lost(namespace: str, d: Delivery, *args: Any, **kw: Any) -> Any:
        started(namespace, d, *args, **kw)
        monkeypatch.setattr(store, "start", started)  # the next answers come
        raise BackendUnavailableError("no answer")

    monkeypatch.setattr(store, "start", committed_then_lost)
    tid = uuid.uuid4().hex
    with testing.worker(app, perform_ping_check=False):
        beat_job.apply_async(("first",), task_id=tid, headers={HEADER: 9, RESENT: 2})
        deadline = time.monotonic() + 10
        while not ran and time.monotonic() < deadline:
            time.sleep(0.01)
    assert ran == ["first"] and counted(beat_job, "deferred") == 1
    once.guard_for(app).flush()  # an early-acknowledged end waits for a start: the timer's
    row = store.load(NS, run_key(tid)).row
    assert (row.attempt, row.outcome) == (1, "SUCCESS")  # its own row: one body, ended
