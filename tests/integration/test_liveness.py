"""The liveness session on the real servers: who may lead when a lock holder dies,
pauses or loses its session, and that two processes never believe they lead at once.

A leader in a child process (``liveness_child.py``) and a follower in this one both
write a history; ``harness.checker.check`` judges every scenario (no two trust
windows overlap). The lease is long (30 s) and every wait here far shorter, so a
follower that leads before the lease would have ended got there through the lock: the
new term's ``acquired_at`` is compared with the old lease's ``expires_at`` on the
database's clock.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from celery_election import Elector, backend_from_url
from celery_election.backends.locks import lock_key
from celery_election.core.lease import Lease
from celery_election.history import Recorder
from harness.checker import check, load
from harness.proxy import Proxy

from ..conftest import (
    EVERY_SQL,
    MYSQL_DRIVERS,
    PG_DRIVERS,
    one_driver_each,
    server_url,
    unique_prefix,
    url_for,
)

ROOT = Path(__file__).resolve().parents[2]
LONG_TTL = 30.0
NS = "live"
#: Each server through each of its drivers (psycopg 3 and psycopg2, PyMySQL and mysqlclient).
#: Each server on each driver: the tests named "on every driver" (and the standby's slot)
#: are about a driver's own lock calls; the others run one driver per server in the
#: first tier (``one_driver_each``).
SERVERS = [*PG_DRIVERS, *MYSQL_DRIVERS]


class Child:
    """The leader's process; its stdout lines ("elected 7", "revoked 7") in a queue."""

    def __init__(
        self,
        url: str,
        prefix: str,
        history: Path,
        ttl: float = LONG_TTL,
        options: dict[str, Any] | None = None,
        name: str = "child",
    ) -> None:
        args = [sys.executable, "-m", "tests.integration.liveness_child"]
        self.proc = subprocess.Popen(
            [*args, url, prefix, NS, str(history), str(ttl), json.dumps(options or {}), name],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.strip())

    def wait_for(self, kind: str, timeout: float) -> str:
        end = time.monotonic() + timeout
        while (left := end - time.monotonic()) > 0:
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                break
            if line.startswith(kind):
                return line
        raise AssertionError(f"the child did not report {kind!r} within {timeout}s")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
        self.proc.wait(10)


@pytest.fixture
def setup(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, Any]]:
    url = url_for(request.param, tmp_path)
    prefix = unique_prefix()
    backend = backend_from_url(url, table_prefix=prefix)
    backend.install()
    children: list[Child] = []
    electors: list[Elector] = []
    env = {"url": url, "prefix": prefix, "backend": backend, "history": tmp_path / "h.jsonl"}
    env["children"], env["electors"] = children, electors
    try:
        yield env
    finally:
        for e in electors:
            e.stop()
        for c in children:
            c.close()
        backend.uninstall()
        backend.close()


def _follower(env: dict[str, Any], name: str, liveness: float | None = None, **kw: Any) -> Elector:
    options = {**env.get("options", {}), **kw}
    backend = backend_from_url(env["url"], table_prefix=env["prefix"], **options)
    timings = {} if liveness is None else {"liveness": liveness}
    elector = Elector(backend, NS, candidate_id=name, ttl=LONG_TTL, **timings)
    Recorder(env["history"], role=name).attach(elector)
    env["electors"].append(elector)
    return elector.start()


def _leader_child(env: dict[str, Any], ttl: float = LONG_TTL) -> tuple[Child, Lease]:
    child = Child(env["url"], env["prefix"], env["history"], ttl, env.get("options"))
    env["children"].append(child)
    term = int(child.wait_for("elected", 30).split()[1])
    lease = _wait_tagged(env["backend"], term)
    return child, lease


def _wait_tagged(backend: Any, term: int, timeout: float = LONG_TTL) -> Lease:
    """The lease of ``term`` once its leader holds the lock (the row is tagged).

    The grant's renewal tags it at once; after a lost lock session or a failed wait, a
    regular renewal may be the one that tags it (every 0.4 x ttl: 12 s here, past the
    10 s this waited before).
    """
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        lease = backend.current(NS)
        if lease is not None and lease.term == term and lease.liveness_us is not None:
            return lease
        time.sleep(0.02)
    raise AssertionError(f"term {term} was never tagged as bound by the liveness session")


def _wait_liveness(elector: Elector, state: str = "waiting", timeout: float = 10) -> None:
    end = time.monotonic() + timeout
    while elector.liveness != state:
        assert time.monotonic() < end, f"{elector!r} is not {state} on the lock"
        time.sleep(0.02)


def _no_overlap(env: dict[str, Any]) -> None:
    report = check(load([env["history"]]))
    assert report.violations == []
    assert report.overlap_seconds == 0


def _pg_lock_ids(prefix: str) -> dict[str, int]:
    """The namespace's advisory lock as pg_locks shows it (classid, objid)."""
    k = int.from_bytes(lock_key(prefix, NS)[:8], "big", signed=True) & 0xFFFFFFFFFFFFFFFF
    return {"c": k >> 32, "o": k & 0xFFFFFFFF}


def _pg_lock_waiters(url: str, prefix: str) -> int:
    """How many sessions wait on the namespace's liveness lock (PostgreSQL)."""
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            return int(
                conn.execute(
                    sa.text(
                        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                        "AND NOT granted AND classid = :c AND objid = :o"
                    ),
                    _pg_lock_ids(prefix),
                ).scalar_one()
            )
    finally:
        engine.dispose()


def _kill_lock_session(env: dict[str, Any]) -> None:
    """End the lock holder's session from the server side (the leader lives on)."""
    key = lock_key(env["prefix"], NS)
    engine = sa.create_engine(env["url"])
    with engine.connect() as conn:
        if engine.dialect.name == "postgresql":
            pid = conn.execute(
                sa.text(
                    "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted "
                    "AND classid = :c AND objid = :o"
                ),
                _pg_lock_ids(env["prefix"]),
            ).scalar_one()
            conn.execute(sa.text("SELECT pg_terminate_backend(:p)"), {"p": pid})
        else:
            name = "celery_election:" + key.hex()[:40]
            cid = conn.execute(sa.text("SELECT IS_USED_LOCK(:n)"), {"n": name}).scalar_one()
            conn.execute(sa.text(f"KILL {int(cid)}"))
    engine.dispose()


def _fault_under_a_leader(
    env: dict[str, Any], fault: str, why: str
) -> tuple[Child, Lease, Lease, Elector]:
    """A leader child and a follower waiting on the lock; ``fault`` (kill / pause) hits
    the child; the follower must take over before the old lease could have ended."""
    child, old = _leader_child(env)
    follower = _follower(env, "follower")
    _wait_liveness(follower)
    child.proc.send_signal(signal.SIGKILL if fault == "kill" else signal.SIGSTOP)
    assert follower.wait_for_leadership(timeout=15), why
    new = env["backend"].current(NS)
    assert new.acquired_at_us < old.expires_at_us  # through the lock, not the lease
    return child, old, new, follower


@pytest.mark.parametrize("setup", one_driver_each(EVERY_SQL), indirect=True)
def test_a_crashed_leader_is_replaced_through_the_lock_before_its_lease_ends(
    setup: dict[str, Any],
) -> None:
    _, old, new, _ = _fault_under_a_leader(setup, "kill", "no take-over through the lock")
    assert new.term > old.term and new.leader_id == "follower"
    assert new.liveness_us is not None  # the new leader is bound by the lock in turn
    _no_overlap(setup)


@pytest.mark.parametrize("setup", one_driver_each(SERVERS), indirect=True)
def test_a_paused_leader_loses_the_lock_to_the_idle_timeout_and_changes_nothing_after(
    setup: dict[str, Any],
) -> None:
    env = setup
    child, old, new, follower = _fault_under_a_leader(
        env, "pause", "the idle timeout never freed the lock"
    )
    # The stale leader resumes: it must find out it lost, and take nothing back.
    child.proc.send_signal(signal.SIGCONT)
    line = child.wait_for("revoked", 15)
    assert line.split()[1] == str(old.term)
    assert follower.is_leader and env["backend"].current(NS).term == new.term
    _no_overlap(env)


@pytest.mark.parametrize("setup", one_driver_each(SERVERS), indirect=True)
def test_killing_the_lock_session_under_a_live_leader_never_makes_two_leaders(
    setup: dict[str, Any],
) -> None:
    env = setup
    _leader_child(env)
    follower = _follower(env, "follower")
    _wait_liveness(follower)
    killed_at = env["backend"].current(NS).db_now_us
    _kill_lock_session(env)
    # The follower is granted the lock at once, but must wait the leader's delta; the
    # leader, still alive, renews without the lock's tag before its ping trust ends. Either
    # may lead afterwards: exactly one does, and never two at once.
    end = time.monotonic() + 10
    while time.monotonic() < end:
        lease = env["backend"].current(NS)
        if lease.liveness_us is not None and lease.renewed_at_us > killed_at:
            break  # someone holds the lock again and leads bound by it
        time.sleep(0.05)
    else:
        raise AssertionError("nobody led under the lock again after the kill")
    _no_overlap(env)


@pytest.mark.parametrize("setup", one_driver_each(EVERY_SQL), indirect=True)
def test_a_resign_wakes_a_follower_blocked_on_the_lock_at_once(setup: dict[str, Any]) -> None:
    env = setup
    # A liveness of 3 s, not the default 1 s: a lock session starved of pings for 1 s
    # under a full suite was ended by the server (MariaDB's wait_timeout), and its term not
    # tagged in 30 s (CI, and here once); the lock's wake-up is what this test is about.
    leader = _follower(env, "first", liveness=3.0)
    assert leader.wait_for_leadership(10)
    _wait_tagged(env["backend"], leader.term or 0)
    # No NOTIFY and a 60 s fallback: only the lock's release can wake the follower.
    opts = {"listen": False} if "postgresql" in env["url"] else {}
    follower = _follower(env, "second", liveness=3.0, **opts)
    _wait_liveness(follower)
    leader.resign()
    assert follower.wait_for_leadership(timeout=10), "the released lock did not wake it"
    # it won holding the lock: its term is tagged (by the win, or by its first renewal)
    _wait_tagged(env["backend"], follower.term or 0)
    _no_overlap(env)


@pytest.mark.parametrize("setup", ["sqlite"], indirect=True)
def test_a_follower_that_cannot_get_the_lock_falls_back_to_the_lease(
    setup: dict[str, Any],
) -> None:
    """SQLite: a stopped holder keeps its file lock; the lease still hands over."""
    env = setup
    ttl = 3.0
    child, old = _leader_child(env, ttl=ttl)
    follower = _follower(env, "follower")
    _wait_liveness(follower)
    child.proc.send_signal(signal.SIGSTOP)
    assert follower.wait_for_leadership(timeout=15), "the lease did not hand over"
    new = env["backend"].current(NS)
    assert new.acquired_at_us >= old.expires_at_us  # waited out the lease, as without liveness
    assert new.liveness_us is None  # the lock is still the stopped process's
    assert follower.liveness == "waiting"
    child.proc.send_signal(signal.SIGCONT)
    child.wait_for("revoked", 15)
    _no_overlap(env)


def test_the_lock_file_sits_beside_the_sqlite_database(tmp_path: Path) -> None:
    backend = backend_from_url(f"sqlite:///{tmp_path}/e.db")
    session = backend.liveness_session("ns", 1.0, 5.0)
    assert session is not None
    assert session.acquire(0.1) and session.has_lock
    assert [p.name for p in tmp_path.glob("e.db.*.lock")] != []
    other = backend.liveness_session("ns", 1.0, 5.0)
    assert other is not None and not other.acquire(0.05)  # one holder per namespace
    session.close()
    assert other.acquire(1.0)  # closing the holder's descriptor released it
    other.close()
    backend.close()


@pytest.mark.parametrize("setup", one_driver_each(SERVERS), indirect=True)
def test_a_leader_whose_link_stalls_mid_renew_is_replaced_through_the_lock(
    setup: dict[str, Any],
) -> None:
    """The link freezes just after a renew's UPDATE reached the server (a half-open TCP
    connection): the leader's lock session goes quiet, so the server frees the lock, and
    the follower must take over well before the lease ends (a renew left open in a
    transaction would hold the row until the server gave up on it, 2 x call_timeout on
    PostgreSQL and never on MySQL)."""
    env = setup
    ttl = 10.0
    proxy, via = Proxy.for_url(env["url"])
    backend = backend_from_url(via, table_prefix=env["prefix"])
    leader = Elector(backend, NS, candidate_id="leader", ttl=ttl)
    Recorder(env["history"], role="leader").attach(leader)
    stall_next_renew = threading.Event()
    stalled_at: list[int] = []

    @sa.event.listens_for(backend.engine, "after_cursor_execute")
    def _stall(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        renew = "UPDATE" in statement and f"{env['prefix']}lease" in statement
        if renew and stall_next_renew.is_set() and not stalled_at:
            proxy.stall()  # the UPDATE ran; its COMMIT (if any) never arrives
            stalled_at.append(time.monotonic_ns())

    try:
        leader.start()
        assert leader.wait_for_leadership(10)
        old = _wait_tagged(env["backend"], leader.term or 0)
        follower = Elector(
            backend_from_url(env["url"], table_prefix=env["prefix"]), NS, "follower", ttl=ttl
        )
        Recorder(env["history"], role="follower").attach(follower)
        env["electors"].append(follower)
        follower.start()
        _wait_liveness(follower)
        stall_next_renew.set()
        assert follower.wait_for_leadership(timeout=ttl * 2), "nobody took over"
        assert stalled_at, "the stall never happened"
        waited = (time.monotonic_ns() - stalled_at[0]) / 1e9
        new = env["backend"].current(NS)
        # Through the lock: about 2 x delta (1 s) after the stall, and well before the
        # lease of the stalled renew could end (its renew + ttl).
        assert new.term > old.term and new.leader_id == "follower"
        waited = (time.monotonic_ns() - stalled_at[0]) / 1e9
        assert waited < ttl / 2, f"took over {waited:.1f}s after the stall"
    finally:
        proxy.resume()
        leader.stop()
        backend.close()
        proxy.close()
    _no_overlap(env)


def _tcp_ports(pids: list[int]) -> set[int]:
    """Local ports of the TCP sockets the processes ``pids`` hold open (Linux /proc)."""
    inodes = set()
    for pid in pids:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[9] in inodes:
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def _backend_pid_alive(follower: Elector) -> bool:
    """Whether ``follower``'s lock session is a server session now (PostgreSQL)."""
    conn = follower._live.session._conn  # type: ignore[union-attr]
    if conn is None:
        return False
    engine = sa.create_engine(server_url("postgresql"), poolclass=sa.pool.NullPool)
    with engine.connect() as check:
        found = check.execute(
            sa.text("SELECT count(*) FROM pg_stat_activity WHERE pid = :p"),
            {"p": conn.info.backend_pid},
        ).scalar_one()
    engine.dispose()
    return bool(found)


def _connections(pids: list[int], application_name: str) -> int:
    """PostgreSQL sessions named ``application_name`` that the processes ``pids`` hold."""
    ports = _tcp_ports(pids)
    engine = sa.create_engine(server_url("postgresql"), poolclass=sa.pool.NullPool)
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text("SELECT client_port FROM pg_stat_activity WHERE application_name = :a"),
            {"a": application_name},
        ).scalars()
        count = sum(1 for port in rows if port in ports)
    engine.dispose()
    return count


@pytest.mark.parametrize("setup", one_driver_each(EVERY_SQL), indirect=True)
def test_only_the_standbys_wait_on_the_lock_and_a_cold_one_fills_a_freed_slot(
    setup: dict[str, Any],
) -> None:
    """Six candidates, two standby slots: the leader holds the lock, two wait on it, three
    are cold (no connection). The leader dies: a waiting one takes over through the lock
    and its freed slot goes to a cold one, so two wait again."""
    env = setup
    child, old = _leader_child(env)
    followers = []
    # a cold one tries for a slot once per fallback_interval: 7 s here (a follower gives
    # its lease connection back before a wait of a ttl or more: 7 s +- 10 % jitter)
    for i in range(5):
        follower = Elector(
            backend_from_url(env["url"], table_prefix=env["prefix"]),
            NS,
            f"f{i}",
            ttl=6.0,
            fallback_interval=7.0,
        )
        Recorder(env["history"], role=follower.candidate_id).attach(follower)
        env["electors"].append(follower)
        followers.append(follower.start())
    deadline = time.monotonic() + 15
    while sorted(f.liveness for f in followers) != ["standby"] * 3 + ["waiting"] * 2:
        assert time.monotonic() < deadline, [f.liveness for f in followers]
        time.sleep(0.05)
    if env["backend"].dialect != "sqlite":
        # The cold hold no lock session (between their tries for a slot: wait for one
        # such moment), the waiting one each; and no follower keeps a lease connection
        # while it waits (each gives it back after its step; one may be mid-step).
        end = time.monotonic() + 10
        while not all(
            (f._live.session._conn is None) == (f.liveness == "standby")  # type: ignore[union-attr]
            and f.backend.engine.pool.checkedin() == 0  # type: ignore[attr-defined]
            for f in followers
        ):
            assert time.monotonic() < end, "a cold standby or a waiting follower holds a connection"
            time.sleep(0.1)
        if env["backend"].dialect == "postgresql":  # and the server agrees
            leader_and_waiting = _connections([child.proc.pid], "celery-election-liveness") + sum(
                _backend_pid_alive(f) for f in followers
            )
            assert leader_and_waiting == 3, leader_and_waiting
    hot = {f.candidate_id for f in followers if f.liveness == "waiting"}
    child.proc.send_signal(signal.SIGKILL)
    end = time.monotonic() + 15
    while not any(f.is_leader for f in followers):
        assert time.monotonic() < end, "no standby took over"
        time.sleep(0.02)
    (new_leader,) = [f for f in followers if f.is_leader]
    assert new_leader.candidate_id in hot  # a hot standby, through the lock:
    assert env["backend"].current(NS).acquired_at_us < old.expires_at_us
    rest = [f for f in followers if f is not new_leader]
    end = time.monotonic() + 30  # a cold one tries for a slot every fallback (7 s)
    while sorted(f.liveness for f in rest) != ["standby"] * 2 + ["waiting"] * 2:
        assert time.monotonic() < end, [f.liveness for f in rest]
        time.sleep(0.1)
    _no_overlap(env)


@pytest.mark.parametrize("setup", SERVERS, indirect=True)
def test_a_lock_wait_is_cut_from_another_thread_on_every_driver(setup: dict[str, Any]) -> None:
    """``interrupt()`` (a stop() of a waiting follower) ends a blocked lock wait at once:
    psycopg2 through its ``fileno()``, mysqlclient through the socket noted at connect (it
    refuses every method, ``fileno()`` too, while another thread is in a call)."""
    backend = setup["backend"]
    holder = backend.liveness_session(NS, 1.0, 30.0)
    waiter = backend.liveness_session(NS, 1.0, 30.0)
    try:
        assert holder.acquire(1.0)
        holder.ping()
        timer = threading.Timer(0.3, waiter.interrupt)
        timer.start()
        started = time.monotonic()
        with pytest.raises(InterruptedError):
            # delta 1 s: the holder's silent session ends after about 1 s, so a missed
            # interrupt shows as a grant, not as a hang
            waiter.acquire(20.0)
        assert time.monotonic() - started < 0.9
    finally:
        holder.close()
        waiter.close()


@pytest.mark.parametrize("setup", SERVERS, indirect=True)
def test_an_interrupt_that_came_before_the_wait_ends_it_as_it_starts(
    setup: dict[str, Any],
) -> None:
    """A stop() while the session was still connecting: the flag ends the wait before it
    starts (else it waited out the whole lock timeout), once; the next wait is a wait.
    (The cut from another thread above reaches this path only when its timer wins.)"""
    waiter = setup["backend"].liveness_session(NS, 1.0, 30.0)
    try:
        waiter.interrupt()  # no connection yet: only the flag
        with pytest.raises(InterruptedError):
            waiter.acquire(20.0)
        assert waiter.acquire(5.0)  # nobody holds it: granted
    finally:
        waiter.close()


def test_a_liveness_session_that_cannot_connect_is_lost_not_raised_raw() -> None:
    """A server that refuses the connection: the session's calls raise
    BackendUnavailableError naming the session (the lock thread backs off on it)."""
    from celery_election.errors import BackendUnavailableError

    backend = backend_from_url("postgresql+psycopg://postgres@127.0.0.1:1/test")
    session = backend.liveness_session(NS, 1.0, 5.0)
    try:
        with pytest.raises(BackendUnavailableError, match=r"liveness session to .* lost"):
            session.acquire(1.0)
    finally:
        session.close()
        backend.close()


@pytest.mark.parametrize("setup", SERVERS, indirect=True)
def test_a_lock_wait_that_times_out_keeps_its_session_on_every_driver(
    setup: dict[str, Any],
) -> None:
    """A bounded wait that ends unanswered is "not granted", not a lost session: the
    driver's lock-timeout error is recognised (psycopg 3 ``sqlstate``, psycopg2 ``pgcode``)."""
    backend = setup["backend"]
    holder = backend.liveness_session(NS, 5.0, 30.0)
    waiter = backend.liveness_session(NS, 5.0, 30.0)
    try:
        assert holder.acquire(1.0)
        assert waiter.acquire(1.0) is False
        assert waiter._conn is not None and not waiter.has_lock  # the same session waits on
        holder.release()
        assert waiter.acquire(5.0) and waiter.has_lock
    finally:
        holder.close()
        waiter.close()


@pytest.mark.parametrize("setup", SERVERS, indirect=True)
def test_a_standby_gone_in_its_lock_wait_frees_its_slot_within_delta(
    setup: dict[str, Any],
) -> None:
    """A server notices a closed client only when it next talks to it: a standby that died
    (or gave up) in its lock wait stayed queued, holding its standby slot, until the wait
    timed out (fallback_interval), and a newer candidate found every slot taken (a rolling
    upgrade handed the vacancy back to an older release). The server ends it within delta."""
    backend = setup["backend"]
    holder = backend.liveness_session(NS, 30.0, 30.0)  # silent the whole test, still held
    gone = backend.liveness_session(NS, 1.0, 30.0)
    newcomer = backend.liveness_session(NS, 1.0, 30.0)
    try:
        assert holder.acquire(1.0)
        holder.ping()
        assert gone.claim_slot(1)

        def wait() -> None:
            with contextlib.suppress(InterruptedError):
                gone.acquire(30.0)

        waiting = threading.Thread(target=wait)
        waiting.start()
        if backend.dialect == "postgresql":  # queued on the lock before it goes
            end = time.monotonic() + 10
            while _pg_lock_waiters(setup["url"], setup["prefix"]) != 1:
                assert time.monotonic() < end, "the standby never waited on the lock"
                time.sleep(0.02)
        gone.interrupt()  # its socket is shut, as a killed process's is
        waiting.join(10)
        started = time.monotonic()
        while not newcomer.claim_slot(1):
            assert time.monotonic() - started < 3.0, "the gone standby's slot is still held"
            time.sleep(0.05)
        if backend.dialect == "postgresql":
            assert _pg_lock_waiters(setup["url"], setup["prefix"]) == 0
    finally:
        holder.close()
        gone.close()
        newcomer.close()
