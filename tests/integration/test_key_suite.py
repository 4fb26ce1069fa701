"""What only keys have, on every backend: memory, SQLite, PostgreSQL, MariaDB.

The hold's steps themselves (take, extend, release, take over, each WHERE condition) are
test_hold_suite.py's, run over the lease and a key alike. Here: keys apart by exact
bytes, one renewal for all of a token's keys, an operator's release, bad keys, and the
holder lock's probe (``KeySession.ended``) on each real server.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from celery_election.core.lease import Bid
from celery_election.errors import ConfigurationError

from ..conftest import ALL_KINDS, expire, make_backend, token

NS = "keys"


@pytest.fixture(params=ALL_KINDS)
def backend(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[Any]:
    yield from make_backend(request.param, tmp_path)


def test_keys_are_independent_and_exact(backend: Any) -> None:
    keys, a, b = backend.keys, token(), token()
    assert keys.hold(Bid(NS, a, "a", 30.0, key="k")).won
    assert keys.hold(Bid(NS, b, "b", 30.0, key="k2")).won
    assert keys.hold(Bid(NS, b, "b", 30.0, key="K")).won  # case matters (utf8mb4_bin)
    assert keys.hold(Bid("other", b, "b", 30.0, key="k")).won


def test_renew_extends_only_the_tokens_unexpired_holds(backend: Any) -> None:
    keys, a, b = backend.keys, token(), token()
    keys.hold(Bid(NS, a, "a", 5.0, key="k1"))
    keys.hold(Bid(NS, a, "a", 5.0, key="k2"))
    keys.hold(Bid(NS, b, "b", 5.0, key="k3"))
    keys.hold(Bid(NS, a, "a", 5.0, key="k4"))
    expire(backend, NS, "k4")
    assert [h.key for h in keys.held(NS)] == ["k1", "k2", "k3"]
    renewed = keys.renew(Bid(NS, a, "", 30.0, liveness=1.0))
    assert sorted(h.key for h in renewed) == ["k1", "k2"]
    assert all(h.remaining > 29.0 and h.liveness_us == 1_000_000 for h in renewed)
    assert keys.get(NS, "k3").remaining <= 5.0  # another holder's: untouched
    assert not keys.get(NS, "k4").held  # expired stays expired
    assert keys.renew(Bid("other", a, "", 30.0)) == []


def test_force_release_is_fenced_by_the_term_seen(backend: Any) -> None:
    keys, a, b = backend.keys, token(), token()
    first = keys.hold(Bid(NS, a, "a", 30.0, key="k")).lease
    assert not keys.force_release(NS, "k", first.term + 1)
    assert keys.force_release(NS, "k", first.term)
    assert not keys.force_release(NS, "k", first.term)  # vacant now: nothing to release
    second = keys.hold(Bid(NS, b, "b", 30.0, key="k")).lease
    assert not keys.force_release(NS, "k", first.term)  # an old view never frees a new hold
    assert keys.get(NS, "k").held_by(b) and second.term > first.term


def test_bad_keys_are_refused(backend: Any) -> None:
    with pytest.raises(ConfigurationError):
        backend.keys.hold(Bid(NS, token(), "a", 30.0, key=""))
    with pytest.raises(ConfigurationError):
        backend.keys.hold(Bid(NS, token(), "a", 30.0, key="x" * 501))
    long = "é" * 500  # 500 characters fit, whatever their bytes
    assert backend.keys.hold(Bid(NS, token(), "a", 30.0, key=long)).lease.key == long


def test_a_holders_lock_tells_others_when_its_session_ended(backend: Any) -> None:
    keys, a, b = backend.keys, token(), token()
    mine = keys.holder_session(a, 2.0)
    theirs = keys.holder_session(b, 2.0)
    assert mine is not None and theirs is not None
    try:
        assert mine.acquire(1.0)
        mine.ping()
        assert not theirs.ended(keys.holder_key(a))
        assert not theirs.ended(keys.holder_key(a))  # asking does not take it
        mine.ping()
        mine.close()
        deadline = time.monotonic() + 5
        while not theirs.ended(keys.holder_key(a)):
            assert time.monotonic() < deadline
            time.sleep(0.02)
    finally:
        mine.close()
        theirs.close()


def test_a_crashed_holders_key_is_taken_over_within_about_its_delta(backend: Any) -> None:
    from celery_election.election.holder import KeyHolder

    # a 1 s liveness (real time): at 0.5 s a hold won on a busy MariaDB came back after
    # its grant's proof (pings every delta / 4) and was given back as untrusted
    a = KeyHolder(backend, NS, liveness=1.0, holder_id="a")
    b = KeyHolder(backend, NS, liveness=1.0, holder_id="b")
    try:
        held = a.acquire("k")
        assert held is not None and held.tagged
        assert b.acquire("k") is None  # alive: its lock is held
        time.sleep(0.3)  # pings keep it alive (and the server's idle timeout at bay)
        assert b.acquire("k") is None and a.trusted(held)
        live = held.incarnation.live
        assert live is not None
        live.session.close()  # its connection died with the process
        closed = time.monotonic()
        # the server ends the dead session's lock in its own time (later when it is busy:
        # a loaded run found it still held): until then b is told the key is busy, as a
        # holder's next try would be
        deadline = closed + 10.0
        while True:
            started = time.monotonic()
            got = b.acquire("k")
            took = time.monotonic() - started
            if got is not None:
                break
            assert started < deadline, "the dead holder's lock never ended"
            time.sleep(0.01)
        assert got.term > held.term
        assert took >= 1.0, took  # it waited out the dead holder's delta (how long: the benchmark)
        assert not a.trusted(held) or a.trust_end(held) <= closed + 1.0
        assert not a.release(held)  # fenced: its term was superseded
        assert backend.keys.get(NS, "k").held_by(got.incarnation.token)
    finally:
        a.close()
        b.close()
