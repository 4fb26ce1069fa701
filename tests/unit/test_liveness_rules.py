"""The liveness rules on the in-process backend (real time, short timings).

The same rules run against the real servers in tests/integration/test_liveness.py; here
faults that a server cannot be made to show on demand: a lock wait that hangs on a dead
link, and a leader whose lease calls hang while its lock session stays healthy.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from celery_election import Elector
from celery_election.backends import MemoryBackend
from celery_election.backends.memory import MemorySession
from celery_election.errors import BackendUnavailableError
from celery_election.history import Recorder
from harness.checker import check, load

TTL = 2.0  # liveness delta 0.375 s by default


class Freezable:
    """A backend view whose lease calls hang while frozen; its lock session is untouched."""

    def __init__(self, inner: MemoryBackend) -> None:
        self.inner = inner
        self.description = inner.description
        self.open = threading.Event()
        self.open.set()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if name in ("liveness_session", "subscribe_wakeups") or not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            self.open.wait()
            return attr(*args, **kwargs)

        return call


class LockView:
    """A view of a backend whose liveness sessions are ``session_class`` (a test's fault);
    everything else is the inner backend's."""

    def __init__(self, inner: MemoryBackend) -> None:
        self.inner = inner
        self.description = inner.description

    def session_class(self) -> type[MemorySession]:
        raise NotImplementedError

    def liveness_session(self, namespace: str, delta: float, max_wait: float) -> MemorySession:
        return self.session_class()(self.inner._locks, namespace, delta, self.inner.clock)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class HungLocks(LockView):
    """A backend view whose lock waits never return a grant: a wait on a link that died.

    ``silent_holders_lose``: whether the lock is a server's, which takes the lock from a
    paused holder (a follower then reads the lease once per fallback_interval), or a
    file lock, which a stopped process keeps (a follower reads it whenever it would end).
    """

    def __init__(self, inner: MemoryBackend, *, silent_holders_lose: bool) -> None:
        super().__init__(inner)
        self.silent_holders_lose = silent_holders_lose

    def session_class(self) -> type[MemorySession]:
        lose = self.silent_holders_lose

        class Hung(MemorySession):
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, **kwargs)
                self.silent_holders_lose = lose

            def acquire(self, timeout: float) -> bool:
                threading.Event().wait(timeout)
                return False

        return Hung


class FailingLocks(LockView):
    """A backend view whose lock waits fail at once once ``down`` is set (a dead link)."""

    def __init__(self, inner: MemoryBackend) -> None:
        super().__init__(inner)
        self.down = threading.Event()

    def session_class(self) -> type[MemorySession]:
        down = self.down

        class Failing(MemorySession):
            def acquire(self, timeout: float) -> bool:
                if down.is_set():
                    raise BackendUnavailableError("liveness session lost: link down")
                end = threading.Event()
                while not down.is_set() and not end.wait(0.01):
                    if super().acquire(0.01):
                        return True
                raise BackendUnavailableError("liveness session lost: link down")

        return Failing


class SlowFirstPing(LockView):
    """A backend view whose session's next ping, once ``slow`` is set, outlasts its proof.

    The server is busy with that ping (the session is not silent and stays the holder)
    and answers late, so the proof it makes has lapsed when it comes back.
    """

    def __init__(self, inner: MemoryBackend) -> None:
        super().__init__(inner)
        self.slow = threading.Event()

    def session_class(self) -> type[MemorySession]:
        slow = self.slow

        class Slow(MemorySession):
            def ping(self) -> None:
                super().ping()
                if slow.is_set():
                    slow.clear()
                    end, tick = time.monotonic() + 2 * self.delta, threading.Event()
                    while time.monotonic() < end:  # a statement in progress: not silent
                        self.last_seen = self._clock.monotonic()
                        tick.wait(0.01)

        return Slow


@pytest.fixture
def world(tmp_path: Path) -> Iterator[tuple[MemoryBackend, Callable[..., Elector], Path]]:
    backend = MemoryBackend(liveness=True)
    history = tmp_path / "history.jsonl"
    electors: list[Elector] = []

    def make(view: Any, name: str, **timings: float) -> Elector:
        e = Elector(view, "ns", candidate_id=name, ttl=TTL, **timings)
        Recorder(history, role=name).attach(e)
        electors.append(e)
        return e.start()

    yield backend, make, history
    for e in electors:
        e.stop()


def wait(condition: Callable[[], bool], timeout: float) -> bool:
    done = threading.Event()
    end = threading.Timer(timeout, done.set)
    end.start()
    try:
        while not condition():
            if done.wait(0.01):
                return condition()
        return True
    finally:
        end.cancel()


@pytest.mark.parametrize(
    ("silent_holders_lose", "fallback"),
    [(False, 60.0), (True, 3.0)],
    ids=["file-lock: the lease end", "server-lock: the fallback look"],
)
def test_a_follower_whose_lock_wait_hangs_still_takes_over_when_the_lease_ends(
    world: tuple[MemoryBackend, Callable[..., Elector], Path],
    silent_holders_lose: bool,
    fallback: float,
) -> None:
    backend, make, history = world
    leader_view = Freezable(backend)
    leader = make(leader_view, "leader")
    assert leader.wait_for_leadership(5)
    assert wait(lambda: leader.liveness == "holding", 5)
    hung = HungLocks(backend, silent_holders_lose=silent_holders_lose)
    follower = make(hung, "follower", fallback_interval=fallback)
    assert wait(lambda: follower.liveness == "waiting", 5)
    leader_view.open.clear()  # its renewals hang: its trust ends with its lease
    try:
        # The follower's lock wait never returns (a fallback-long bound): the lease must
        # hand over, when it ends (a file lock) or at the next fallback look (a server's).
        assert follower.wait_for_leadership(4 * TTL), "waited on a dead lock, not the lease"
        assert backend.current("ns").liveness_us is None  # won on the lease, not the lock
    finally:
        leader_view.open.set()
    report = check(load([history]))
    assert report.violations == [] and report.overlap_seconds == 0


def test_a_follower_whose_lock_waits_fail_reads_the_lease_whenever_it_would_end(
    world: tuple[MemoryBackend, Callable[..., Elector], Path],
) -> None:
    """A waiting follower reads the lease only once per fallback (60 s) while its waits go
    well: the grant is its wake-up. Once they fail it is no wake-up, so the follower
    reads the lease whenever it would end again, and takes over when it does."""
    backend, make, history = world
    leader_view = Freezable(backend)
    leader = make(leader_view, "leader")
    assert leader.wait_for_leadership(5)
    assert wait(lambda: backend.current("ns").liveness_us is not None, 5)
    view = FailingLocks(backend)
    follower = make(view, "follower")
    assert wait(lambda: follower.liveness == "waiting", 5)
    view.down.set()  # its lock waits fail from now on
    assert follower._live is not None
    assert wait(lambda: not follower._live.waits_well, 5)
    leader_view.open.clear()  # the leader's renewals hang: its lease runs out
    try:
        assert follower.wait_for_leadership(4 * TTL), "slept on a failing lock (fallback: 60 s)"
    finally:
        leader_view.open.set()
    report = check(load([history]))
    assert report.violations == [] and report.overlap_seconds == 0


def test_a_grant_whose_proof_lapsed_is_given_back_and_taken_anew(
    world: tuple[MemoryBackend, Callable[..., Elector], Path],
) -> None:
    """A follower granted the lock whose first ping outlasts its proof may not take over
    on that grant (another may have had the lock), and a lapsed proof is never extended:
    the lock thread lets it go and is granted again, so the dead leader is replaced
    through the lock, delta after the fresh grant, not a minute later."""
    backend, make, history = world
    leader_view = Freezable(backend)
    leader = make(leader_view, "leader")
    assert leader.wait_for_leadership(5)
    assert wait(lambda: backend.current("ns").liveness_us is not None, 5)
    view = SlowFirstPing(backend)
    follower = make(view, "follower")
    assert wait(lambda: follower.liveness == "waiting", 5)
    old = backend.current("ns")
    view.slow.set()
    leader_view.open.clear()  # the leader dies: its lease calls hang, its session ends
    assert backend.kill_liveness("ns")
    try:
        assert follower.wait_for_leadership(4 * TTL), "held a lapsed grant (fallback: 60 s)"
        new = backend.current("ns")
        assert new.liveness_us is not None and new.term > old.term  # through the lock
        assert not view.slow.is_set()  # the slow ping happened
    finally:
        leader_view.open.set()
    report = check(load([history]))
    assert report.violations == [] and report.overlap_seconds == 0


def test_a_leader_whose_lease_calls_hang_lets_go_of_the_lock_for_a_follower(
    world: tuple[MemoryBackend, Callable[..., Elector], Path],
) -> None:
    """Its belief ends with its lease trust; the lock (still pinged) must be released then,
    so the follower takes over through the lock, before the lease has expired."""
    backend, make, history = world
    leader_view = Freezable(backend)
    leader = make(leader_view, "leader")
    assert leader.wait_for_leadership(5)
    assert wait(lambda: backend.current("ns").liveness_us is not None, 5)
    follower = make(backend, "follower")
    assert wait(lambda: follower.liveness == "waiting", 5)
    leader_view.open.clear()
    old = backend.current("ns")  # its last renewal: no more come
    try:
        assert follower.wait_for_leadership(4 * TTL)
        new = backend.current("ns")
        assert new.term > old.term and new.liveness_us is not None  # through the lock,
        assert new.acquired_at_us < old.expires_at_us  # before the lease could expire
    finally:
        leader_view.open.set()
    report = check(load([history]))
    assert report.violations == [] and report.overlap_seconds == 0


def test_interrupting_a_connection_that_is_already_gone_is_quiet() -> None:
    """Closing a liveness session whose socket the server already dropped (ENOTCONN) must
    not raise: it ran in the election thread's shutdown, which then died (found by CI)."""
    import socket
    import types

    from celery_election.backends.connection import interrupt

    never_connected = socket.socket()  # shutdown() on it raises ENOTCONN
    try:
        with pytest.raises(OSError):
            never_connected.shutdown(socket.SHUT_RDWR)
        interrupt(
            types.SimpleNamespace(pgconn=types.SimpleNamespace(socket=never_connected.fileno()))
        )
    finally:
        never_connected.close()


def test_interrupting_a_sqlite3_statement_ends_it_at_once() -> None:
    """sqlite3 has no socket to shut: ``interrupt`` calls its own ``interrupt()``, and a
    statement running in another thread fails (the path a stop() of a follower takes on
    SQLite; before this test only a race in the liveness suites reached it)."""
    import sqlite3
    import threading

    from celery_election.backends.connection import interrupt

    conn = sqlite3.connect(":memory:", check_same_thread=False)
    started, failed = threading.Event(), []
    endless = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) SELECT max(i) FROM n"

    def progress() -> int:
        started.set()  # the statement runs
        return 0  # go on

    def run() -> None:
        conn.set_progress_handler(progress, 1000)
        try:
            conn.execute(endless).fetchall()
        except sqlite3.OperationalError as exc:
            failed.append(str(exc))

    # a daemon, ended in any case: an interrupt that failed left the process running for
    # ever after the test (the mutation run waited 30 minutes on it)
    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    try:
        assert started.wait(10)
        interrupt(conn)
        worker.join(10)
        assert not worker.is_alive() and failed == ["interrupted"]
    finally:
        conn.interrupt()
        worker.join(10)
        conn.close()


def test_a_grant_that_arrives_after_the_lock_was_given_up_is_released() -> None:
    """``want(False)`` while the lock wait is blocked: the interrupt may lose the race with
    the grant. A grant that arrives when the lock is no longer wanted is let go at once,
    and nobody is told it was granted (before this test only a race reached it)."""
    from celery_election.core.clock import RealClock
    from celery_election.core.decisions import LockNews
    from celery_election.election.lock_thread import LockThread

    backend = MemoryBackend(liveness=True)
    waiting, gate, released = threading.Event(), threading.Event(), threading.Event()

    class GrantOnItsWay(MemorySession):
        def acquire(self, timeout: float) -> bool:
            waiting.set()
            gate.wait(10)  # the grant is on its way; an interrupt does not stop it
            return super().acquire(timeout)

        def interrupt(self) -> None:
            pass

        def release(self) -> None:
            if self.has_lock:
                released.set()
            super().release()

    session = GrantOnItsWay(backend._locks, "ns", 0.5, backend.clock)
    news: list[LockNews] = []
    thread = LockThread(session, 0.5, 5.0, RealClock(), news.append, "lock-test")
    try:
        thread.want(True)
        assert waiting.wait(5)
        thread.want(False)  # asked to let go while the grant is on its way
        gate.set()
        assert released.wait(5)
        assert LockNews.GRANTED not in news and not thread.has_lock
    finally:
        thread.close()


class Gated(Freezable):
    """Freezable, and its lock is not even asked for until ``gate`` is set."""

    def __init__(self, inner: MemoryBackend) -> None:
        super().__init__(inner)
        self.gate = threading.Event()

    def liveness_session(self, namespace: str, delta: float, max_wait: float) -> MemorySession:
        gate = self.gate

        class Late(MemorySession):
            def acquire(self, timeout: float) -> bool:
                gate.wait()
                return super().acquire(timeout)

        return Late(self.inner._locks, namespace, delta, self.inner.clock)


def test_a_follower_that_read_an_untagged_term_waits_on_the_lock_once_it_is_tagged(
    tmp_path: Path,
) -> None:
    """Every term starts untagged; the renew after the grant tags it and wakes followers
    ("renewed"). A follower that had read the untagged term took that wakeup as "nothing
    to see for a lease length" and waited on the lease: a crash soon after a change of
    leader then took the whole lease, not delta. Here the leader's lock is granted only
    after the follower has read its untagged term; then the leader's calls hang. The
    follower must take over through the lock, before the lease could have expired."""
    backend = MemoryBackend(liveness=True)
    history = tmp_path / "history.jsonl"
    view = Gated(backend)
    timings: dict[str, Any] = {"ttl": 4.0, "safety_margin": 2.0}  # delta 0.5 s
    leader = Elector(view, "ns", candidate_id="leader", **timings)
    follower = Elector(backend, "ns", candidate_id="follower", **timings)
    for e in (leader, follower):
        Recorder(history, role=e.candidate_id).attach(e)
    try:
        assert leader.start().wait_for_leadership(5)
        follower.start()
        assert wait(lambda: follower.last_lease is not None, 5)
        assert follower.last_lease.liveness_us is None  # it read the untagged term
        view.gate.set()
        assert wait(lambda: backend.current("ns").liveness_us is not None, 5)
        old = backend.current("ns")
        view.open.clear()  # the leader's calls hang from now on
        assert follower.wait_for_leadership(3 * timings["ttl"])
        new = backend.current("ns")
        assert new.term > old.term
        assert new.acquired_at_us < old.expires_at_us  # through the lock, not the lease
    finally:
        view.open.set()
        follower.stop()
        leader.stop()
    report = check(load([history]))
    assert report.violations == [] and report.overlap_seconds == 0


def test_a_leader_that_dies_right_after_its_election_is_replaced_through_the_lock(
    world: tuple[MemoryBackend, Callable[..., Elector], Path],
) -> None:
    """The lock comes before the election: the term is tagged by the statement that wins
    it, so a leader that dies before its first renewal is replaced delta after its death,
    not when its lease ends (4.99 s in a chaos run when the tag came with a later renew)."""
    backend, make, history = world
    leader_view = Freezable(backend)
    leader = make(leader_view, "leader")
    assert leader.wait_for_leadership(5)
    first = backend.current("ns")
    assert first.liveness_us is not None  # tagged by the elect itself:
    assert first.renewed_at_us in (None, first.acquired_at_us)  # no renewal yet
    follower = make(backend, "follower")
    assert wait(lambda: follower.liveness == "waiting", 5)
    # The leader dies: its calls hang for good and the server ends its lock session.
    leader_view.open.clear()
    live = leader._live
    assert live is not None
    live.session.release()
    try:
        assert follower.wait_for_leadership(4 * TTL)
        new = backend.current("ns")
        assert new.term > first.term and new.liveness_us is not None
        assert new.acquired_at_us < first.expires_at_us  # through the lock, not the lease
    finally:
        leader_view.open.set()
    report = check(load([history]))
    assert report.violations == [] and report.overlap_seconds == 0
