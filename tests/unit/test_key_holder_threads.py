"""A key holder shared by a worker's threads (or greenlets): its session, its renewals.

Found in real workers on MariaDB (tests/e2e/test_singleton_workers.py): tasks probing
another holder's session and the holder's own pings on one PyMySQL connection broke its
protocol ("Packet sequence number wrong", a task lost to BackendUnavailableError), and a
renewal waiting on row locks held up the pings until the server ended the session.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery, states

from celery_election.backends import MemoryBackend
from celery_election.election.holder import KeyHolder
from celery_election.errors import BackendUnavailableError
from celery_election.keys.singleton import set_key_holder, singleton_task

from ..support.apps import new_app


class Overlaps:
    """Wraps a session: every call takes a while and counts calls that overlapped it."""

    def __init__(self, session: Any) -> None:
        self.session, self.inside, self.overlaps, self.calls = session, 0, 0, 0
        self.lock = threading.Lock()

    def _enter(self) -> None:
        with self.lock:
            self.inside += 1
            self.calls += 1
            self.overlaps += self.inside > 1
        time.sleep(0.005)
        with self.lock:
            self.inside -= 1

    def ping(self) -> None:
        self._enter()
        self.session.ping()

    def ended(self, key: bytes) -> bool:
        self._enter()
        return bool(self.session.ended(key))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.session, name)


def test_probes_and_pings_never_share_the_session_at_once() -> None:
    # silence never ends a session here: a ping thread starved under load lost "mine"'s,
    # and its probes then stopped asking it (70 calls of the 100 the probes make)
    backend = MemoryBackend(liveness=True, silent_holders_lose=False)
    mine = KeyHolder(backend, "t", liveness=0.4, holder_id="mine")
    other = KeyHolder(backend, "t", liveness=0.4, holder_id="other")
    try:
        assert other.acquire("k") is not None  # alive: every probe finds it so
        assert mine.acquire("x") is not None  # our session, pinged every 0.1 s
        inc = mine._current
        assert inc is not None and inc.live is not None  # its lock thread pings the session
        spy = inc.live.session = Overlaps(inc.live.session)  # type: ignore[assignment]

        def probe() -> None:
            for _ in range(25):
                assert mine.acquire("k") is None

        threads = [threading.Thread(target=probe) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert spy.calls >= 100 and spy.overlaps == 0, (spy.calls, spy.overlaps)
    finally:
        mine.close()
        other.close()


def test_pings_go_on_while_a_renewal_waits() -> None:
    backend = MemoryBackend(liveness=True)
    holder = KeyHolder(backend, "t", ttl=0.6, safety_margin=0.15, liveness=0.1)
    release = threading.Event()
    renew = backend.keys.renew

    def stuck(*args: Any, **kwargs: Any) -> Any:
        release.wait(5)  # a renewal waiting on row locks
        return renew(*args, **kwargs)

    backend.keys.renew = stuck  # type: ignore[method-assign]
    try:
        held = holder.acquire("k")
        assert held is not None
        proof = held.incarnation.proof.good_until
        deadline = time.monotonic() + 5
        while held.incarnation.proof.good_until <= proof + 0.3:  # pings extend the proof
            assert time.monotonic() < deadline, "no ping while the renewal waited"
            time.sleep(0.01)
        assert not held.incarnation.lost
    finally:
        release.set()
        holder.close()


@pytest.fixture
def app() -> Iterator[Celery]:
    app = new_app(task_always_eager=False)
    backend = MemoryBackend(liveness=True)
    holder = KeyHolder(backend, "t", liveness=0.2, holder_id="me")
    set_key_holder(app, holder)
    try:
        yield app
    finally:
        set_key_holder(app, None)


@pytest.mark.parametrize("mode", ["skip", "requeue", "raise"])
def test_an_unreachable_database_is_busy_never_a_lost_task(
    app: Celery, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from celery_election.keys.singleton import key_holder

    def down(*args: Any, **kwargs: Any) -> Any:
        raise BackendUnavailableError("the database is down")

    monkeypatch.setattr(key_holder(app), "acquire", down)
    runs: list[int] = []

    @singleton_task(app=app, name=f"t.down_{mode}", on_busy=mode, requeue_delay=0, max_retries=0)
    def task(n: int) -> int:
        runs.append(n)
        return n

    result = task.apply((1,))
    assert runs == []
    if mode == "skip":
        assert result.state == states.IGNORED
    elif mode == "requeue":  # eagerly a retry; in a worker the same request sent again
        assert result.state in {states.RETRY, states.FAILURE}
        assert not isinstance(result.result, BackendUnavailableError)
    else:
        assert result.state == states.FAILURE
        assert isinstance(result.result, BackendUnavailableError)
