"""PostgreSQL the way operators deploy it: behind PgBouncer (transaction and session
mode), with a URL of several hosts, and pointed at a read-only standby by mistake.

Behind a transaction pooler a session's state (an advisory lock, a LISTEN) stays on
whichever server connection ran the call, and the next client handed that connection
shares it: three processes once held "the" liveness lock at once. The election probes
the topology and keeps session state off such a URL (``election_direct_url`` brings it
back), and no connection it opens prepares statements the pooler cannot carry.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from celery_election import Elector, backend_from_url
from celery_election.backends import PostgresBackend
from celery_election.backends.locks import (
    _PINNED,
    PROBE_EVERY,
    PooledSessions,
    PostgresSession,
    pg_connector,
    sessions_pinned,
)
from celery_election.history import Recorder

from ..conftest import server_url, unique_prefix
from .test_liveness import NS, _fault_under_a_leader, _no_overlap

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def fresh_probe() -> Iterator[None]:
    """Each test probes its URLs itself (the verdict is cached per URL)."""
    _PINNED.clear()
    yield
    _PINNED.clear()


def pinned(url: str) -> bool:
    backend = backend_from_url(url, table_prefix="probe_", listen=False)
    try:
        connect = pg_connector(backend.engine, backend.engine.url, 5.0, "probe")
        conn = connect()
        try:
            conn.autocommit = True
            return sessions_pinned(conn, connect, url)
        finally:
            conn.close()
    finally:
        backend.close()


def test_the_probe_tells_a_transaction_pooler_from_sessions_that_stay() -> None:
    assert pinned(server_url("postgresql")) is True
    assert pinned(server_url("pgbouncer-session")) is True
    assert pinned(server_url("pgbouncer-transaction")) is False


def test_a_slot_taken_on_an_old_verdict_is_checked_again_before_any_wait() -> None:
    """A cold standby's slot try may use a verdict on its URL up to SLOT_PROBE_EVERY old
    (a slot bounds nobody's trust, and a probe costs two sessions); the lock wait after
    it needs one younger than PROBE_EVERY. So a URL that leads to a transaction pooler
    since the last probe said it did not is caught before anyone waits or trusts."""
    url = server_url("pgbouncer-transaction")
    backend = backend_from_url(url, table_prefix=unique_prefix(), listen=False)
    session = backend.liveness_session(NS, 1.0, 2.0)
    assert isinstance(session, PostgresSession)
    _PINNED[session.description] = (True, time.monotonic() - 2 * PROBE_EVERY)
    try:
        assert session.claim_slot(2)  # on the old verdict, through the pooler
        with pytest.raises(PooledSessions, match="election_direct_url"):
            session.acquire(1.0)
        assert _PINNED[session.description][0] is False  # probed again, and found out
        assert not session.has_lock
    finally:
        session.close()
        backend.close()


def test_the_probe_before_a_wait_may_outlast_delta() -> None:
    """A slot taken on an old verdict is probed again before the wait; the probe opens a
    second session, which under load took longer than delta. The session's silence bound
    (idle_session_timeout = delta) is set only after it: set before, the server ended the
    first session during the probe, every time (a follower that never got the lock)."""
    backend = backend_from_url(server_url("postgresql"), table_prefix=unique_prefix(), listen=False)
    delta = 0.5
    session = backend.liveness_session(NS, delta, 2.0)
    assert isinstance(session, PostgresSession)
    _PINNED[session.description] = (True, time.monotonic() - 2 * PROBE_EVERY)
    connect, opened = session._connect, []

    def slow_second(*args: Any) -> Any:
        opened.append(1)
        if len(opened) == 2:  # the probe's own session
            time.sleep(2 * delta)
        return connect(*args)

    session._connect = slow_second
    try:
        assert session.claim_slot(2)
        assert session.acquire(1.0) and session.has_lock
        session.ping()
        assert len(opened) == 2  # the slot's session and the probe's, nothing reconnected
    finally:
        session.close()
        backend.close()


@pytest.fixture
def env(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """What test_liveness's helpers take: URL, options, prefix, history, and clean-up."""
    prefix = unique_prefix()
    admin = backend_from_url(server_url("postgresql"), table_prefix=prefix, listen=False)
    admin.install()
    e: dict[str, Any] = {
        "prefix": prefix,
        "backend": admin,
        "history": tmp_path / "h.jsonl",
        "children": [],
        "electors": [],
        "options": {},
    }
    try:
        yield e
    finally:
        for elector in e["electors"]:
            elector.stop()
        for child in e["children"]:
            child.close()
        admin.uninstall()
        admin.close()


def electors(env: dict[str, Any], n: int, ttl: float, **kw: Any) -> list[Elector]:
    started = []
    for i in range(n):
        backend = backend_from_url(env["url"], table_prefix=env["prefix"], **env["options"])
        elector = Elector(backend, NS, candidate_id=f"e{i}", ttl=ttl, **kw)
        Recorder(env["history"], role=f"e{i}").attach(elector)
        env["electors"].append(elector)
        started.append(elector.start())
    return started


def test_through_a_transaction_pooler_the_lease_alone_decides_and_says_so(
    env: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    """Default settings, three electors: one leads, renewing dozens of times through
    the pooler (psycopg would prepare the renew from its sixth run, and the next
    server connection would not know it); liveness and LISTEN are off, each with one
    WARNING that names election_direct_url."""
    caplog.set_level(logging.WARNING)
    env["url"] = server_url("pgbouncer-transaction")
    group = electors(env, 3, ttl=2.0)  # renew every 0.8 s, liveness delta 0.375 s
    listeners = [cast(PostgresBackend, e.backend)._listener for e in group]

    def renews() -> int:
        return sum(e.stats.calls.get("renew", ([], 0.0, 0))[2] for e in group)

    def looks() -> list[tuple[str, int]]:
        return [(e.liveness, x.connects) for e, x in zip(group, listeners, strict=True)]

    deadline = time.monotonic() + 30
    while renews() < 15:
        assert time.monotonic() < deadline, "the leader did not renew 15 times"
        time.sleep(0.1)
    # an elector whose lock thread found the pooler turns to LISTEN, which finds it too
    # and looks again only after PROBE_EVERY (no reconnect loop); a follower bound by no
    # lock ("idle") never went for it, so never turned to LISTEN. Under load a first
    # connect may time out: wait for each to have looked.
    while not set(looks()) <= {("off", 1), ("idle", 0)}:
        assert time.monotonic() < deadline, looks()
        time.sleep(0.1)
    leaders = [e for e in group if e.is_leader]
    assert len(leaders) == 1
    # prepared statements would fail every renew from the sixth on; a renew that timed out
    # on a loaded machine is not that (and no failure may name a prepared statement)
    failed = sum(sum(e.stats.failures.values()) for e in group)
    assert failed * 5 < renews(), [e.stats.failures for e in group]
    assert all(e.config.liveness for e in group)  # on, as by default: the probe turned it off
    # the leader found out when it went for the lock; the followers wait on the lease
    assert leaders[0].liveness == "off"
    assert not any(e.liveness in ("holding", "waiting") for e in group)
    assert not any(x.healthy for x in listeners)
    assert looks()[group.index(leaders[0])] == ("off", 1)
    messages = [r.getMessage() for r in caplog.records]
    assert any("liveness is off" in m and "election_direct_url" in m for m in messages)
    assert any("LISTEN is off" in m and "election_direct_url" in m for m in messages)
    assert not any("prepared statement" in m for m in messages)
    _no_overlap(env)


def test_with_a_direct_url_a_crash_is_replaced_through_the_lock(env: dict[str, Any]) -> None:
    """Lease steps through the pooler, the lock and LISTEN straight to PostgreSQL."""
    env["url"] = server_url("pgbouncer-transaction")
    env["options"] = {"direct_url": server_url("postgresql")}
    _, old, new, follower = _fault_under_a_leader(env, "kill", "no take-over through the lock")
    assert new.term > old.term and new.leader_id == "follower"
    assert follower.liveness == "holding"
    _no_overlap(env)


def test_through_a_session_pooler_the_lock_works(env: dict[str, Any]) -> None:
    env["url"] = server_url("pgbouncer-session")
    _, old, new, _ = _fault_under_a_leader(env, "kill", "no take-over through the lock")
    assert new.term > old.term
    _no_overlap(env)


def test_a_url_of_several_hosts_reaches_the_live_one_for_every_connection(
    env: dict[str, Any],
) -> None:
    """libpq's comma form and SQLAlchemy's repeated form, a dead host first: the lease,
    the liveness lock and (for an elector without the lock, which listens) LISTEN all
    connect."""
    dead = "127.0.0.1:1"  # nothing listens there
    pg = server_url("postgresql")
    live = pg.split("@", 1)[1].split("/", 1)[0]
    db = pg.rsplit("/", 1)[1]
    for hosts in (f"host={dead},{live}", f"host={dead}&host={live}"):
        env["url"] = f"postgresql+psycopg://postgres@/{db}?{hosts}&target_session_attrs=read-write"
        # ttl 30: at 3 a loaded run (the floor cell) let the lease lapse and the listener
        # win it, and the first elector, a follower of an untagged term, idled its lock
        (elector,) = electors(env, 1, ttl=30.0)
        assert elector.wait_for_leadership(10)
        (listener,) = electors(env, 1, ttl=30.0, liveness=False)
        deadline = time.monotonic() + 10
        backend = listener.backend
        assert isinstance(backend, PostgresBackend)
        while elector.liveness != "holding" or not backend.listener_healthy:
            assert time.monotonic() < deadline, (elector.liveness, backend.listener_healthy)
            time.sleep(0.05)
        for e in (elector, listener):
            e.stop()
            env["electors"].remove(e)


def test_a_listen_connection_that_cannot_be_opened_is_a_warning(
    env: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, "celery_election.backends.postgres")
    env["url"] = server_url("postgresql")
    env["options"] = {"listen_url": "postgresql+psycopg://postgres@127.0.0.1:1/test"}
    (elector,) = electors(env, 1, ttl=3.0, liveness=False)  # with the lock, no LISTEN
    assert elector.wait_for_leadership(10)
    deadline = time.monotonic() + 10
    while not any("LISTEN connection failed:" in r.getMessage() for r in caplog.records):
        assert time.monotonic() < deadline, "the LISTEN connection was not tried again"
        time.sleep(0.05)
    # once at WARNING, then each try again quietly (debug), with back-off
    said = [r for r in caplog.records if "LISTEN connection" in r.getMessage()]
    assert said[0].levelno == logging.WARNING and "LISTEN connection to" in said[0].getMessage()
    assert all(r.levelno == logging.DEBUG for r in said[1:])
