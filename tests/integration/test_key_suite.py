"""The key-hold contract every backend passes: memory, SQLite, PostgreSQL, MariaDB.

One test per WHERE condition of each step (as the lease suite), so a mutation of any
condition fails here (harness/mutations.py, ``keys-``), and the holder lock's probe
(``KeySession.ended``) on each real server.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from celery_election.backends import MemoryBackend
from celery_election.core.keys import key_hash
from celery_election.errors import ConfigurationError

from ..conftest import ALL_KINDS, make_backend, token

NS = "keys"


@pytest.fixture(params=ALL_KINDS)
def backend(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[Any]:
    yield from make_backend(request.param, tmp_path)


def expire_key(backend: Any, key: str) -> None:
    """End a hold now, as if its ttl had passed."""
    if isinstance(backend, MemoryBackend):
        store = backend.keys
        with store._lock:
            row = store._rows[(NS, key)]
            row.expires_at = min(row.expires_at, backend.clock.wall_us())
        return
    from celery_election.backends.schema import db_now_us

    t = backend.key_hold
    with backend.engine.begin() as conn:
        stmt = sa.update(t).where(t.c.namespace == NS, t.c.key_hash == key_hash(key))
        conn.execute(stmt.values(expires_at=db_now_us() - 1))


def test_first_hold_creates_the_row_and_wins(backend: Any) -> None:
    keys, a = backend.keys, token()
    assert keys.get(NS, "k") is None
    result = keys.hold(NS, "k", a, "host-a", 30.0)
    assert result.won and result.lease.held_by(a) and result.lease.term > 0
    assert result.lease.key == "k" and result.lease.leader_id == "host-a"
    assert 29.0 < result.lease.remaining <= 30.0
    assert [h.key for h in keys.held(NS)] == ["k"]


def test_a_live_hold_is_never_taken(backend: Any) -> None:
    keys, a, b = backend.keys, token(), token()
    first = keys.hold(NS, "k", a, "a", 30.0)
    second = keys.hold(NS, "k", b, "b", 30.0)
    assert first.won and not second.won
    assert second.lease.held_by(a) and second.lease.term == first.lease.term
    # the same holder asking again does not win a new term either
    assert not keys.hold(NS, "k", a, "a", 30.0).won


def test_keys_are_independent_and_exact(backend: Any) -> None:
    keys, a, b = backend.keys, token(), token()
    assert keys.hold(NS, "k", a, "a", 30.0).won
    assert keys.hold(NS, "k2", b, "b", 30.0).won
    assert keys.hold(NS, "K", b, "b", 30.0).won  # case matters (utf8mb4_bin)
    assert keys.hold("other", "k", b, "b", 30.0).won


def test_expired_hold_is_taken_with_a_greater_term(backend: Any) -> None:
    keys, a, b = backend.keys, token(), token()
    first = keys.hold(NS, "k", a, "a", 30.0).lease
    expire_key(backend, "k")
    assert keys.held(NS) == []
    second = keys.hold(NS, "k", b, "b", 30.0)
    assert second.won and second.lease.term > first.term
    # the old holder can neither renew nor release the new hold
    assert keys.renew(NS, a, 30.0) == []
    assert not keys.release(NS, "k", a, first.term)
    assert not keys.release(NS, "k", a, second.lease.term)
    assert keys.get(NS, "k").held_by(b)


def test_release_needs_the_exact_token_and_term(backend: Any) -> None:
    keys, a, b = backend.keys, token(), token()
    held = keys.hold(NS, "k", a, "a", 30.0).lease
    assert not keys.release(NS, "k", b, held.term)
    assert not keys.release(NS, "k", a, held.term - 1)
    assert keys.get(NS, "k").held_by(a)
    assert keys.release(NS, "k", a, held.term)
    after = keys.get(NS, "k")
    assert not after.held and after.term == held.term  # the term stays
    again = keys.hold(NS, "k", b, "b", 30.0)
    assert again.won and again.lease.term > held.term


def test_renew_extends_only_the_tokens_unexpired_holds(backend: Any) -> None:
    keys, a, b = backend.keys, token(), token()
    keys.hold(NS, "k1", a, "a", 5.0)
    keys.hold(NS, "k2", a, "a", 5.0)
    keys.hold(NS, "k3", b, "b", 5.0)
    keys.hold(NS, "k4", a, "a", 5.0)
    expire_key(backend, "k4")
    renewed = keys.renew(NS, a, 30.0, liveness=1.0)
    assert sorted(h.key for h in renewed) == ["k1", "k2"]
    assert all(h.remaining > 29.0 and h.liveness_us == 1_000_000 for h in renewed)
    assert keys.get(NS, "k3").remaining <= 5.0  # another holder's: untouched
    assert not keys.get(NS, "k4").held  # expired stays expired
    assert keys.renew("other", a, 30.0) == []


def test_take_over_needs_the_seen_term_token_tag_and_wait(backend: Any) -> None:
    keys, a, b = backend.keys, token(), token()
    seen = keys.hold(NS, "k", a, "a", 30.0, liveness=1.0).lease
    assert seen.liveness_us == 1_000_000
    stale = type(seen)(**{**seen.__dict__, "term": seen.term - 1})
    other = type(seen)(**{**seen.__dict__, "token": token()})
    assert not keys.take_over(NS, "k", b, "b", 30.0, stale, 2.0).won
    assert not keys.take_over(NS, "k", b, "b", 30.0, other, 2.0).won
    assert not keys.take_over(NS, "k", b, "b", 30.0, seen, 0.5).won  # waited < delta
    assert keys.get(NS, "k").held_by(a)
    taken = keys.take_over(NS, "k", b, "b", 30.0, seen, 1.0)
    assert taken.won and taken.lease.held_by(b) and taken.lease.term > seen.term
    # the old holder's renew and release find nothing of theirs
    assert keys.renew(NS, a, 30.0) == []
    assert not keys.release(NS, "k", a, seen.term)


def test_an_untagged_hold_is_never_taken_over(backend: Any) -> None:
    keys, a, b = backend.keys, token(), token()
    seen = keys.hold(NS, "k", a, "a", 30.0).lease
    assert seen.liveness_us is None
    assert not keys.take_over(NS, "k", b, "b", 30.0, seen, 1000.0).won
    assert keys.get(NS, "k").held_by(a)


def test_force_release_is_fenced_by_the_term_seen(backend: Any) -> None:
    keys, a, b = backend.keys, token(), token()
    first = keys.hold(NS, "k", a, "a", 30.0).lease
    assert not keys.force_release(NS, "k", first.term + 1)
    assert keys.force_release(NS, "k", first.term)
    assert not keys.force_release(NS, "k", first.term)  # vacant now: nothing to release
    second = keys.hold(NS, "k", b, "b", 30.0).lease
    assert not keys.force_release(NS, "k", first.term)  # an old view never frees a new hold
    assert keys.get(NS, "k").held_by(b) and second.term > first.term


def test_bad_keys_are_refused(backend: Any) -> None:
    with pytest.raises(ConfigurationError):
        backend.keys.hold(NS, "", token(), "a", 30.0)
    with pytest.raises(ConfigurationError):
        backend.keys.hold(NS, "x" * 501, token(), "a", 30.0)
    long = "é" * 500  # 500 characters fit, whatever their bytes
    assert backend.keys.hold(NS, long, token(), "a", 30.0).lease.key == long


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

    a = KeyHolder(backend, NS, liveness=0.5, holder_id="a")
    b = KeyHolder(backend, NS, liveness=0.5, holder_id="b")
    try:
        held = a.acquire("k")
        assert held is not None and held.tagged
        assert b.acquire("k") is None  # alive: its lock is held
        time.sleep(0.3)  # pings keep it alive (and the server's idle timeout at bay)
        assert b.acquire("k") is None and a.trusted(held)
        session = held.incarnation.session
        assert session is not None
        session.close()  # its connection died with the process
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
        assert took >= 0.5, took  # it waited out the dead holder's delta (how long: the benchmark)
        assert not a.trusted(held) or a.trust_end(held) <= closed + 0.5
        assert not a.release(held)  # fenced: its term was superseded
        assert backend.keys.get(NS, "k").held_by(got.incarnation.token)
    finally:
        a.close()
        b.close()
