"""Connection plumbing for the SQL backends: private engines, call deadlines, errors.

Why each piece exists (docs/design.md, "Rules found by experiment"):

* ``classify``: lock timeouts, deadlocks, duplicate keys and SQLite's busy errors mean
  "lost this round" (rule 1), a missing table means ``SchemaMissingError``, connection
  errors mean the backend is unavailable.
* The watchdog: every call has a client-side deadline; a stalled socket is shut down
  from another thread (SQLAlchemy's pre-ping froze past 8 s despite server timeouts,
  rule 8).
* ``private_engine``: the elector never shares the application's pool; per-dialect
  session timeouts, SQLite's WAL and BEGIN IMMEDIATE, and a network-filesystem refusal
  (rule 11); after a fork the child drops the parent's connections without closing them
  (rule 12). ``fork_lock`` keeps forks out of in-process SQLite calls.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import weakref
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import URL, Connection, Engine
from sqlalchemy.exc import DBAPIError

from ..errors import ConfigurationError

__all__ = [
    "WATCHDOG",
    "Deadline",
    "LostRound",
    "classify",
    "fork_lock",
    "interrupt",
    "one_line",
    "pg_connect_args",
    "private_engine",
]

log = logging.getLogger("celery_election.backends.sql")

# -- error classification -------------------------------------------------------------------

_PG_CONTENTION = {"40P01", "55P03", "40001", "23505", "57014"}
_PG_MISSING = {"42P01"}
_PG_READ_ONLY = {"25006"}  # read_only_sql_transaction: a hot standby
_MYSQL_CONTENTION = {1213, 1205, 1062, 1969, 3024}
_MYSQL_MISSING = {1146}


class LostRound(Exception):
    """The step lost to contention; nothing changed."""


def classify(exc: DBAPIError) -> str:
    orig = exc.orig
    sqlstate = getattr(orig, "sqlstate", None)
    if sqlstate in _PG_CONTENTION:
        return "contention"
    if sqlstate in _PG_MISSING:
        return "missing"
    if sqlstate in _PG_READ_ONLY:
        return "read-only"
    code = orig.args[0] if orig is not None and orig.args else None
    if type(orig).__module__.startswith("pymysql"):
        if code in _MYSQL_CONTENTION:
            return "contention"
        if code in _MYSQL_MISSING:
            return "missing"
    message = str(orig).lower()
    if type(orig).__module__.startswith("sqlite3"):
        if "locked" in message or "busy" in message:
            return "contention"
        if "no such table" in message:
            return "missing"
        if not any(w in message for w in ("interrupt", "unable to open", "disk", "readonly")):
            return "other"  # a bad statement, not an unreachable file
    if exc.connection_invalidated or isinstance(
        exc, (sa.exc.OperationalError, sa.exc.InterfaceError)
    ):
        return "unavailable"
    return "other"


# -- call deadlines -------------------------------------------------------------------------


def interrupt(dbapi_conn: Any) -> None:
    """Make a call blocked on this DBAPI connection fail now, from another thread."""
    if hasattr(dbapi_conn, "interrupt"):  # sqlite3
        dbapi_conn.interrupt()
        return
    sock: socket.socket | None = None
    pgconn = getattr(dbapi_conn, "pgconn", None)
    if pgconn is not None:  # psycopg 3: the socket is libpq's fd
        try:
            sock = socket.socket(fileno=os.dup(pgconn.socket))
        except Exception:  # already closed
            return
        try:
            with suppress(OSError):  # already disconnected: nothing left to interrupt
                sock.shutdown(socket.SHUT_RDWR)
        finally:
            sock.close()
        return
    raw = getattr(dbapi_conn, "_sock", None)  # PyMySQL
    if raw is not None:
        with suppress(OSError):
            raw.shutdown(socket.SHUT_RDWR)


class Deadline:
    """One database call's deadline, watched by the process's watchdog thread."""

    __slots__ = ("at", "dbapi_conn", "fired")

    def __init__(self, dbapi_conn: Any, at: float | None) -> None:
        self.dbapi_conn, self.at, self.fired = dbapi_conn, at, False

    def cancel(self) -> None:
        WATCHDOG.disarm(self)


class Watchdog:
    """One thread per process that interrupts calls outliving their deadline.

    (A threading.Timer per call cost a thread start, ~0.1 ms of CPU, on every statement.)
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._armed: set[Deadline] = set()
        self._pid = 0
        self._waiting_until: float | None = None

    def arm(self, dbapi_conn: Any, timeout: float | None) -> Deadline:
        deadline = Deadline(dbapi_conn, None if timeout is None else time.monotonic() + timeout)
        if deadline.at is None:
            return deadline
        with self._cond:
            if self._pid != os.getpid():  # first use, or a forked child: no thread yet
                self._pid = os.getpid()
                self._armed.clear()
                threading.Thread(
                    target=self._run, name="celery-election-watchdog", daemon=True
                ).start()
            self._armed.add(deadline)
            if self._waiting_until is None or deadline.at < self._waiting_until:
                self._cond.notify()
        return deadline

    def disarm(self, deadline: Deadline) -> None:
        if deadline.at is not None:
            with self._cond:
                self._armed.discard(deadline)

    def _run(self) -> None:
        with self._cond:
            while True:
                now = time.monotonic()
                for d in [d for d in self._armed if d.at is not None and d.at <= now]:
                    self._armed.discard(d)
                    d.fired = True
                    try:
                        interrupt(d.dbapi_conn)
                    except Exception:  # pragma: no cover - best effort
                        log.debug("could not interrupt a stalled call", exc_info=True)
                ats = [d.at for d in self._armed if d.at is not None]
                self._waiting_until = min(ats) if ats else None
                self._cond.wait(None if self._waiting_until is None else self._waiting_until - now)


WATCHDOG = Watchdog()


# -- engines --------------------------------------------------------------------------------

_NETWORK_FILESYSTEMS = {"nfs", "nfs4", "cifs", "smbfs", "smb3", "fuse.sshfs", "9p", "afs", "ceph"}


def filesystem_type(path: Path) -> str | None:
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return None
    best, fstype = "", None
    target = str(path)
    for line in mounts:
        parts = line.split()
        if len(parts) >= 3:
            mnt = parts[1].replace("\\040", " ")
            inside = target == mnt or target.startswith(mnt.rstrip("/") + "/")
            if inside and len(mnt) > len(best):
                best, fstype = mnt, parts[2]
    return fstype


def fork_lock() -> threading.Lock:
    """A lock that ``os.fork()`` takes first, so no fork lands inside a guarded call."""
    lock = threading.Lock()
    ref = weakref.ref(lock)

    def before() -> None:
        held = ref()
        if held is not None:
            held.acquire()

    def after() -> None:
        held = ref()
        if held is not None and held.locked():
            held.release()

    os.register_at_fork(before=before, after_in_parent=after, after_in_child=after)
    return lock


def _dispose_in_child(ref: weakref.ref[Engine]) -> Callable[[], None]:
    def after_fork() -> None:
        engine = ref()
        if engine is not None:
            # close=False: the parent still owns those sockets; closing them here would
            # break the parent's connections (docs/design.md, rule 12).
            engine.dispose(close=False)

    return after_fork


def pg_connect_args(connect_timeout: float, application_name: str) -> dict[str, Any]:
    """The psycopg arguments of every connection the election opens to PostgreSQL.

    ``prepare_threshold=None``: psycopg prepares a statement run five times, and a
    transaction pooler (PgBouncer in transaction mode) hands the next call to a server
    session that never saw it ("prepared statement _pg3_1 does not exist").
    Keepalives: a dead peer is noticed in seconds, not after the kernel's two hours.
    """
    return {
        "connect_timeout": max(1, round(connect_timeout)),
        "application_name": application_name,
        "prepare_threshold": None,
        "keepalives": 1,
        "keepalives_idle": 5,
        "keepalives_interval": 2,
        "keepalives_count": 3,
    }


def private_engine(
    url: URL,
    *,
    statement_timeout: float,
    connect_timeout: float,
    sqlite_busy_timeout: float,
    allow_network_filesystem: bool,
    engine_options: dict[str, Any],
) -> Engine:
    backend = url.get_backend_name()
    options: dict[str, Any] = {"pool_pre_ping": False, "pool_recycle": 1800}
    connect_args: dict[str, Any] = {}
    if backend == "sqlite":
        database = url.database or ""
        is_uri = str(url.query.get("uri", "")).lower() in ("true", "1")
        in_memory = database in ("", ":memory:") or database.startswith("file::memory:")
        if in_memory or (is_uri and "mode=memory" in str(url)):
            raise ConfigurationError(
                "an in-memory SQLite database cannot be shared between processes or "
                "connections: give a file path (sqlite:////abs/path/election.db), or use "
                "MemoryBackend for in-process tests"
            )
        if is_uri:
            raise ConfigurationError(
                f"SQLite URI filenames (uri=true) are not supported for the election "
                f"database: give a plain path like sqlite:////abs/path/election.db, "
                f"got {url.render_as_string(hide_password=True)}"
            )
        path = Path(database).expanduser().resolve()
        url = url.set(database=str(path))
        fstype = filesystem_type(path.parent)
        if fstype in _NETWORK_FILESYSTEMS and not allow_network_filesystem:
            raise ConfigurationError(
                f"SQLite election file {path} is on a network filesystem ({fstype}): its "
                f"locks are not reliable there. Use PostgreSQL or MySQL, or pass "
                f"allow_network_filesystem=True if you know its locking works"
            )
        connect_args["timeout"] = sqlite_busy_timeout
        connect_args["check_same_thread"] = False
    elif backend == "postgresql":
        connect_args.update(
            pg_connect_args(connect_timeout, "celery-election"),
            tcp_user_timeout=int(statement_timeout * 1000),
        )
        options.update(pool_size=2, max_overflow=4)
    elif backend in ("mysql", "mariadb"):
        connect_args.update(
            connect_timeout=max(1, round(connect_timeout)),
            read_timeout=statement_timeout,
            write_timeout=statement_timeout,
        )
        options.update(pool_size=2, max_overflow=4)
    if backend != "sqlite":
        # Each call is one statement (or a few whose order, not atomicity, matters): run
        # them in autocommit, so the server commits a step as it executes it and never
        # holds a lease or beat row while waiting for the client's COMMIT. A link that
        # froze between the two (half-open TCP) held the row against a take-over until the
        # server gave up on the session: 2 x call_timeout on PostgreSQL, never on MySQL.
        # Transactions that need one ask for it (SQLBackend._transaction). On PostgreSQL
        # it also saves the BEGIN and COMMIT round trips.
        options["isolation_level"] = "AUTOCOMMIT"
    options["connect_args"] = {**connect_args, **engine_options.pop("connect_args", {})}
    options.update(engine_options)
    engine = sa.create_engine(url, **options)

    if backend == "sqlite":

        @sa.event.listens_for(engine, "connect")
        def _sqlite_connect(dbapi_conn: Any, record: Any) -> None:
            # Let SQLAlchemy's "begin" event issue BEGIN itself (pysqlite would defer it).
            dbapi_conn.isolation_level = None
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.close()

        @sa.event.listens_for(engine, "begin")
        def _sqlite_begin(conn: Connection) -> None:
            # Writers take the write lock at BEGIN, where the busy timeout waits for it,
            # instead of failing to upgrade a read lock midway.
            mode = "DEFERRED" if conn.get_execution_options().get("_election_read") else "IMMEDIATE"
            conn.exec_driver_sql(f"BEGIN {mode}")

    elif backend == "postgresql":
        ms = int(statement_timeout * 1000)

        @sa.event.listens_for(engine, "connect")
        def _pg_connect(dbapi_conn: Any, record: Any) -> None:
            # Session settings, set once per connection (a SET LOCAL per transaction would
            # double the statement count). Behind PgBouncer in transaction mode these may
            # not stick; the client-side call deadline still bounds every call.
            with dbapi_conn.cursor() as cur:
                cur.execute(f"SET statement_timeout = {ms}")
                cur.execute(f"SET lock_timeout = {ms}")
                cur.execute(f"SET idle_in_transaction_session_timeout = {ms * 2}")
            dbapi_conn.commit()

    elif backend in ("mysql", "mariadb"):
        secs = statement_timeout

        @sa.event.listens_for(engine, "connect")
        def _mysql_connect(dbapi_conn: Any, record: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute(f"SET SESSION innodb_lock_wait_timeout = {max(1, round(secs))}")
            cur.execute("SET SESSION sql_mode = CONCAT(@@sql_mode, ',STRICT_ALL_TABLES')")
            if "mariadb" in dbapi_conn.get_server_info().lower():
                cur.execute(f"SET SESSION max_statement_time = {secs}")
            cur.close()

    os.register_at_fork(after_in_child=_dispose_in_child(weakref.ref(engine)))
    return engine


def one_line(exc: BaseException) -> str:
    """The driver's message on one line (libpq's spans several)."""
    text = str(getattr(exc, "orig", None) or exc)
    return "; ".join(line.strip() for line in text.splitlines() if line.strip())
