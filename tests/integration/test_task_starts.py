"""Start records (run once on the workers) on every backend: memory, SQLite, PostgreSQL, MariaDB.

Each database decides which of two deliveries recorded a run with one insert-if-absent
statement; these tests hold every backend to the same answers (runonce.py's rules).
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from celery_election.backends import MemoryBackend
from celery_election.backends.base import TaskStart
from celery_election.clock import FakeClock
from celery_election.runonce import RunGuard, run_key, start_owner

from ..conftest import EVERY_KIND, make_backend

NS = "starts"


@pytest.fixture(params=EVERY_KIND)
def backend(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[Any]:
    yield from make_backend(request.param, tmp_path)


def start(task_id: str | None = None, retries: int = 0) -> TaskStart:
    task_id = task_id or uuid.uuid4().hex
    return TaskStart(run_key(task_id, retries), task_id, "proj.job", "celery@h1", 42, 1, 0)


def test_the_first_start_is_recorded_and_a_second_is_a_duplicate(backend: Any) -> None:
    s = start()
    assert backend.starts.record_start(NS, s)
    assert not backend.starts.record_start(NS, s)
    stored = backend.starts.load_start(NS, s.run_key)
    assert stored.task_id == s.task_id and stored.task_name == "proj.job"
    assert stored.hostname == "celery@h1" and stored.pid == 42 and stored.attempt == 1
    assert stored.started_at_us > 1_600_000_000_000_000  # the database's clock, epoch us
    assert stored.finished_at_us is None and stored.outcome is None


def test_keys_are_per_namespace_and_per_retry(backend: Any) -> None:
    s = start()
    assert backend.starts.record_start(NS, s)
    assert backend.starts.record_start("other", s)
    assert backend.starts.record_start(NS, start(s.task_id, retries=1))


def test_finish_marks_the_attempt_once(backend: Any) -> None:
    s = start()
    backend.starts.record_start(NS, s)
    assert not backend.starts.record_finish(NS, s.run_key, "SUCCESS", attempt=2)
    assert backend.starts.record_finish(NS, s.run_key, "SUCCESS")
    assert not backend.starts.record_finish(NS, s.run_key, "FAILURE")
    stored = backend.starts.load_start(NS, s.run_key)
    assert stored.outcome == "SUCCESS" and stored.finished_at_us >= stored.started_at_us


def test_an_unfinished_run_is_taken_over_once_and_a_finished_one_never(backend: Any) -> None:
    s = start()
    backend.starts.record_start(NS, s)
    assert backend.starts.rerun_start(NS, s.run_key, 1, "celery@h2", 7)
    assert not backend.starts.rerun_start(NS, s.run_key, 1, "celery@h3", 8)  # taken
    stored = backend.starts.load_start(NS, s.run_key)
    assert (stored.attempt, stored.hostname, stored.pid) == (2, "celery@h2", 7)
    assert not backend.starts.record_finish(NS, s.run_key, "SUCCESS", attempt=1)  # the old one
    assert backend.starts.record_finish(NS, s.run_key, "SUCCESS", attempt=2)
    assert not backend.starts.rerun_start(NS, s.run_key, 2, "celery@h3", 8)  # finished


def test_racing_deliveries_record_a_run_exactly_once(backend: Any) -> None:
    runs = [start() for _ in range(20)]
    won: list[str] = []
    barrier = threading.Barrier(4)

    def deliver() -> None:
        barrier.wait()
        for s in runs:
            if backend.starts.record_start(NS, s):
                won.append(s.run_key)

    threads = [threading.Thread(target=deliver) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(won) == sorted(s.run_key for s in runs)


def test_operators_read_the_newest_starts(backend: Any) -> None:
    a, b = start(), start()
    backend.starts.record_start(NS, a)
    backend.starts.record_start(NS, b)
    backend.starts.record_start(NS, start(a.task_id, retries=1))
    assert {s.run_key for s in backend.starts.load_starts(NS)} >= {a.run_key, b.run_key}
    mine = backend.starts.load_starts(NS, task_id=a.task_id)
    assert len(mine) == 2 and {s.task_id for s in mine} == {a.task_id}
    assert len(backend.starts.load_starts(NS, limit=1)) == 1
    assert backend.starts.load_start(NS, run_key("never")) is None


@pytest.mark.parametrize("acks_late", [False, True])
def test_the_guard_runs_a_delivered_run_once(backend: Any, acks_late: bool) -> None:
    guard = RunGuard(lambda: backend, NS)
    tid = uuid.uuid4().hex
    first = guard.enter(tid, 0, "proj.job", "celery@h1", acks_late=acks_late)
    assert first.run and first.reason == "recorded"
    # the first is still running (or died): a duplicate, unless acks_late takes it over
    second = guard.enter(tid, 0, "proj.job", "celery@h2", acks_late=acks_late)
    assert second.run == acks_late
    assert second.reason == ("rerun" if acks_late else "duplicate")
    guard.finish(second if acks_late else first, "SUCCESS")
    third = guard.enter(tid, 0, "proj.job", "celery@h3", acks_late=acks_late)
    assert not third.run
    # a retry of the task is a run of its own
    assert guard.enter(tid, 1, "proj.job", "celery@h1", acks_late=acks_late).run


@pytest.mark.parametrize("acks_late", [False, True])
def test_a_copy_sent_again_waits_for_the_first_and_a_put_off_one_owns_its_record(
    backend: Any, acks_late: bool
) -> None:
    """A copy the beat sent again (``resent``) while the first copy is unfinished is
    skipped in either mode; a delivery put off after its own insert committed (``mine``:
    the record's writer) runs, in either mode, and only its own record."""
    guard = RunGuard(lambda: backend, NS)
    tid = uuid.uuid4().hex
    assert guard.enter(tid, 0, "proj.job", "celery@h1", acks_late=acks_late).run
    again = guard.enter(tid, 0, "proj.job", "celery@h2", acks_late=acks_late, resent=True)
    assert not again.run and again.reason == ("running" if acks_late else "duplicate")
    # a redelivery (not resent) still takes an unfinished run over under acks_late
    back = guard.enter(tid, 0, "proj.job", "celery@h3", acks_late=acks_late)
    assert back.run == acks_late

    put_off = uuid.uuid4().hex  # its try's insert committed, then the answer was lost
    assert guard.enter(put_off, 0, "proj.job", "celery@h1", acks_late=acks_late).run
    seen = backend.starts.load_start(NS, run_key(put_off))
    other = start_owner("celery@h9", seen.pid)
    refused = guard.enter(put_off, 0, "proj.job", "celery@h2", acks_late=acks_late,
                          resent=True, mine=other)  # fmt: skip
    assert not refused.run  # someone else's record: the resent copy waits
    own = guard.enter(put_off, 0, "proj.job", "celery@h1", acks_late=acks_late,
                      resent=True, mine=start_owner(seen.hostname, seen.pid))  # fmt: skip
    assert own.run and own.reason == "rerun" and own.attempt == 2
    guard.finish(own, "SUCCESS")
    done = guard.enter(put_off, 0, "proj.job", "celery@h1", acks_late=acks_late,
                       mine=start_owner(seen.hostname, os.getpid()))  # fmt: skip
    assert not done.run  # finished: never again, its own or not


def test_old_records_are_pruned_in_batches_per_namespace(backend: Any) -> None:
    """Records older than the retention go, a batch at a time; other namespaces' stay (a
    run whose record is pruned would run again if delivered)."""
    old = [start() for _ in range(3)]
    for s in old:
        assert backend.starts.record_start(NS, s)
    assert backend.starts.record_start("other", old[0])
    assert backend.starts.prune_starts(NS, 3600) == 0  # none is an hour old
    time.sleep(0.05)  # the database's clock moves past the records' starts
    assert backend.starts.prune_starts(NS, 0, batch=2) == 2
    assert backend.starts.prune_starts(NS, 0, batch=2) == 1
    assert backend.starts.prune_starts(NS, 0) == 0
    assert [backend.starts.load_start(NS, s.run_key) for s in old] == [None] * 3
    assert backend.starts.load_start("other", old[0].run_key) is not None


def test_the_guard_prunes_once_in_a_while(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each process prunes at most every PRUNE_EVERY s, sooner while whole batches go."""
    from celery_election import runonce

    clock = FakeClock()
    backend = MemoryBackend(clock=clock)
    monkeypatch.setattr(runonce, "PRUNE_BATCH", 2)
    monkeypatch.setattr(runonce.time, "monotonic", clock.monotonic)
    old = [start() for _ in range(5)]
    for s in old:
        backend.starts.record_start(NS, s)
    clock.advance(601)
    guard = RunGuard(lambda: backend, NS, retention=600)

    def deliver() -> int:  # a new run; how many old records are left
        guard.enter(uuid.uuid4().hex, 0, "proj.job", "h", acks_late=False)
        return sum(backend.starts.load_start(NS, s.run_key) is not None for s in old)

    assert deliver() == 3  # the first delivery prunes a batch
    assert deliver() == 3  # not due again yet
    clock.advance(runonce.PRUNE_EVERY / 10)  # a whole batch went: due again soon
    assert deliver() == 1
    clock.advance(runonce.PRUNE_EVERY / 10)
    assert deliver() == 0  # the last one: a batch that was not whole
    assert len(backend.starts.load_starts(NS)) == 4  # the deliveries' own, none old


def test_a_prune_that_fails_never_fails_the_delivery(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Pruning is housekeeping: lost to contention (a chaos run saw a deadlock), the run
    still runs, and the next prune tries again."""
    from celery_election.errors import BackendUnavailableError

    backend = MemoryBackend()

    def refused(*args: Any, **kwargs: Any) -> int:
        raise BackendUnavailableError("refused a prune of start records (lock contention)")

    monkeypatch.setattr(backend.starts, "prune_starts", refused)
    guard = RunGuard(lambda: backend, NS, retention=600)
    caplog.set_level("WARNING", logger="celery_election.runonce")
    verdict = guard.enter(uuid.uuid4().hex, 0, "proj.job", "h", acks_late=False)
    assert verdict.run and verdict.reason == "recorded"
    assert "could not prune old start records" in caplog.text
