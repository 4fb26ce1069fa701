"""The lease's own contract on every backend: memory, SQLite, PostgreSQL, MariaDB, each driver.

The hold's steps (take, extend, release, take over) are test_hold_suite.py's, run over
the lease and a key alike; here what only the lease has: renewal by exact term, terms
across re-installs, namespaces' collation, candidates, races, deadlines.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from celery_election.core.lease import Bid
from celery_election.errors import BackendUnavailableError, ConfigurationError, SchemaMissingError

from ..conftest import EVERY_KIND, EVERY_SQL, expire, expire_candidates, make_backend, token

NS = "suite"


@pytest.fixture(params=EVERY_KIND)
def backend(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[Any]:
    """Every backend, PostgreSQL and MariaDB through each of their drivers."""
    yield from make_backend(request.param, tmp_path)


def test_renew_extends_only_the_exact_token_and_term(backend: Any) -> None:
    a, b = token(), token()
    lease = backend.elect(Bid(NS, a, "a", 5.0)).lease
    assert not backend.renew(NS, b, lease.term, 30.0).won
    assert not backend.renew(NS, a, lease.term - 1, 30.0).won
    assert not backend.renew(NS, a, lease.term + 1, 30.0).won
    renewed = backend.renew(NS, a, lease.term, 30.0)
    assert renewed.won and renewed.lease.term == lease.term
    assert renewed.lease.remaining > 29.0
    # elect(term=...) is the same renewal
    assert backend.elect(Bid(NS, a, "a", 30.0), term=lease.term).won


def test_terms_survive_uninstall_and_install(backend: Any) -> None:
    first = backend.elect(Bid(NS, token(), "a", 30.0)).lease
    backend.uninstall()
    with pytest.raises(SchemaMissingError) as info:
        backend.current(NS)
    assert "celery -A proj election install" in str(info.value)
    backend.install()
    assert backend.current(NS) is None
    second = backend.elect(Bid(NS, token(), "b", 30.0))
    assert second.won and second.lease.term > first.term


def test_install_is_idempotent(backend: Any) -> None:
    lease = backend.elect(Bid(NS, token(), "a", 30.0)).lease
    backend.install()
    backend.install()
    assert backend.current(NS).term == lease.term


def test_namespaces_differing_in_case_space_or_accent_stay_apart(backend: Any) -> None:
    names = ["prod", "PROD", "prod ", "pröd"]
    tokens = [token() for _ in names]
    for name, t in zip(names, tokens, strict=False):
        if name != name.strip():
            with pytest.raises(ConfigurationError):
                backend.elect(Bid(name, t, "x", 30.0))
            continue
        assert backend.elect(Bid(name, t, "x", 30.0)).won, name
    for name, t in zip(names, tokens, strict=False):
        if name == name.strip():
            assert backend.current(name).held_by(t)


def test_two_instances_with_the_same_candidate_id_never_both_lead(backend: Any) -> None:
    a, b = token(), token()
    first = backend.elect(Bid(NS, a, "worker@host", 30.0))
    second = backend.elect(Bid(NS, b, "worker@host", 30.0))
    assert first.won and not second.won
    # the label matches, but the token does not: b can neither renew nor resign
    assert not backend.renew(NS, b, first.lease.term, 30.0).won
    assert not backend.resign(NS, b, first.lease.term)
    assert backend.current(NS).held_by(a)


def test_candidates_are_listed_until_their_heartbeat_expires(backend: Any) -> None:
    a, b = token(), token()
    backend.register(NS, a, "a", "host-a", 11, 30.0)
    backend.register(NS, b, "b", "host-b", 12, 30.0)
    backend.register(NS, a, "a", "host-a", 11, 30.0)  # heartbeat: an upsert
    listed = backend.candidates(NS)
    assert sorted(c.candidate_id for c in listed) == ["a", "b"]
    assert {c.hostname for c in listed} == {"host-a", "host-b"}
    backend.unregister(NS, b)
    assert [c.candidate_id for c in backend.candidates(NS)] == ["a"]
    expire_candidates(backend, NS)
    assert backend.candidates(NS) == []
    assert backend.prune(NS) == 1
    assert backend.prune(NS) == 0


def test_a_candidate_is_listed_as_eligible_or_not_as_its_last_heartbeat_said(
    backend: Any,
) -> None:
    a, b = token(), token()
    backend.register(NS, a, "a", "host-a", 11, 30.0, eligible=False)
    backend.register(NS, b, "b", "host-b", 12, 30.0)  # eligible unless it says otherwise
    assert {c.candidate_id: c.eligible for c in backend.candidates(NS)} == {"a": False, "b": True}
    backend.register(NS, a, "a", "host-a", 11, 30.0, eligible=True)  # the heartbeat updates it
    backend.register(NS, b, "b", "host-b", 12, 30.0, eligible=False)
    assert {c.candidate_id: c.eligible for c in backend.candidates(NS)} == {"a": True, "b": False}


def test_a_candidate_is_listed_with_the_release_it_registered(backend: Any) -> None:
    a, b = token(), token()
    backend.register(NS, a, "a", "host-a", 11, 30.0, release="0.2.0")
    backend.register(NS, b, "b", "host-b", 12, 30.0)  # a release that does not say
    assert {c.candidate_id: c.release for c in backend.candidates(NS)} == {"a": "0.2.0", "b": None}
    backend.register(NS, b, "b", "host-b", 12, 30.0, release="0.3.0")  # upgraded in place
    assert {c.candidate_id: c.release for c in backend.candidates(NS)} == {
        "a": "0.2.0",
        "b": "0.3.0",
    }


def test_threads_racing_for_a_new_namespace_elect_exactly_one(backend: Any) -> None:
    _race_threads(backend, "race-new", rounds=1)


def test_threads_racing_for_an_expired_lease_elect_exactly_one(backend: Any) -> None:
    _race_threads(backend, "race-expired", rounds=5)


def _race_threads(backend: Any, namespace: str, rounds: int, n: int = 8) -> None:
    tokens = [token() for _ in range(n)]
    last_term = 0
    for _ in range(rounds):
        barrier = threading.Barrier(n)
        results: list[Any] = [None] * n

        def run(i: int, barrier: threading.Barrier, results: list[Any]) -> None:
            barrier.wait()
            results[i] = backend.elect(Bid(namespace, tokens[i], f"c{i}", 30.0))

        threads = [threading.Thread(target=run, args=(i, barrier, results)) for i in range(n)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        winners = [r for r in results if r.won]
        assert len(winners) == 1, results
        term = winners[0].lease.term
        assert term > last_term
        for r in results:
            # A loser reports the row as it read it: the winner's, or (read before the
            # winner committed) a vacant one; never another holder, never a newer term.
            if r.lease is not None and r.lease.held:
                assert (r.lease.token, r.lease.term) == (winners[0].lease.token, term)
            if r.lease is not None:
                assert r.lease.term <= term
        last_term = term
        expire(backend, namespace)


# The memory backend's clock is the host clock by definition: SQL backends only.
@pytest.mark.parametrize("backend", EVERY_SQL, indirect=True)
def test_host_clock_skew_changes_no_outcome(backend: Any, monkeypatch: Any) -> None:
    a, b = token(), token()
    lease = backend.elect(Bid(NS, a, "a", 30.0)).lease
    real_time, real_ns = time.time, time.time_ns
    monkeypatch.setattr(time, "time", lambda: real_time() + 3600)
    monkeypatch.setattr(time, "time_ns", lambda: real_ns() + 3600 * 10**9)
    assert not backend.elect(Bid(NS, b, "b", 30.0)).won  # an hour ahead, the lease still holds
    renewed = backend.renew(NS, a, lease.term, 30.0)
    assert renewed.won and 29.0 < renewed.lease.remaining <= 30.0
    monkeypatch.setattr(time, "time", lambda: real_time() - 3600)
    monkeypatch.setattr(time, "time_ns", lambda: real_ns() - 3600 * 10**9)
    assert not backend.elect(Bid(NS, b, "b", 30.0)).won
    assert backend.current(NS).held_by(a)


def test_bad_keys_are_refused_before_touching_the_database(backend: Any) -> None:
    for bad in ["", " x", "x" * 191, "a\nb"]:
        with pytest.raises(ConfigurationError, match="namespace"):
            backend.elect(Bid(bad, token(), "a", 30.0))
    with pytest.raises(ConfigurationError, match="candidate_id"):
        backend.elect(Bid(NS, token(), "", 30.0))
    with pytest.raises(ConfigurationError, match="candidate_id"):
        backend.register(NS, token(), "y" * 256, "h", 1, 30.0)
    longest = "n" * 190
    assert backend.elect(Bid(longest, token(), "a", 30.0)).won
    assert backend.current(longest).namespace == longest


SERVERS = [k for k in EVERY_SQL if k != "sqlite"]


@pytest.mark.parametrize("backend", SERVERS, indirect=True)
def test_a_call_past_its_deadline_is_cut_on_every_driver(backend: Any) -> None:
    """The watchdog shuts the blocked call's socket down from its own thread (rule 8).

    mysqlclient refuses ``fileno()`` while another thread is in a call: its socket is
    noted at connect, or the cut silently misses and the call runs on.
    """
    sleep = "SELECT pg_sleep(3)" if backend.dialect == "postgresql" else "SELECT SLEEP(3)"
    started = time.monotonic()
    with pytest.raises(BackendUnavailableError, match="did not answer within"):
        backend.call(
            lambda conn: conn.exec_driver_sql(sleep).all(),
            table=backend.lease,
            write=False,
            timeout=0.5,
            connection=None,
        )
    assert time.monotonic() - started < 2.0
    assert backend.current(NS) is None  # the next call gets a fresh connection


@pytest.mark.parametrize("backend", [k for k in SERVERS if k.startswith("mysql")], indirect=True)
def test_an_update_that_changes_nothing_counts_no_row_on_mysql(backend: Any) -> None:
    """Rule 1: SQLAlchemy's PyMySQL and mysqlclient dialects turn CLIENT.FOUND_ROWS on, and
    a conditional UPDATE then reports the rows it matched: one that changed nothing would
    count as a won step. The private engine turns it off."""
    a = token()
    backend.elect(Bid(NS, a, "a", 30.0))
    t = backend.lease
    same = sa.update(t).where(t.c.namespace == NS).values(term=t.c.term, token=t.c.token)
    with backend.engine.connect() as conn:
        assert conn.execute(same).rowcount == 0


def test_every_backend_answers_the_electors_housekeeping_calls(backend: Any) -> None:
    """``release_idle`` and ``topology_warnings`` are Backend calls (no getattr probing):
    every backend has them, and they never fail an elector's start or wait."""
    backend.elect(Bid(NS, token(), "a", 30.0))
    backend.release_idle()
    assert backend.current(NS) is not None  # reconnects after a release
    warnings = backend.topology_warnings(lock_on=True)
    assert warnings == []  # with the lock on there is nothing to warn of
    assert isinstance(backend.topology_warnings(lock_on=False), list)
