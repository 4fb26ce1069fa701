"""singleton_task and SingletonTask: keys, on_busy, the term, a dead holder, trust.

In memory (MemoryBackend, its liveness locks) and eagerly: another ``KeyHolder`` on the
same backend plays the other worker.
"""

from __future__ import annotations

import time
import uuid
from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery, states
from celery.exceptions import Ignore

from celery_election.backends import MemoryBackend
from celery_election.core.clock import FakeClock
from celery_election.core.decisions import Proof
from celery_election.core.keys import holder_lock_name
from celery_election.election.holder import Held, KeyHolder
from celery_election.errors import ConfigurationError
from celery_election.keys.singleton import (
    KeyBusyError,
    SingletonTask,
    singleton_key,
    singleton_task,
)

from ..support.apps import new_app
from ..support.singleton_holders import DELTA, app, backend, other

__all__ = ["app", "backend", "other"]  # the fixtures, used by name


def make(app: Celery, **options: Any) -> tuple[Any, list[tuple[Any, ...]]]:
    runs: list[tuple[Any, ...]] = []

    @singleton_task(app=app, name=f"unit.s{uuid.uuid4().hex[:6]}", **options)
    def report(self: Any, account: int, day: str = "mon") -> int:
        runs.append((account, day, self.singleton_term))
        return account

    return report, runs


def key_of(task: Any, *args: Any, **kwargs: Any) -> str:
    return str(task.key_for(args, kwargs))


def test_a_free_key_runs_with_its_term_and_is_released(app: Celery, backend: Any) -> None:
    task, runs = make(app, bind=True)
    assert task.apply((7,)).get() == 7
    ((account, day, term),) = runs
    assert (account, day) == (7, "mon") and term is not None and term > 0
    assert backend.keys.held("unit") == []  # given back when it returned
    task.apply((7,)).get()
    assert runs[1][2] > term  # each run is a new hold: a greater term


@pytest.mark.parametrize("mode", ["skip", "raise", "requeue"])
def test_a_held_key_is_busy_by_on_busy(app: Celery, other: KeyHolder, mode: str) -> None:
    task, runs = make(app, bind=True, on_busy=mode, requeue_delay=0.01)
    assert other.acquire(key_of(task, 7)) is not None
    result = task.apply((7,))
    if mode == "skip":
        assert result.state == states.IGNORED
    elif mode == "raise":
        assert result.state == states.FAILURE and isinstance(result.result, KeyBusyError)
    else:
        assert result.state in {states.RETRY, states.FAILURE}
    assert runs == []
    assert task.apply((8,)).get() == 8  # another key runs meanwhile


def test_requeue_in_a_worker_publishes_the_same_request_again(
    app: Celery, other: KeyHolder, monkeypatch: pytest.MonkeyPatch
) -> None:
    from celery.canvas import Signature

    sent: list[Signature] = []
    monkeypatch.setattr(Signature, "apply_async", lambda sig, *a, **kw: sent.append(sig))
    task, runs = make(app, bind=True, requeue_delay=0.5)
    assert other.acquire(key_of(task, 7)) is not None
    task_id = uuid.uuid4().hex
    task.push_request(id=task_id, args=(7,), kwargs={}, is_eager=False, called_directly=False)
    try:
        with pytest.raises(Ignore):
            task(7)
    finally:
        task.pop_request()
    assert len(sent) == 1 and sent[0].options["task_id"] == task_id
    assert sent[0].options["countdown"] == 0.5
    assert runs == []


def test_the_key_is_all_arguments_bound_to_the_signature(app: Celery) -> None:
    task, _ = make(app, bind=True)
    assert (
        key_of(task, 1, "tue") == key_of(task, 1, day="tue") == key_of(task, account=1, day="tue")
    )
    assert key_of(task, 1) == key_of(task, 1, "mon")  # defaults count
    assert key_of(task, 1) != key_of(task, 2)
    assert key_of(task, 1).startswith(task.name)


def test_unique_on_names_the_arguments_of_the_key(app: Celery, other: KeyHolder) -> None:
    task, runs = make(app, bind=True, unique_on=["account"], on_busy="skip")
    assert key_of(task, 1, "mon") == key_of(task, 1, "tue") != key_of(task, 2, "mon")
    other.acquire(key_of(task, 1, "mon"))
    assert task.apply((1, "tue")).state == states.IGNORED
    assert runs == []


def test_a_long_key_is_hashed_to_fit() -> None:
    key = singleton_key("t", lambda blob: None, None, ("x" * 1000,), {})
    assert key.startswith("t:sha1:") and len(key) < 100


def test_bad_on_busy_is_refused() -> None:
    with pytest.raises(ConfigurationError):
        singleton_task(on_busy="later")
    app = new_app()
    app.finalize(auto=True)
    with pytest.raises(ConfigurationError):

        @app.task(base=SingletonTask, shared=False, on_busy="wait")
        def typo() -> None:
            pass


def test_a_dead_holders_key_is_taken_over_after_its_delta(
    app: Celery, backend: MemoryBackend, other: KeyHolder
) -> None:
    task, runs = make(app, bind=True, on_busy="raise")
    seen = other.acquire(key_of(task, 7))
    assert seen is not None
    assert backend.kill_liveness(holder_lock_name(seen.incarnation.token))  # it crashed
    started = time.monotonic()
    assert task.apply((7,)).get() == 7
    assert time.monotonic() - started >= DELTA  # waited out the dead holder's trust
    assert runs[0][2] > seen.term
    assert not other.release(seen)  # its term was superseded


def test_a_live_holders_tagged_key_is_not_taken_over(
    app: Celery, backend: MemoryBackend, other: KeyHolder
) -> None:
    task, runs = make(app, bind=True, on_busy="raise")
    seen = other.acquire(key_of(task, 7))
    assert seen is not None and seen.tagged
    assert task.apply((7,)).state == states.FAILURE
    stored = backend.keys.get("unit", key_of(task, 7))  # still the other's, in its term
    assert runs == [] and stored is not None and stored.term == seen.term
    assert stored.token == seen.incarnation.token


def test_trust_of_a_tagged_hold_ends_with_its_sessions_proof(backend: MemoryBackend) -> None:
    clock = FakeClock()
    b = MemoryBackend(clock, liveness=True)
    holder = KeyHolder(b, "unit", ttl=30.0, liveness=1.0, clock=clock)
    try:
        held = holder.acquire("k")
        assert held is not None and held.tagged and holder.trusted(held)
        b.kill_liveness(holder_lock_name(held.incarnation.token))
        clock.advance(1.0 * 11 / 12)  # no good ping since: the proof has lapsed
        assert not holder.trusted(held)
        assert holder.trust_end(held) < held.lease_until  # the lease alone would trust on
    finally:
        holder.close()


def test_a_lapsed_proof_keeps_the_holders_lock_where_silence_does_not_end_it() -> None:
    """A holder's keys end with its session, never with a silence: a starved ping (the
    test kit's, on a loaded machine) untrusts its tagged holds but keeps its lock."""
    clock = FakeClock()
    b = MemoryBackend(clock, liveness=True, silent_holders_lose=False)
    holder = KeyHolder(b, "unit", ttl=30.0, liveness=1.0, clock=clock)
    try:
        held = holder.acquire("k")
        assert held is not None and held.tagged and held.incarnation.live is not None
        clock.advance(5.0)  # the next ping is late: the proof lapsed
        assert clock.settled([held.incarnation.live.sleeper])
        assert not holder.trusted(held)
        assert held.incarnation.live.has_lock and not held.incarnation.lost
    finally:
        holder.close()


def test_trust_of_an_untagged_hold_is_the_lease_less_the_margin() -> None:
    clock = FakeClock()
    b = MemoryBackend(clock)
    holder = KeyHolder(b, "unit", ttl=10.0, safety_margin=2.0, liveness=None, clock=clock)
    try:
        held = holder.acquire("k")
        assert held is not None and not held.tagged
        clock.advance(7.9)
        assert holder.trusted(held)
        clock.advance(0.2)
        assert not holder.trusted(held)
    finally:
        holder.close()


def test_a_hold_won_too_late_to_trust_is_given_back(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock()
    b = MemoryBackend(clock)
    holder = KeyHolder(b, "unit", ttl=10.0, safety_margin=2.0, liveness=None, clock=clock)
    hold = b.keys.hold

    def slow(*args: Any, **kwargs: Any) -> Any:
        result = hold(*args, **kwargs)
        clock.advance(8.5)  # the answer came back after the trust window
        return result

    monkeypatch.setattr(b.keys, "hold", slow)
    try:
        assert holder.acquire("k") is None
        assert b.keys.held("unit") == []
    finally:
        holder.close()


def test_a_hold_is_trusted_by_the_lease_rule_its_proof_bounds_when_tagged() -> None:
    """decisions.trust_end: min(lease, the grant's last proof) tagged, the lease alone not."""
    holder = KeyHolder(MemoryBackend(FakeClock()), "unit", liveness=None)
    try:
        for proof_until, tagged, end in [(5.0, True, 5.0), (50.0, True, 10.0), (5.0, False, 10.0)]:
            session = SimpleNamespace(proof=Proof(1, 0.0, proof_until))
            held = Held("k", 7, 10.0, tagged, session)  # type: ignore[arg-type]
            assert holder.trust_end(held) == end
    finally:
        holder.close()


def test_a_renewal_extends_trust_only_of_the_holds_it_renewed() -> None:
    clock = FakeClock()
    b = MemoryBackend(clock)
    holder = KeyHolder(b, "unit", ttl=10.0, safety_margin=2.0, liveness=None, clock=clock)
    try:
        kept, lost = holder.acquire("kept"), holder.acquire("lost")
        assert kept is not None and lost is not None
        with b.keys._lock:  # "lost" expired in the database (its holder was slow)
            b.keys._rows[("unit", "lost")].expires_at = clock.wall_us()
        clock.advance(5.0)  # past renew_interval: the thread renews (one statement)
        assert clock.settled([holder._sleeper])
        clock.advance(4.0)  # 9 s after the holds began: only a renewal trusts on
        assert holder.trusted(kept)
        assert not holder.trusted(lost)
    finally:
        holder.close()
