"""The Elector on the memory backend with a fake clock: every transition, no sleeps.

Time moves only when a test calls ``clock.advance``; the tests wait (in real time, with a
timeout) for the events the elector announces, never for a duration.
"""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from celery_election import Elector, RevokeReason, State
from celery_election.backends import MemoryBackend
from celery_election.backends.memory import MemorySession
from celery_election.core.clock import FakeClock
from celery_election.core.lease import Bid
from celery_election.election.elector import Subscription, Transition
from celery_election.errors import BackendUnavailableError

from ..support.fake_electors import MARGIN, RENEW, TTL, WAIT, clock, electors, make

__all__ = ["clock", "electors"]  # the fixtures, used by name


@pytest.fixture
def mem(clock: FakeClock) -> MemoryBackend:
    return MemoryBackend(clock)


def next_event(sub: Subscription) -> Transition:
    item = sub.get(timeout=WAIT)
    assert item is not None, "no transition came"
    return item


def test_a_lone_candidate_is_elected_and_renews(
    mem: MemoryBackend, clock: FakeClock, electors: list[Elector]
) -> None:
    e = make(electors, mem, clock)
    sub = e.subscribe()
    assert e.state is State.STOPPED
    e.start()
    ev = next_event(sub)
    assert (ev.kind, ev.term, ev.candidate_id) == ("elected", mem.current("ns").term, "a")
    assert e.is_leader and e.state is State.LEADER and e.term == ev.term
    assert e.leader_id == "a"
    assert e.trusted_for == pytest.approx(TTL - MARGIN)
    # renewals keep it leading far past one ttl, with the same term
    for _ in range(10):
        assert clock.settled(e.sleepers())
        clock.advance(RENEW)
    assert clock.settled(e.sleepers())
    assert e.is_leader and e.term == ev.term
    assert mem.calls["renew"] >= 9
    assert sub.get(timeout=0) is None  # no transition happened


def test_a_second_candidate_follows_and_takes_over_on_clean_stop(
    mem: MemoryBackend, clock: FakeClock, electors: list[Elector]
) -> None:
    a, b = make(electors, mem, clock, "a"), make(electors, mem, clock, "b")
    sa, sb = a.subscribe(), b.subscribe()
    a.start()
    first = next_event(sa)
    b.start()
    assert clock.settled([*a.sleepers(), *b.sleepers()])
    assert not b.is_leader and b.state is State.FOLLOWER and b.leader_id == "a"
    assert not b.wait_for_leadership(timeout=0.01)
    a.stop()
    assert (next_event(sa).kind, sa.get(timeout=0)) == ("revoked", None)
    # the resign wakes b at once: no time passes on the fake clock
    ev = next_event(sb)
    assert ev.kind == "elected" and ev.term > first.term
    assert b.is_leader and not a.is_leader and a.state is State.STOPPED


def test_without_wakeups_a_follower_takes_over_within_one_poll(
    clock: FakeClock, electors: list[Elector]
) -> None:
    mem = MemoryBackend(clock, notify=False)
    a, b = make(electors, mem, clock, "a"), make(electors, mem, clock, "b")
    a.start()
    assert a.wait_for_leadership(WAIT)
    b.start()
    sb = b.subscribe()
    assert clock.settled([*a.sleepers(), *b.sleepers()])
    a.stop()
    assert clock.settled(b.sleepers())  # a's threads are gone; b's two went (back) to sleep
    assert sb.get(timeout=0.05) is None  # asleep until its poll
    clock.advance(1.0)
    assert next_event(sb).kind == "elected"


class Frozen:
    """A view of a backend whose calls hang while frozen: one process's stalled database."""

    def __init__(self, inner: MemoryBackend) -> None:
        self.inner = inner
        self.description = inner.description
        self.gate = threading.Event()
        self.gate.set()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            self.gate.wait()
            return attr(*args, **kwargs)

        return call


def test_crash_failover_waits_for_the_lease_to_end_on_the_database_clock(
    mem: MemoryBackend, clock: FakeClock, electors: list[Elector]
) -> None:
    frozen = Frozen(mem)
    a, b = make(electors, frozen, clock, "a"), make(electors, mem, clock, "b")
    sa, sb = a.subscribe(), b.subscribe()
    a.start()
    elected_a = next_event(sa)
    b.start()
    assert clock.settled([*a.sleepers(), *b.sleepers()])
    frozen.gate.clear()  # a hangs from now on, like a paused or partitioned process
    t0 = clock.monotonic()
    for _ in range(int(TTL - MARGIN) - 1):
        clock.advance(1.0)
        assert clock.settled(
            [a.sleepers()[1], *b.sleepers()]
        )  # a's elector thread is stuck; the other three sleep
    assert a.is_leader and sb.get(timeout=0) is None
    clock.advance(1.0)  # t0 + ttl - margin: a stops trusting its lease
    revoked = next_event(sa)
    assert (revoked.kind, revoked.reason) == ("revoked", RevokeReason.EXPIRED)
    assert not a.is_leader and not b.is_leader
    clock.advance(MARGIN - 0.01)
    assert clock.settled([a.sleepers()[1], *b.sleepers()])
    assert sb.get(timeout=0) is None  # the lease has not ended on the database clock
    clock.advance(0.07)  # past the expiry and the follower's jitter (<= 50 ms)
    elected_b = next_event(sb)
    assert elected_b.kind == "elected" and elected_b.term > elected_a.term
    # no overlap: a stopped believing at least the margin before b started
    assert elected_b.at - revoked.at >= MARGIN - 0.02
    assert revoked.at <= t0 + TTL - MARGIN
    frozen.gate.set()


def elected_alone(
    electors: list[Elector], mem: MemoryBackend, clock: FakeClock
) -> tuple[Elector, Subscription, Transition]:
    """A lone elector that has won, with its subscription and its ``elected``, asleep."""
    e = make(electors, mem, clock)
    sub = e.subscribe()
    e.start()
    elected = next_event(sub)
    assert clock.settled(e.sleepers())
    return e, sub, elected


@contextlib.contextmanager
def stuck_in_renewal(mem: MemoryBackend, clock: FakeClock) -> Iterator[None]:
    """The next renewal is stuck in the "database" for the block."""
    with mem.hold():
        clock.advance(RENEW)
        assert mem.wait_for_blocked(1)
        yield


def test_trust_ends_while_the_renewal_hangs(
    mem: MemoryBackend, clock: FakeClock, electors: list[Elector]
) -> None:
    e, sub, elected = elected_alone(electors, mem, clock)
    with stuck_in_renewal(mem, clock):
        clock.advance(TTL - MARGIN - RENEW - 0.001)
        assert e.is_leader  # still inside the window
        clock.advance(0.002)
        assert not e.is_leader and e.term is None  # no event needed: the property knows
        ev = next_event(sub)  # and the dispatcher announces it though the thread is stuck
        assert (ev.kind, ev.term, ev.reason) == ("revoked", elected.term, RevokeReason.EXPIRED)
    # the stuck renewal then succeeds, too late: the term is given up, a fresh one won
    ev = next_event(sub)
    assert ev.kind == "elected" and ev.term > elected.term
    assert mem.current("ns").term == ev.term


@pytest.mark.parametrize("how", ["resign", "stop"])
def test_resign_and_stop_end_belief_before_the_database_hears_of_it(
    how: str, mem: MemoryBackend, clock: FakeClock, electors: list[Elector]
) -> None:
    """Belief ends when resign() or stop() is called, even with the election thread stuck
    in a renewal: nothing runs as leader while the term is being handed over."""
    e, sub, elected = elected_alone(electors, mem, clock)
    with stuck_in_renewal(mem, clock):
        assert e.is_leader
        stopper = threading.Thread(target=getattr(e, how), kwargs={"timeout": WAIT})
        stopper.start()
        ev = next_event(sub)
        reason = RevokeReason.RESIGNED if how == "resign" else RevokeReason.STOPPED
        assert (ev.kind, ev.term, ev.reason) == ("revoked", elected.term, reason)
        assert not e.is_leader and e.term is None and e.trusted_until is None
        assert mem.calls.get("resign", 0) == 0  # the database has not heard of it yet
    stopper.join(WAIT)
    assert sub.get(timeout=0.05) is None  # announced once


def test_a_win_that_returns_after_its_trust_window_is_not_trusted(
    mem: MemoryBackend, clock: FakeClock, electors: list[Elector]
) -> None:
    e = make(electors, mem, clock, register=False)  # so the first call is the elect
    sub = e.subscribe()
    with mem.hold():
        e.start()
        assert mem.wait_for_blocked(1)
        clock.advance(TTL)  # the elect call "takes" a whole ttl
    ev = next_event(sub)
    # no elected event for the slow term: it was resigned, and a fresh term won instead
    assert ev.kind == "elected"
    assert clock.settled(e.sleepers())
    assert sub.get(timeout=0) is None
    assert mem.calls["resign"] == 1
    assert mem.calls["elect"] == 2
    assert e.term == mem.current("ns").term


def test_renewal_lost_to_a_takeover_revokes(
    mem: MemoryBackend, clock: FakeClock, electors: list[Elector]
) -> None:
    e = make(electors, mem, clock)
    sub = e.subscribe()
    e.start()
    elected = next_event(sub)
    assert clock.settled(e.sleepers())
    mem.expire("ns")
    intruder = mem.elect(Bid("ns", uuid.uuid4().hex, "intruder", TTL))
    assert intruder.won
    clock.advance(RENEW)
    ev = next_event(sub)
    assert (ev.kind, ev.term, ev.reason) == ("revoked", elected.term, RevokeReason.LOST)
    assert e.state is State.FOLLOWER and e.leader_id == "intruder"


def test_database_errors_never_kill_the_thread(
    mem: MemoryBackend, clock: FakeClock, electors: list[Elector]
) -> None:
    errors: list[BaseException] = []
    reported = threading.Condition()

    def on_error(exc: BaseException) -> None:
        with reported:
            errors.append(exc)
            reported.notify_all()

    def wait_for_error(kind: type[BaseException]) -> None:
        with reported:
            seen = reported.wait_for(lambda: any(type(x) is kind for x in errors), WAIT)
        assert seen, f"the elector never met a {kind.__name__}: {errors!r}"

    e = make(electors, mem, clock, on_error=on_error)
    sub = e.subscribe()
    mem.fail(BackendUnavailableError("database down"))
    e.start()
    wait_for_error(BackendUnavailableError)
    for _ in range(5):
        assert clock.settled(e.sleepers())
        clock.advance(2.0)
    assert clock.settled(e.sleepers())
    assert not e.is_leader and e.state is State.FOLLOWER
    # an error of no expected type (a bug in a driver) takes the same path: the thread
    # meets it (on_error says so), survives it, and goes back to sleep until its retry
    mem.fail(RuntimeError("a bug in a driver"))
    clock.advance(5.0)
    wait_for_error(RuntimeError)
    assert clock.settled(e.sleepers()), "the election thread did not survive the RuntimeError"
    assert e._thread is not None and e._thread.is_alive()
    mem.fail(None)
    clock.advance(5.0)
    assert next_event(sub).kind == "elected"
    assert {type(x) for x in errors} == {BackendUnavailableError, RuntimeError}
    # its registration failed with the rest: tried again within a poll, not a heartbeat
    assert clock.settled(e.sleepers())
    assert [c.candidate_id for c in mem.candidates("ns")] == ["a"]
    # and a leader whose database goes away steps down when its trust ends
    assert clock.settled(e.sleepers())
    mem.fail(BackendUnavailableError("database down again"))
    for _ in range(8):
        clock.advance(1.0)
        assert clock.settled(e.sleepers())
    ev = next_event(sub)
    assert (ev.kind, ev.reason) == ("revoked", RevokeReason.EXPIRED)
    assert e._thread is not None and e._thread.is_alive()


def test_resign_hands_over_and_stays_out_for_the_backoff(
    mem: MemoryBackend, clock: FakeClock, electors: list[Elector]
) -> None:
    a = make(electors, mem, clock, "a", resign_backoff=20.0)
    b = make(electors, mem, clock, "b")
    sa = a.subscribe()
    a.start()
    first = next_event(sa)
    b.start()
    sb = b.subscribe()
    assert a.resign()
    ev = next_event(sa)
    assert (ev.kind, ev.reason) == ("revoked", RevokeReason.RESIGNED)
    assert next_event(sb).kind == "elected"
    assert not mem.current("ns").held_by(a._token)
    assert not a.resign()  # not leading: nothing to do
    b.stop()
    clock.advance(5.0)  # a is still backing off
    assert clock.settled(a.sleepers())
    assert sa.get(timeout=0.05) is None
    clock.advance(16.0)
    ev = next_event(sa)
    assert ev.kind == "elected" and ev.term > first.term


def test_stop_resigns_and_unregisters(
    mem: MemoryBackend, clock: FakeClock, electors: list[Elector]
) -> None:
    e = make(electors, mem, clock)
    e.start()
    assert e.wait_for_leadership(WAIT)
    assert [c.candidate_id for c in mem.candidates("ns")] == ["a"]
    sub = e.subscribe()
    e.stop()
    ev = next_event(sub)
    assert (ev.kind, ev.reason) == ("revoked", RevokeReason.STOPPED)
    assert not mem.current("ns").held
    assert mem.candidates("ns") == []
    assert sub.get(timeout=0.01) is None and sub.closed
    e.stop()  # idempotent


def test_subscriptions_are_ordered_and_a_slow_consumer_blocks_nothing(
    mem: MemoryBackend, clock: FakeClock, electors: list[Elector]
) -> None:
    release = threading.Event()
    e = make(electors, mem, clock, on_elected=lambda term: release.wait(WAIT))
    slow = e.subscribe()  # never read until the end
    e.start()
    assert e.wait_for_leadership(WAIT)
    # the callback is blocked, yet the elector keeps renewing and can resign and re-win
    for _ in range(3):
        assert clock.settled(e.sleepers()[:1])
        clock.advance(RENEW)
    assert clock.settled(e.sleepers()[:1])
    assert mem.calls["renew"] >= 3 and e.is_leader
    e.resign(wait=True)
    clock.advance(TTL)
    assert e.wait_for_leadership(WAIT)
    release.set()
    events = [next_event(slow) for _ in range(3)]
    assert [ev.kind for ev in events] == ["elected", "revoked", "elected"]
    assert events[0].term == events[1].term < events[2].term
    assert events[1].reason is RevokeReason.RESIGNED


def test_two_electors_with_one_candidate_id_never_both_lead(
    mem: MemoryBackend, clock: FakeClock, electors: list[Elector]
) -> None:
    a = make(electors, mem, clock, "same")
    b = make(electors, mem, clock, "same")
    a.start()
    b.start()
    assert a.wait_for_leadership(WAIT) or b.wait_for_leadership(WAIT)
    for _ in range(6):
        clock.advance(RENEW)
        assert clock.settled([*a.sleepers(), *b.sleepers()])
        assert a.is_leader != b.is_leader
    assert a._token != b._token


def test_a_failing_callback_does_not_stop_the_election(
    mem: MemoryBackend, clock: FakeClock, electors: list[Elector]
) -> None:
    raised: list[int] = []

    def boom(term: int) -> None:
        raised.append(term)
        raise ValueError("user callback bug")

    e = make(electors, mem, clock, on_elected=boom, resign_backoff=1.0)
    sub = e.subscribe()
    e.start()
    elected = next_event(sub)
    assert elected.kind == "elected"
    assert raised == [elected.term]  # callbacks run before subscriptions get the event
    first_window = e.trusted_until
    assert first_window is not None
    renewals = mem.calls.get("renew", 0)
    # four renew intervals: well past the trust the election won (ttl - margin = 8 s)
    for _ in range(4):
        assert clock.settled(e.sleepers())
        clock.advance(RENEW)
    assert clock.settled(e.sleepers())
    assert clock.monotonic() > first_window
    assert e.is_leader and e.term == elected.term  # trusted only because renewals went on
    assert mem.calls["renew"] - renewals == 4
    assert mem.current("ns").term == elected.term
    assert sub.get(timeout=0) is None
    # the event thread goes on too: a resign is announced, and the next win runs it again
    assert e.resign(wait=True)
    revoked = next_event(sub)
    assert (revoked.kind, revoked.reason) == ("revoked", RevokeReason.RESIGNED)
    assert clock.settled(e.sleepers())
    clock.advance(1.0)  # the resign backoff
    again = next_event(sub)
    assert again.kind == "elected" and again.term > elected.term
    assert raised == [elected.term, again.term]


def test_context_manager_and_restart_draw_a_new_token(mem: MemoryBackend, clock: FakeClock) -> None:
    e = Elector(mem, "ns", "a", clock=clock, ttl=TTL, jitter=0)
    with e:
        assert e.wait_for_leadership(WAIT)
        first_token = e._token
    assert not e.is_leader and not mem.current("ns").held
    with e:
        assert e.wait_for_leadership(WAIT)
        assert e._token != first_token


def test_an_unreachable_database_is_logged_again_every_minute_until_it_answers(
    mem: MemoryBackend,
    clock: FakeClock,
    electors: list[Elector],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """One ERROR line at start was easy to miss while a worker ran with nobody leading."""
    caplog.set_level("INFO", logger="celery_election.election.elector")
    e = make(electors, mem, clock)
    sub = e.subscribe()
    mem.fail(BackendUnavailableError("database down"))
    e.start()
    for _ in range(65):  # 130 s of fake time, failing all along
        assert clock.settled(e.sleepers())
        clock.advance(2.0)
    mem.fail(None)
    clock.advance(5.0)
    assert next_event(sub).kind == "elected"  # delivered after every earlier error
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 3, errors  # at once, after a minute, after two
    assert "cannot lead until it answers (failing for 0s" in errors[0]
    assert "memory://" in errors[0]  # where: the backend, password masked for SQL URLs
    assert "failing for 6" in errors[1] and "failing for 12" in errors[2]
    assert any("reachable again" in r.getMessage() for r in caplog.records)


def test_each_leadership_change_is_one_searchable_log_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level("INFO", logger="celery_election.election.elector")
    e = Elector(MemoryBackend(), "jobs", candidate_id="w1", ttl=2)
    sub = e.subscribe()
    try:
        e.start()
        assert e.wait_for_leadership(5)
        term = e.term
        assert e.resign()
        kinds = [t.kind for t in (sub.get(5), sub.get(5)) if t is not None]
        assert kinds == ["elected", "revoked"]  # logged before they were delivered here
    finally:
        e.stop()
    lines = [r.getMessage() for r in caplog.records]
    assert f"election leader elected namespace=jobs term={term} candidate=w1 reason=won" in lines
    assert (
        f"election leader revoked namespace=jobs term={term} candidate=w1 reason=resigned" in lines
    )


class Counted:
    """A view of a backend that notes each look and heartbeat (fake time) and slot try."""

    def __init__(self, inner: MemoryBackend, clock: FakeClock) -> None:
        self.inner, self.clock = inner, clock
        self.description = inner.description
        self.looks: list[float] = []
        self.heartbeats: list[float] = []
        self.slot_tries: list[float] = []

    def current(self, *args: Any, **kwargs: Any) -> Any:
        self.looks.append(self.clock.monotonic())
        return self.inner.current(*args, **kwargs)

    def register(self, *args: Any, **kwargs: Any) -> Any:
        self.heartbeats.append(self.clock.monotonic())
        return self.inner.register(*args, **kwargs)

    def liveness_session(self, namespace: str, delta: float, max_wait: float) -> Any:
        session = self.inner.liveness_session(namespace, delta, max_wait)
        assert session is not None
        claim, tries = session.claim_slot, self.slot_tries

        def claim_slot(count: int) -> bool:
            tries.append(self.clock.monotonic())
            return claim(count)

        session.claim_slot = claim_slot  # type: ignore[method-assign]
        return session

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_waiting_followers_read_the_lease_heartbeat_and_try_for_a_slot_once_per_fallback(
    clock: FakeClock, electors: list[Elector]
) -> None:
    """A hot standby waits on the server's lock: it reads the lease once per fallback,
    its heartbeat on the same turn (one connection); a cold one tries for a slot as
    often. The leader is a row tagged with the lock, renewed every 3 s (a 10 s lease), and
    a session holding that lock that never goes silent."""
    backend = MemoryBackend(clock, liveness=True)
    won = backend.elect(Bid("ns", "t" * 32, "leader", TTL, liveness=1.0))
    assert won.won and won.lease is not None
    holder = MemorySession(backend._locks, "ns", 1e6, clock)
    assert holder.acquire(1.0)
    timings: dict[str, Any] = dict(liveness=1.0, standbys=1, fallback_interval=60.0, jitter=0.1)
    hot_view, cold_view = Counted(backend, clock), Counted(backend, clock)
    hot = make(electors, hot_view, clock, "hot", **timings).start()
    # the lock threads act in real time: wait for the slot taken, then for the cold miss
    assert _settle_until(clock, hot, lambda: len(backend._locks.slots) == 1)
    cold = make(electors, cold_view, clock, "cold", **timings).start()
    assert _settle_until(clock, cold, lambda: cold.liveness == "standby" and cold_view.slot_tries)
    start = clock.monotonic()
    assert cold._live is not None
    cold_lock_thread = cold._live.sleeper  # a cold lock thread only sleeps between tries
    for second in range(600):
        if second % 3 == 0:
            assert backend.renew("ns", "t" * 32, won.lease.term, TTL, liveness=1.0).won
        clock.advance(1.0)
        assert clock.settled([*hot.sleepers(), *cold.sleepers(), cold_lock_thread])
    assert hot.liveness == "waiting" and cold.liveness == "standby" and not hot.is_leader

    def during(times: list[float]) -> list[float]:
        return [t for t in times if t > start]

    # 600 s at 60 s +-10 %: 9 to 11 each (before: a look per lease and a heartbeat every
    # 20 s, a slot try per ttl: 60, 30 and 60)
    for times in (hot_view.looks, hot_view.heartbeats, cold_view.slot_tries):
        assert 9 <= len(during(times)) <= 11, times
    assert during(hot_view.heartbeats) == during(hot_view.looks)  # together, each time
    holder.close()


def _settle_until(clock: FakeClock, e: Elector, condition: Any) -> bool:
    """Step fake time (0.05 s, at most 10 s) until ``condition``; real time for threads
    that are not the elector's named sleepers (the lock thread) to catch up."""
    for _ in range(200):
        if condition():
            return True
        clock.advance(0.05)
        clock.settled(e.sleepers())
        threading.Event().wait(0.005)
    return bool(condition())


def test_the_watchers_know_a_trust_window_before_anyone_hears_of_it(
    mem: MemoryBackend, clock: FakeClock, electors: list[Elector]
) -> None:
    """A process killed as soon as it says it leads (the three-elector example) must have
    its window on record: the trust watchers run before the announcement, at both ends."""
    watched: list[int | None] = []
    heard: list[tuple[str, list[int | None]]] = []

    def slow_watcher(term: int | None, until: float | None) -> None:
        threading.Event().wait(0.2)  # a slow disk: the dispatcher would overtake it
        watched.append(term)

    e = make(
        electors, mem, clock,
        on_elected=lambda term: heard.append(("elected", list(watched))),
        on_revoked=lambda term, why: heard.append(("revoked", list(watched))),
    )  # fmt: skip
    e.watch_trust(slow_watcher)
    sub = e.subscribe()
    e.start()
    term = next_event(sub).term
    e.resign()
    assert next_event(sub).kind == "revoked"
    assert heard == [("elected", [term]), ("revoked", [term, None])]


def test_elector_options_are_the_electors_keyword_arguments() -> None:
    """AsyncElector takes ``**options: Unpack[ElectorOptions]``: the TypedDict must name
    exactly the Elector's keyword-only arguments and the timings (ElectionConfig's fields)."""
    import dataclasses
    import inspect

    from celery_election.core.config import ElectionConfig
    from celery_election.election.aio import AsyncElector
    from celery_election.election.elector import ElectorOptions

    params = inspect.signature(Elector.__init__).parameters.values()
    keywords = {p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY}
    timings = {f.name for f in dataclasses.fields(ElectionConfig)}
    assert set(ElectorOptions.__optional_keys__) == keywords | timings
    assert not ElectorOptions.__required_keys__
    positional = [p.name for p in params if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
    async_params = inspect.signature(AsyncElector.__init__).parameters.values()
    assert [p.name for p in async_params if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD] == (
        positional
    )


def test_candidate_ids_read_role_node_pid_and_a_random_tag() -> None:
    import os
    import socket

    from celery_election.core.identity import new_candidate_id

    host, pid = socket.gethostname(), os.getpid()
    first, second = new_candidate_id(), new_candidate_id()
    assert first.rsplit(":", 1)[0] == f"{host}:{pid}" and first != second
    assert new_candidate_id("w1@box").startswith(f"w1@box:{pid}:")
    assert new_candidate_id(role="beat").startswith(f"beat@{host}:{pid}:")
    assert len(new_candidate_id().rsplit(":", 1)[1]) == 8
    assert Elector(MemoryBackend()).candidate_id.startswith(f"{host}:{pid}:")
