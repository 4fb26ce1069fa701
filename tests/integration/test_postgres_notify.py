"""PostgreSQL LISTEN/NOTIFY: wakeups that only wake, survive a killed listener, and stay
inside their table prefix, through psycopg 3 and psycopg2. Followers here poll every 30 s
and the lease lasts 20 s, so a takeover within seconds can only come from a notification.
The liveness lock is off here: with it on, the lock is the followers' wake-up and they do
not LISTEN at all (tests/integration/test_liveness.py)."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from celery_election import Elector
from celery_election.backends import backend_from_url
from celery_election.backends.postgres import PostgresBackend, _Listener, parse_payload

from ..conftest import PG_DRIVERS, server_url, unique_prefix

SLOW_POLL: dict[str, Any] = dict(
    ttl=20.0, renew_interval=5.0, poll_interval=30.0, fallback_interval=60.0, liveness=False
)
WAIT = 10.0


class Counted:
    """A PostgresBackend plus a count of the statements its lease engine sends."""

    def __init__(self, url: str, prefix: str, **options: Any) -> None:
        backend = backend_from_url(url, table_prefix=prefix, **options)
        assert isinstance(backend, PostgresBackend)
        self.backend = backend
        self.statements = 0
        sa.event.listen(backend.engine, "before_cursor_execute", self._count)

    def _count(self, *args: Any) -> None:
        self.statements += 1


@pytest.fixture(params=PG_DRIVERS)
def pg_url(request: pytest.FixtureRequest) -> str:
    """PostgreSQL through psycopg 3 (``notifies()``) and psycopg2 (``poll()``)."""
    return server_url(request.param)


@pytest.fixture
def make(pg_url: str) -> Iterator[Any]:
    prefix = unique_prefix()
    made: list[tuple[Counted, list[Elector]]] = []
    installer = backend_from_url(pg_url, table_prefix=prefix)
    installer.install()

    def factory(name: str, *, prefix_: str | None = None, start: bool = True, **kw: Any) -> Any:
        options = {k: kw.pop(k) for k in ("listen", "listen_url", "probe_timeout") if k in kw}
        c = Counted(pg_url, prefix_ or prefix, **options)
        e = Elector(c.backend, "pg", name, **{**SLOW_POLL, **kw})
        made.append((c, [e]))
        if start:
            e.start()
        return c, e

    factory.prefix = prefix  # type: ignore[attr-defined]
    factory.url = pg_url  # type: ignore[attr-defined]
    yield factory
    for c, electors in made:
        for e in electors:
            e.stop()
        c.backend.close()
    installer.uninstall()
    installer.close()


def wait_healthy(backend: PostgresBackend, connects: int = 1, elector: Any = None) -> None:
    """Until the listener delivers (and ``elector`` has made its first look at the row)."""
    ok = threading.Event()
    for _ in range(int(WAIT / 0.05)):
        looked = elector is None or elector.last_lease is not None
        if looked and backend.listener_healthy and backend._listener.connects >= connects:
            ok.set()
            break
        ok.wait(0.05)
    assert ok.is_set(), "listener never became healthy"


def test_a_follower_wakes_on_resign_without_waiting_for_its_poll(make: Any) -> None:
    _ca, a = make("a")
    assert a.wait_for_leadership(WAIT)
    cb, b = make("b")
    wait_healthy(cb.backend)
    a.stop()  # resigns: the lease had ~20 s left, b polls every 30 s
    assert b.wait_for_leadership(WAIT)
    assert cb.backend.current("pg").leader_id == "b"


def test_followers_stay_quiet_while_the_leader_renews(make: Any) -> None:
    # A 4 s lease renewed every 0.5 s: on a loaded machine a 2 s one (margin 0.5) ran out
    # between two starved renewals and b looked, rightly.
    _ca, a = make("a", ttl=4.0, renew_interval=0.5, safety_margin=1.0)
    assert a.wait_for_leadership(WAIT)
    cb, b = make("b", ttl=4.0, renew_interval=0.5, safety_margin=1.0)
    wait_healthy(cb.backend, elector=b)  # b's start-up statements are done
    start = cb.statements
    renewals = threading.Event()
    renewals.wait(8.0)  # two lease lengths: without the renew NOTIFY b would look twice
    assert a.is_leader and not b.is_leader
    assert cb.statements == start  # no statement at all: each renewal pushed b's look back


def test_the_listener_reconnects_after_pg_terminate_backend(make: Any) -> None:
    _ca, a = make("a")
    assert a.wait_for_leadership(WAIT)
    cb, b = make("b")
    wait_healthy(cb.backend)
    pid = cb.backend._listener._conn.info.backend_pid
    killer = sa.create_engine(make.url, poolclass=sa.pool.NullPool)
    with killer.connect() as conn:
        assert conn.execute(sa.text("SELECT pg_terminate_backend(:p)"), {"p": pid}).scalar()
    killer.dispose()
    wait_healthy(cb.backend, connects=2)
    assert cb.backend._listener._conn.info.backend_pid != pid
    a.stop()
    assert b.wait_for_leadership(WAIT)  # woken through the new LISTEN connection


def test_garbage_and_oversized_payloads_change_nothing(make: Any) -> None:
    ca, a = make("a")
    assert a.wait_for_leadership(WAIT)
    cb, b = make("b")
    wait_healthy(cb.backend, elector=b)
    term = ca.backend.current("pg").term
    before = cb.statements
    channel = cb.backend.channel
    payloads = [
        "<garbage>",
        "",
        "null",
        "[1, 2]",
        json.dumps({"ns": "pg", "ev": "resigned"}),  # no term
        json.dumps({"ns": "pg", "ev": "resigned", "term": "1"}),  # term not an int
        json.dumps({"ns": "pg", "ev": "resigned", "term": True}),
        json.dumps({"ns": "pg", "ev": "exploded", "term": term}),
        json.dumps({"ns": "x" * 191, "ev": "resigned", "term": term}),
        json.dumps({"ns": "pg", "ev": "resigned", "term": term, "pad": "x" * 7900}),
    ]
    assert 7000 < len(payloads[-1]) < 8000  # deliverable by PostgreSQL, not one of ours
    sender = sa.create_engine(make.url, poolclass=sa.pool.NullPool)
    with sender.begin() as conn:
        for p in payloads:
            conn.execute(sa.select(sa.func.pg_notify(channel, p)))
    sender.dispose()
    listener = cb.backend._listener
    read = threading.Event()
    for _ in range(200):
        if listener.ignored >= len(payloads):
            read.set()
            break
        read.wait(0.02)
    assert listener.ignored == len(payloads)  # every one read, and dropped
    assert listener.healthy
    assert a.is_leader and not b.is_leader
    assert cb.statements == before  # not one extra look at the row
    assert ca.backend.current("pg").term == term


@pytest.mark.parametrize(
    "payload",
    [
        "<garbage>",
        "{",
        json.dumps({"ns": "pg", "ev": "resigned", "term": -1}),
        json.dumps({"ns": "", "ev": "resigned", "term": 1}),
        json.dumps({"ns": "pg", "ev": "resigned", "term": 1, "x": "y" * 500}),
    ],
)
def test_parse_payload_refuses_what_is_not_ours(payload: str) -> None:
    assert parse_payload(payload) is None


def test_parse_payload_reads_ours() -> None:
    ns, wakeup = parse_payload(json.dumps({"ns": "pg", "ev": "renewed", "term": 7})) or ("", None)
    assert ns == "pg" and wakeup is not None and (wakeup.kind, wakeup.term) == ("renewed", 7)


def test_two_table_prefixes_on_one_database_do_not_wake_each_other(make: Any) -> None:
    other = unique_prefix()
    installer = backend_from_url(make.url, table_prefix=other)
    installer.install()
    try:
        ca, a = make("a")
        assert a.wait_for_leadership(WAIT)
        _cx, x = make("x", prefix_=other)
        assert x.wait_for_leadership(WAIT)  # its own election, under its own prefix
        cy, y = make("y", prefix_=other)
        wait_healthy(cy.backend, elector=y)
        assert ca.backend.channel != cy.backend.channel
        quiet = cy.statements
        a.stop()  # a resign (and NOTIFY) under the first prefix
        _cb, b = make("b")
        assert b.wait_for_leadership(WAIT)
        assert cy.statements == quiet and not y.is_leader and x.is_leader
    finally:
        installer.uninstall()
        installer.close()


def test_poll_only_mode_never_listens_and_still_hands_over(make: Any) -> None:
    _ca, a = make("a", listen=False, poll_interval=0.2)
    assert a.wait_for_leadership(WAIT)
    cb, b = make("b", listen=False, poll_interval=0.2)
    a.stop()
    assert b.wait_for_leadership(WAIT)
    assert cb.backend._listener.connects == 0 and not cb.backend.listener_healthy


def test_a_probe_that_is_never_delivered_makes_the_follower_poll(
    make: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # PgBouncer in transaction mode accepts LISTEN and delivers nothing: simulate by
    # sending the probe where nobody listens.
    def lost_probe(self: _Listener, conn: Any) -> bool:
        with conn.cursor() as cur:  # psycopg 3 and psycopg2 alike
            cur.execute("SELECT pg_notify('nowhere', 'probe')")
        return self._listen_for(conn, self.probe_timeout, nonce="never")

    monkeypatch.setattr(_Listener, "_probe", lost_probe)
    caplog.set_level(logging.WARNING, "celery_election.backends.postgres")
    _ca, a = make("a", probe_timeout=0.2)
    assert a.wait_for_leadership(WAIT)
    cb, b = make("b", probe_timeout=0.2, poll_interval=0.3)
    warned = threading.Event()
    for _ in range(100):
        if any("was not delivered" in r.getMessage() for r in caplog.records):
            warned.set()
            break
        warned.wait(0.05)
    assert warned.is_set() and not cb.backend.listener_healthy
    a.stop()
    assert b.wait_for_leadership(WAIT)  # found by polling
    assert sum("was not delivered" in r.getMessage() for r in caplog.records) <= 2  # once each


def test_a_quiet_listener_probes_again_after_each_interval_and_stops_mid_wait(
    pg_url: str,
) -> None:
    """No notification for ``probe_interval``: the listener probes again (each silent
    interval ends in one probe), and a stop() while it listens ends it at once. Before
    this test only a long-lived listener's timing reached these paths."""
    backend = PostgresBackend(pg_url, table_prefix=unique_prefix(), probe_interval=0.2)
    try:
        backend.subscribe_wakeups("pg", lambda wakeup: None)
        done = threading.Event()
        for _ in range(int(WAIT / 0.05)):
            if backend.listener_healthy:
                break
            done.wait(0.05)
        first = backend.listener_statements
        for _ in range(int(WAIT / 0.05)):
            if backend.listener_statements >= first + 2:
                break
            done.wait(0.05)
        assert backend.listener_statements >= first + 2 and backend.listener_healthy
        thread = backend._listener._thread
        assert thread is not None and thread.is_alive()
        backend._listener._stop.set()  # a stop while it listens, its connection left open:
        thread.join(5)  # the listen ends at its next look at the flag, and the thread with it
        assert not thread.is_alive()
    finally:
        backend.close()
