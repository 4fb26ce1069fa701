"""The test kit for singleton tasks (``election_keys``), as a user writes tests with it.

Tasks declared as users declare them (shared, module level). Another worker's hold is the
kit's (``hold``, ``release``, ``crash``); on_busy is seen eagerly (``apply()``) and in
Celery's in-process worker (the plugin's ``election_worker``, on ``celery_app`` from
``celery.contrib.pytest``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery, states

from celery_election import metrics
from celery_election.backends import MemoryBackend
from celery_election.core.clock import FakeClock
from celery_election.errors import ConfigurationError, ElectionError
from celery_election.keys.singleton import (
    KeyBusyError,
    SingletonTask,
    key_holder,
    singleton_task,
    waiting_key,
)
from celery_election.keys.testing import SingletonKeys

from ..support.postrun import Postrun

pytest_plugins = ("celery.contrib.pytest",)

RUNS: list[tuple[str, int, int | None]] = []


@singleton_task(bind=True, on_busy="skip")
def kit_report(self: Any, account: int) -> int:
    RUNS.append(("skip", account, self.singleton_term))
    return account


@singleton_task(bind=True, on_busy="raise")
def kit_raise(self: Any, account: int) -> int:
    RUNS.append(("raise", account, self.singleton_term))
    return account


@singleton_task(bind=True, requeue_delay=0.05)  # on_busy="requeue", the default
def kit_requeue(self: Any, account: int) -> int:
    RUNS.append(("requeue", account, self.singleton_term))
    return account


@singleton_task(bind=True, requeue_delay=0.05, one_waiting=True)
def kit_one_waiting(self: Any, account: int) -> int:
    RUNS.append(("one", account, self.singleton_term))
    return account


@pytest.fixture(autouse=True)
def _runs() -> Iterator[None]:
    RUNS.clear()
    yield
    RUNS.clear()


# -- eager ------------------------------------------------------------------------------------


def test_a_key_held_elsewhere_is_skipped_then_runs_once_released(
    election_keys: SingletonKeys,
) -> None:
    held = election_keys.hold(kit_report, 7)
    assert kit_report.apply((7,)).state == states.IGNORED
    assert RUNS == [] and election_keys.busy == [election_keys.key(kit_report, 7)]
    assert kit_report.apply((8,)).get() == 8  # another key runs meanwhile
    assert election_keys.release(kit_report, 7)
    assert kit_report.apply((7,)).get() == 7
    assert RUNS[-1][:2] == ("skip", 7) and RUNS[-1][2] > held.term  # a greater term
    assert election_keys.held() == []  # every key given back


def test_raise_fails_with_key_busy(election_keys: SingletonKeys) -> None:
    election_keys.hold(kit_raise, 1)
    result = kit_raise.apply((1,))
    assert result.state == states.FAILURE and isinstance(result.result, KeyBusyError)
    assert RUNS == []


def test_a_crashed_holders_key_is_taken_after_its_delta(election_keys: SingletonKeys) -> None:
    held = election_keys.hold(kit_raise, 1)
    assert kit_raise.apply((1,)).state == states.FAILURE  # alive: busy
    election_keys.crash()  # nothing released: its session ended
    started = time.monotonic()
    assert kit_raise.apply((1,)).get() == 1
    assert time.monotonic() - started >= election_keys.delta  # waited out its trust
    ((kind, account, term),) = RUNS
    assert (kind, account, term) == ("raise", 1, election_keys.ran[-1][1]) and term > held.term


def test_the_kit_is_every_apps_holder_while_installed() -> None:
    app = Celery("kit-other", broker="memory://", set_as_current=False)
    with SingletonKeys() as keys:
        assert key_holder(app) is keys.mine
        keys.hold("k")
        with pytest.raises(ElectionError, match="held already"):
            keys.hold("k")
    assert key_holder(app) is not keys.mine  # its own again
    key_holder(app).close()


# -- in a worker ------------------------------------------------------------------------------


@pytest.fixture
def celery_config() -> dict[str, Any]:
    return {"broker_transport_options": {"polling_interval": 0.01}}


def test_in_a_worker_requeue_comes_back_until_the_key_is_free(
    election_keys: SingletonKeys, election_worker: Any, celery_app: Celery
) -> None:
    election_keys.hold(kit_requeue, 3)
    result = kit_requeue.delay(3)
    election_keys.wait_busy(kit_requeue, 3)  # the worker found it held: requeued
    assert RUNS == []
    election_keys.release(kit_requeue, 3)
    assert result.get(timeout=10, interval=0.01) == 3
    ((kind, account, term),) = RUNS
    assert (kind, account, term) == ("requeue", 3, election_keys.wait_ran(kit_requeue, 3))


def test_in_a_worker_skip_and_raise(
    election_keys: SingletonKeys, election_worker: Any, celery_app: Celery, postrun: Postrun
) -> None:
    election_keys.hold(kit_report, 4)
    election_keys.hold(kit_raise, 4)
    skipped = kit_report.delay(4)
    assert postrun.wait(skipped.id) == states.IGNORED
    with pytest.raises(KeyBusyError):
        kit_raise.delay(4).get(timeout=10, interval=0.01)
    assert RUNS == []
    election_keys.crash()
    assert kit_report.delay(4).get(timeout=10, interval=0.01) == 4  # after the delta
    assert [r[:2] for r in RUNS] == [("skip", 4)]


def test_one_running_and_one_waiting_per_key_a_third_is_dropped(
    election_keys: SingletonKeys, election_worker: Any, celery_app: Celery, postrun: Postrun
) -> None:
    old = metrics.use_counters(metrics.LocalCounters())
    try:
        key = election_keys.key(kit_one_waiting, 5)
        election_keys.hold(kit_one_waiting, 5)  # running elsewhere
        second = kit_one_waiting.delay(5)
        election_keys.wait_busy(kit_one_waiting, 5)
        assert postrun.wait(second.id) == states.IGNORED  # requeued, holding the slot
        assert waiting_key(key) in [h.key for h in election_keys.held()]
        third = kit_one_waiting.delay(5)
        assert postrun.wait(third.id) == states.IGNORED
        counted = metrics.store().snapshot()  # type: ignore[union-attr]
        name = kit_one_waiting.name
        assert counted[metrics.key(metrics.KEY, name, "skipped")] == 1  # the third: dropped
        assert counted[metrics.key(metrics.KEY, name, "requeued")] >= 1  # the second waits
        election_keys.release(kit_one_waiting, 5)
        assert second.get(timeout=10, interval=0.01) == 5
        assert [h.key for h in election_keys.held()] == []  # its run freed the slot
        assert [r[:2] for r in RUNS] == [("one", 5)]
        fourth = kit_one_waiting.delay(5)  # nothing runs or waits: it runs
        assert fourth.get(timeout=10, interval=0.01) == 5
    finally:
        metrics.use_counters(old)


def test_one_waiting_needs_requeue() -> None:
    app = Celery("kit-bad", broker="memory://", set_as_current=False)
    app.finalize(auto=True)
    with pytest.raises(ConfigurationError, match="one_waiting"):

        @app.task(base=SingletonTask, shared=False, on_busy="skip", one_waiting=True)
        def skipper() -> None:
            pass


def test_a_requeue_not_sent_gives_its_waiting_slot_back(
    election_keys: SingletonKeys, monkeypatch: pytest.MonkeyPatch
) -> None:
    from celery.canvas import Signature

    def broker_down(*args: Any, **kwargs: Any) -> Any:
        raise OSError("broker down")

    monkeypatch.setattr(Signature, "apply_async", broker_down)
    key = election_keys.key(kit_one_waiting, 6)
    election_keys.hold(kit_one_waiting, 6)
    kit_one_waiting.push_request(id="t-6", args=(6,), kwargs={}, is_eager=False)
    try:
        with pytest.raises(OSError):
            kit_one_waiting(6)
    finally:
        kit_one_waiting.pop_request()
    assert [h.key for h in election_keys.held()] == [key]  # the slot is free again


@pytest.mark.parametrize("silent_holders_lose", [True, False])
def test_a_silent_holder_keeps_its_lock_only_where_silence_does_not_end_it(
    silent_holders_lose: bool,
) -> None:
    """The kit's backend keeps a holder's lock until its session closes: a ping thread
    starved on a loaded machine must not hand "another worker's" key to this one."""
    clock = FakeClock()
    backend = MemoryBackend(clock, liveness=True, silent_holders_lose=silent_holders_lose)
    session = backend.liveness_session("kit", 0.2, 1.0)
    assert session is not None and session.acquire(1.0)
    clock.advance(5.0)  # no ping for 25 deltas
    assert session.has_lock is not silent_holders_lose
    session.close()
    assert not session.has_lock
