"""The lease on a SQL database, through SQLAlchemy Core: SQLite, PostgreSQL, MySQL/MariaDB.

How each step stays correct (DESIGN.md, "Rules found by experiment"):

* One conditional UPDATE by primary key per step, in its own short transaction, with every
  condition in its WHERE clause and the new term computed in SQL. Whoever changed the row
  won. Nothing is decided from an earlier read, so two racing candidates can never both
  win: the database serialises the writes and re-checks the WHERE on the winner's row.
* The lease row always exists: the first elect of a namespace inserts it vacant with an
  idempotent insert, then retries its UPDATE.
* The database clock decides. Times are BIGINT epoch microseconds computed by the
  database inside the statement (``statement_timestamp()``, ``UTC_TIMESTAMP(6)``,
  ``julianday('now')``); no host clock is ever written or compared.
* New term = greatest(term + 1, database epoch in microseconds): strictly increasing, and
  still increasing after the table is dropped and re-created or restored from a backup.
  (Milliseconds, as first planned, repeated a term when uninstall, install and elect
  fell within one millisecond.)
* Renew and resign match the exact (token, term); the token is a per-instance secret.
* Lock timeouts, deadlocks, duplicate keys and SQLite's busy errors mean "lost this
  round"; connection errors mean the backend is unavailable. Each call has a deadline:
  when it passes, the connection's socket is shut down and the connection discarded.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import re
import socket
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.dialects import mysql, postgresql, sqlite
from sqlalchemy.engine import URL, Connection, Engine, make_url
from sqlalchemy.exc import DBAPIError, NoSuchTableError
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.orm import Session
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.functions import FunctionElement

from ..config import validate_candidate_id, validate_namespace
from ..errors import BackendUnavailableError, ConfigurationError, SchemaMissingError
from ..term import CandidateInfo, ElectResult, Lease
from .base import Wakeup, WakeupHandle

__all__ = ["DEFAULT_TABLE_PREFIX", "SQLBackend", "make_metadata"]

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Where a caller's own transaction can be passed: a Core Connection or an ORM Session.
Caller = Connection | Session

DEFAULT_TABLE_PREFIX = "celery_election_"
_PREFIX = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,39}")
_TOKEN_LENGTH = 32

# -- database clock -------------------------------------------------------------------------


class db_now_us(FunctionElement[int]):
    """The database's clock in epoch microseconds, fixed for the whole statement."""

    type = sa.BigInteger()
    inherit_cache = True


class greatest(FunctionElement[int]):
    """GREATEST(a, b); SQLite spells it max(a, b)."""

    type = sa.BigInteger()
    inherit_cache = True


def _unsupported(element: Any, compiler: SQLCompiler, **kw: Any) -> str:
    raise ConfigurationError(
        f"celery_election supports SQLite, PostgreSQL and MySQL/MariaDB, "
        f"not {compiler.dialect.name}"
    )


compiles(db_now_us)(_unsupported)

# PostgreSQL's now() is frozen at transaction start; statement_timestamp() is not.
compiles(db_now_us, "postgresql")(
    lambda e, c, **kw: "CAST(EXTRACT(EPOCH FROM statement_timestamp()) * 1000000 AS BIGINT)"
)
# UTC_TIMESTAMP ignores the session time zone; (6) keeps the microseconds.
_MYSQL_NOW_US = "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))"
compiles(db_now_us, "mysql")(lambda e, c, **kw: _MYSQL_NOW_US)
# SQLite's 'now' is the host clock, constant within one statement step.
compiles(db_now_us, "sqlite")(
    lambda e, c, **kw: "CAST((julianday('now') - 2440587.5) * 86400000000.0 AS INTEGER)"
)
compiles(greatest)(lambda e, c, **kw: f"GREATEST({c.process(e.clauses, **kw)})")
compiles(greatest, "sqlite")(lambda e, c, **kw: f"max({c.process(e.clauses, **kw)})")


# -- schema ---------------------------------------------------------------------------------


def _key(length: int) -> sa.types.TypeEngine[str]:
    # MySQL's default collation folds case, accents and trailing spaces: 'prod', 'PROD '
    # and 'PRÖD' would be one namespace. Binary collation keeps them apart.
    return sa.String(length).with_variant(
        mysql.VARCHAR(length, charset="utf8mb4", collation="utf8mb4_bin"), "mysql", "mariadb"
    )


def make_metadata(table_prefix: str = DEFAULT_TABLE_PREFIX) -> sa.MetaData:
    """The election tables as SQLAlchemy ``MetaData``, e.g. for an Alembic env."""
    metadata = sa.MetaData()
    mysql_opts: dict[str, Any] = {"mysql_engine": "InnoDB", "mysql_charset": "utf8mb4"}
    sa.Table(
        f"{table_prefix}lease",
        metadata,
        sa.Column("namespace", _key(190), primary_key=True),
        sa.Column("term", sa.BigInteger, nullable=False, default=0),
        sa.Column("token", _key(_TOKEN_LENGTH), nullable=True),
        sa.Column("leader_id", sa.String(255), nullable=True),
        sa.Column("acquired_at", sa.BigInteger, nullable=True),
        sa.Column("renewed_at", sa.BigInteger, nullable=True),
        sa.Column("expires_at", sa.BigInteger, nullable=False, default=0),
        **mysql_opts,
    )
    sa.Table(
        f"{table_prefix}candidate",
        metadata,
        sa.Column("namespace", _key(190), primary_key=True),
        sa.Column("token", _key(_TOKEN_LENGTH), primary_key=True),
        sa.Column("candidate_id", sa.String(255), nullable=False),
        sa.Column("hostname", sa.String(255), nullable=False),
        sa.Column("pid", sa.Integer, nullable=False),
        sa.Column("registered_at", sa.BigInteger, nullable=False),
        sa.Column("heartbeat_at", sa.BigInteger, nullable=False),
        sa.Column("expires_at", sa.BigInteger, nullable=False),
        sa.Index(f"{table_prefix}candidate_expiry", "namespace", "expires_at"),
        **mysql_opts,
    )
    # Beat: one row per (namespace, entry) with the last claimed nominal due time...
    sa.Table(
        f"{table_prefix}beat_state",
        metadata,
        sa.Column("namespace", _key(190), primary_key=True),
        sa.Column("entry_key", _key(40), primary_key=True),  # sha1 of the entry name
        sa.Column("entry_name", sa.String(500), nullable=False),
        sa.Column("last_due", sa.BigInteger, nullable=False),
        sa.Column("total_run_count", sa.BigInteger, nullable=False, default=0),
        sa.Column("updated_at", sa.BigInteger, nullable=False),
        **mysql_opts,
    )
    # ...and the ledger: a tick can be claimed once, by a leader whose lease still holds.
    sa.Table(
        f"{table_prefix}beat_ledger",
        metadata,
        sa.Column("namespace", _key(190), primary_key=True),
        sa.Column("entry_key", _key(40), primary_key=True),
        sa.Column("due", sa.BigInteger, primary_key=True),  # nominal, UTC epoch us
        sa.Column("entry_name", sa.String(500), nullable=False),
        sa.Column("term", sa.BigInteger, nullable=False),
        sa.Column("claimed_at", sa.BigInteger, nullable=False),
        sa.Column("sent_at", sa.BigInteger, nullable=True),
        **mysql_opts,
    )
    return metadata


def entry_key(name: str) -> str:
    """The key of a beat entry: a hash, so any name fits a MySQL primary key."""
    return hashlib.sha1(name.encode("utf-8")).hexdigest()


# -- error classification -------------------------------------------------------------------

_PG_CONTENTION = {"40P01", "55P03", "40001", "23505", "57014"}
_PG_MISSING = {"42P01"}
_MYSQL_CONTENTION = {1213, 1205, 1062, 1969, 3024}
_MYSQL_MISSING = {1146}


class _LostRound(Exception):
    """The step lost to contention; nothing changed."""


def _classify(exc: DBAPIError) -> str:
    orig = exc.orig
    sqlstate = getattr(orig, "sqlstate", None)
    if sqlstate in _PG_CONTENTION:
        return "contention"
    if sqlstate in _PG_MISSING:
        return "missing"
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


def _interrupt(dbapi_conn: Any) -> None:
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
            sock.shutdown(socket.SHUT_RDWR)
        finally:
            sock.close()
        return
    raw = getattr(dbapi_conn, "_sock", None)  # PyMySQL
    if raw is not None:
        with suppress(OSError):
            raw.shutdown(socket.SHUT_RDWR)


class _Deadline:
    """One database call's deadline, watched by the process's watchdog thread."""

    __slots__ = ("at", "dbapi_conn", "fired")

    def __init__(self, dbapi_conn: Any, at: float | None) -> None:
        self.dbapi_conn, self.at, self.fired = dbapi_conn, at, False

    def cancel(self) -> None:
        _WATCHDOG.disarm(self)


class _Watchdog:
    """One thread per process that interrupts calls outliving their deadline.

    (A threading.Timer per call cost a thread start, ~0.1 ms of CPU, on every statement.)
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._armed: set[_Deadline] = set()
        self._pid = 0
        self._waiting_until: float | None = None

    def arm(self, dbapi_conn: Any, timeout: float | None) -> _Deadline:
        deadline = _Deadline(dbapi_conn, None if timeout is None else time.monotonic() + timeout)
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

    def disarm(self, deadline: _Deadline) -> None:
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
                        _interrupt(d.dbapi_conn)
                    except Exception:  # pragma: no cover - best effort
                        log.debug("could not interrupt a stalled call", exc_info=True)
                ats = [d.at for d in self._armed if d.at is not None]
                self._waiting_until = min(ats) if ats else None
                self._cond.wait(None if self._waiting_until is None else self._waiting_until - now)


_WATCHDOG = _Watchdog()


# -- engines --------------------------------------------------------------------------------

_NETWORK_FILESYSTEMS = {"nfs", "nfs4", "cifs", "smbfs", "smb3", "fuse.sshfs", "9p", "afs", "ceph"}


def _filesystem_type(path: Path) -> str | None:
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


def _fork_lock() -> threading.Lock:
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
            # break the parent's connections (DESIGN.md, rule 12).
            engine.dispose(close=False)

    return after_fork


def _private_engine(
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
        fstype = _filesystem_type(path.parent)
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
            connect_timeout=max(1, round(connect_timeout)),
            application_name="celery-election",
            keepalives=1,
            keepalives_idle=5,
            keepalives_interval=2,
            keepalives_count=3,
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


# -- the backend ----------------------------------------------------------------------------


class SQLBackend:
    """Leader election state in SQL tables, one code path for three databases.

    ``url_or_engine`` is a SQLAlchemy URL or an existing Engine. The backend always builds
    its own private engine (from the Engine's URL if given one): the application's pool
    must not be able to starve renewals, and the elector's connections carry their own
    timeouts. Pass ``connection=`` (a Connection or an ORM Session) to a method to run
    that step inside the caller's own transaction instead: it commits or rolls back with
    the caller's work, and is not bounded by a deadline here.
    """

    supports_returning: bool

    def __init__(
        self,
        url_or_engine: str | URL | Engine,
        *,
        table_prefix: str = DEFAULT_TABLE_PREFIX,
        statement_timeout: float = 5.0,
        connect_timeout: float = 5.0,
        sqlite_busy_timeout: float = 1.0,
        allow_network_filesystem: bool = False,
        engine_options: Mapping[str, Any] | None = None,
    ) -> None:
        if isinstance(url_or_engine, Engine):
            url = url_or_engine.url
        else:
            try:
                url = make_url(url_or_engine)
            except Exception as exc:
                raise ConfigurationError(f"not a database URL: {url_or_engine!r} ({exc})") from exc
        if not isinstance(table_prefix, str) or not _PREFIX.fullmatch(table_prefix):
            raise ConfigurationError(
                f"table_prefix (election_table_prefix) must be 1-40 ASCII letters, digits "
                f"and underscores, starting with a letter: got {table_prefix!r}"
            )
        self.table_prefix = table_prefix
        self.engine = _private_engine(
            url,
            statement_timeout=statement_timeout,
            connect_timeout=connect_timeout,
            sqlite_busy_timeout=sqlite_busy_timeout,
            allow_network_filesystem=allow_network_filesystem,
            engine_options=dict(engine_options or {}),
        )
        self.dialect = self.engine.dialect.name
        self.description = self.engine.url.render_as_string(hide_password=True)
        if self.dialect == "sqlite":
            log.info("election database is the SQLite file %s", self.engine.url.database)
        self.metadata = make_metadata(table_prefix)
        self.lease = self.metadata.tables[f"{table_prefix}lease"]
        self.candidate = self.metadata.tables[f"{table_prefix}candidate"]
        self.beat_state = self.metadata.tables[f"{table_prefix}beat_state"]
        self.beat_ledger = self.metadata.tables[f"{table_prefix}beat_ledger"]
        self.supports_returning = bool(self.engine.dialect.update_returning)
        #: Whether a losing step reads the row in the same statement (PostgreSQL does).
        self.reads_in_step = False
        self._closed = False
        # SQLite runs inside this process: a fork while one of our calls holds its
        # allocator mutex leaves the child stuck on the copy. Forks wait for the call.
        self._fork_guard: threading.Lock | contextlib.nullcontext[None]
        self._fork_guard = contextlib.nullcontext()
        if self.dialect == "sqlite":
            self._fork_guard = _fork_lock()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.description} prefix={self.table_prefix!r}>"

    # -- plumbing ---------------------------------------------------------------------------

    @contextmanager
    def _errors(self, table: sa.Table, *, write: bool) -> Iterator[None]:
        try:
            yield
        except DBAPIError as exc:
            kind = _classify(exc)
            if kind == "missing":
                raise SchemaMissingError(table.name, self.description) from exc
            if kind == "contention" and write:
                raise _LostRound() from exc
            if kind in ("unavailable", "contention"):
                error = BackendUnavailableError(
                    f"election database {self.description} is unavailable: {_one_line(exc)}"
                )
                error.connection_invalidated = exc.connection_invalidated
                raise error from (exc.orig or exc)
            raise
        except NoSuchTableError as exc:
            raise SchemaMissingError(table.name, self.description) from exc

    def _run(
        self,
        work: Callable[[Connection], T],
        *,
        table: sa.Table,
        write: bool,
        timeout: float | None,
        connection: Caller | None,
    ) -> T:
        """Run ``work`` in one short transaction of its own, bounded by ``timeout``."""
        if connection is not None:
            # The caller's transaction: no commit, no deadline, no retry here.
            conn = connection.connection() if isinstance(connection, Session) else connection
            with self._errors(table, write=write):
                return work(conn)
        with self._fork_guard:
            return self._run_bounded(work, table=table, write=write, timeout=timeout)

    def _run_bounded(
        self,
        work: Callable[[Connection], T],
        *,
        table: sa.Table,
        write: bool,
        timeout: float | None,
    ) -> T:
        started = time.monotonic()
        for attempt in (1, 2):
            left = None if timeout is None else max(0.05, timeout - (time.monotonic() - started))
            deadline: _Deadline | None = None
            try:
                with self._errors(table, write=write), self.engine.connect() as conn:
                    if not write:
                        conn.execution_options(_election_read=True)
                    deadline = _WATCHDOG.arm(conn.connection.dbapi_connection, left)
                    try:
                        with conn.begin():
                            return work(conn)
                    finally:
                        deadline.cancel()
                        if deadline.fired:
                            conn.invalidate()
            except (_LostRound, SchemaMissingError, BackendUnavailableError) as exc:
                if deadline is not None and deadline.fired:
                    raise BackendUnavailableError(
                        f"election database {self.description} did not answer within "
                        f"{timeout}s; the connection was shut down"
                    ) from exc
                if attempt == 1 and getattr(exc, "connection_invalidated", False):
                    # A pooled connection died while idle (server restart, killed
                    # backend). Every step is safe to repeat: renew and resign are
                    # scoped to (token, term), and a repeated take shows up as "held
                    # by this token". So try once more on a fresh connection.
                    continue
                raise
        raise AssertionError("unreachable")  # pragma: no cover

    def _write(
        self,
        work: Callable[[Connection], T],
        *,
        table: sa.Table,
        lost: T,
        timeout: float | None,
        connection: Caller | None = None,
    ) -> T:
        """A write whose loss to contention means ``lost``, not an error."""
        try:
            return self._run(work, table=table, write=True, timeout=timeout, connection=connection)
        except _LostRound:
            return lost

    def _lease_columns(self) -> list[sa.ColumnElement[Any]]:
        t = self.lease
        return [
            t.c.namespace,
            t.c.term,
            t.c.leader_id,
            t.c.expires_at,
            db_now_us().label("db_now"),
            t.c.acquired_at,
            t.c.renewed_at,
            t.c.token,
        ]

    @staticmethod
    def _lease(row: sa.Row[Any] | None) -> Lease | None:
        if row is None:
            return None
        return Lease(
            namespace=row.namespace,
            term=int(row.term),
            leader_id=row.leader_id,
            expires_at_us=int(row.expires_at),
            db_now_us=int(row.db_now),
            acquired_at_us=None if row.acquired_at is None else int(row.acquired_at),
            renewed_at_us=None if row.renewed_at is None else int(row.renewed_at),
            token=row.token,
        )

    def _select_lease(self, conn: Connection, namespace: str) -> Lease | None:
        stmt = sa.select(*self._lease_columns()).where(self.lease.c.namespace == namespace)
        return self._lease(conn.execute(stmt).first())

    @functools.cached_property
    def _statements(self) -> dict[str, sa.Executable]:
        """Each step's statement, built once with bound parameters.

        Building a statement (on PostgreSQL, its CTE and UNION) cost more than running it.
        """
        t = self.lease
        now = db_now_us()
        ns = sa.bindparam("p_ns", type_=sa.String())
        token = sa.bindparam("p_token", type_=sa.String())
        term = sa.bindparam("p_term", type_=sa.BigInteger)
        ttl = sa.bindparam("p_ttl", type_=sa.BigInteger)
        steps = {
            # vacant or expired -> a new, strictly greater term for this token
            "elected": sa.update(t)
            .where(t.c.namespace == ns, sa.or_(t.c.token.is_(None), t.c.expires_at <= now))
            .values(
                term=greatest(t.c.term + 1, now),
                token=token,
                leader_id=sa.bindparam("p_cid"),
                acquired_at=now,
                renewed_at=now,
                expires_at=now + ttl,
            ),
            # only the exact (token, term), only before it expired
            "renewed": sa.update(t)
            .where(t.c.namespace == ns, t.c.token == token, t.c.term == term, t.c.expires_at > now)
            .values(renewed_at=now, expires_at=now + ttl),
            # only the exact (token, term); the term stays: it never goes back
            "resigned": sa.update(t)
            .where(t.c.namespace == ns, t.c.token == token, t.c.term == term)
            .values(token=None, leader_id=None, expires_at=now),
        }
        if not self.supports_returning:
            return dict(steps)
        return {
            event: self._returning_step(stmt.returning(*self._lease_columns()), event)
            for event, stmt in steps.items()
        }

    def _step(
        self,
        event: str,
        params: dict[str, Any],
        namespace: str,
        *,
        timeout: float | None,
        connection: Caller | None,
    ) -> ElectResult | None:
        """Run one conditional UPDATE of the lease row (``event`` names which).

        Returns the row after the step with ``won=True`` if the UPDATE matched, or (where
        the dialect can read the row in the same statement) the row as read with
        ``won=False``; None if it matched nothing and nothing was read.
        """
        statement = self._statements[event]
        params = {"p_ns": namespace, **params}
        if self.supports_returning:

            def work(conn: Connection) -> sa.Row[Any] | None:
                return conn.execute(statement, params).first()

            row = self._run(
                work, table=self.lease, write=True, timeout=timeout, connection=connection
            )
            lease = self._lease(row)
            if lease is None:
                return None
            return ElectResult(bool(getattr(row, "won", True)), lease)

        def work_count(conn: Connection) -> int:
            return int(conn.execute(statement, params).rowcount)

        changed = self._run(
            work_count, table=self.lease, write=True, timeout=timeout, connection=connection
        )
        if changed != 1:
            return None
        # MySQL has no UPDATE ... RETURNING: report the row as stored after the step.
        lease = self.current(namespace, timeout=timeout, connection=connection)
        assert lease is not None
        return ElectResult(True, lease)

    def _returning_step(self, returning: sa.Update, event: str) -> sa.Executable:
        """The statement that runs a step; PostgreSQL adds its NOTIFY and a read here."""
        return returning

    def _lost(
        self, namespace: str, timeout: float | None, connection: Caller | None
    ) -> ElectResult:
        try:
            lease = self.current(namespace, timeout=timeout, connection=connection)
        except BackendUnavailableError:
            lease = None
        return ElectResult(False, lease)

    # -- schema -----------------------------------------------------------------------------

    def install(self) -> None:
        """Create the tables if missing. Safe to run from many processes at once."""
        last: Exception | None = None
        for _attempt in range(5):
            try:
                with self.engine.begin() as conn:
                    if self.dialect == "postgresql":
                        # Concurrent CREATE TABLE IF NOT EXISTS races on the catalog
                        # (DESIGN.md, rule 10): serialise installers on an advisory lock.
                        key = sa.func.hashtext(f"celery_election:{self.table_prefix}")
                        conn.execute(sa.select(sa.func.pg_advisory_xact_lock(key)))
                    self.metadata.create_all(conn, checkfirst=True)
                return
            except DBAPIError as exc:
                if _classify(exc) == "unavailable" and "connect" in str(exc).lower():
                    raise BackendUnavailableError(
                        f"cannot reach election database {self.description}: {_one_line(exc)}"
                    ) from (exc.orig or exc)
                last = exc
        raise BackendUnavailableError(
            f"could not create the election tables in {self.description}: {last}"
        ) from last

    def uninstall(self) -> None:
        """Drop the tables if they exist. Terms stay increasing after a re-install."""
        with self.engine.begin() as conn:
            self.metadata.drop_all(conn, checkfirst=True)

    def drop_ddl(self) -> list[str]:
        """The DROP statements uninstall() would run, for this database's dialect."""
        from sqlalchemy.schema import DropTable

        return [
            str(DropTable(t, if_exists=True).compile(dialect=self.engine.dialect)).strip()
            for t in reversed(self.metadata.sorted_tables)
        ]

    def create_ddl(self) -> list[str]:
        """The CREATE statements install() would run, for this database's dialect."""
        from sqlalchemy.schema import CreateIndex, CreateTable

        out = []
        for table in self.metadata.sorted_tables:
            out.append(str(CreateTable(table).compile(dialect=self.engine.dialect)).strip())
            for index in table.indexes:
                out.append(str(CreateIndex(index).compile(dialect=self.engine.dialect)).strip())
        return out

    # -- the lease --------------------------------------------------------------------------

    def elect(
        self,
        namespace: str,
        token: str,
        candidate_id: str,
        ttl: float,
        *,
        term: int | None = None,
        timeout: float | None = None,
        connection: Caller | None = None,
    ) -> ElectResult:
        """Take the lease if vacant or expired; with ``term``, renew it instead."""
        if term is not None:
            return self.renew(namespace, token, term, ttl, timeout=timeout, connection=connection)
        validate_namespace(namespace)
        validate_candidate_id(candidate_id)
        _check_token(token)
        t = self.lease
        params = {"p_token": token, "p_cid": candidate_id, "p_ttl": _us(ttl)}
        if not self.reads_in_step:
            # Without a read in the same statement, a losing UPDATE would cost a second
            # statement to report the row. So look first, and only try the UPDATE when
            # the lease looks vacant or expired: the UPDATE still decides, and a stale
            # read can only delay an attempt, never let two win.
            seen = self.current(namespace, timeout=timeout, connection=connection)
            if seen is not None and seen.held:
                return ElectResult(False, seen)
        lost = ElectResult(False, None)
        try:
            for _attempt in range(3):
                result = self._step(
                    "elected", params, namespace, timeout=timeout, connection=connection
                )
                if result is not None and result.won:
                    return result
                lost = result or self._lost(namespace, timeout, connection)
                if lost.lease is None:
                    # First election of this namespace: create the vacant row, then race.
                    self._run(
                        lambda conn: conn.execute(self._insert_vacant(namespace)),
                        table=t,
                        write=True,
                        timeout=timeout,
                        connection=connection,
                    )
                elif lost.lease.held:
                    return lost
                # else the row was vacant when read (a racer inserted it but has not
                # taken it yet, or the leader just resigned): try again.
        except _LostRound:
            return self._lost(namespace, timeout, connection)
        return lost

    def _upsert(
        self,
        table: sa.Table,
        values: dict[str, Any],
        update: Callable[[Any], dict[str, Any]],
    ) -> sa.Insert:
        """INSERT, or UPDATE the row with that primary key: one statement per dialect.

        ``update`` gets the row that was to be inserted (``excluded`` / ``inserted``).
        On MySQL the assignments run left to right: none of ours reads another's result.
        """
        keys = list(table.primary_key.columns)
        if self.dialect in ("postgresql", "sqlite"):
            dialect: Any = postgresql if self.dialect == "postgresql" else sqlite
            ins = dialect.insert(table).values(values)
            upsert: sa.Insert = ins.on_conflict_do_update(
                index_elements=keys, set_=update(ins.excluded)
            )
            return upsert
        mins = mysql.insert(table).values(values)
        return mins.on_duplicate_key_update(update(mins.inserted))

    def _insert_vacant(self, namespace: str) -> sa.Insert:
        values = {"namespace": namespace, "term": 0, "expires_at": 0}
        if self.dialect == "postgresql":
            return postgresql.insert(self.lease).values(values).on_conflict_do_nothing()
        if self.dialect == "sqlite":
            return sqlite.insert(self.lease).values(values).on_conflict_do_nothing()
        ins = mysql.insert(self.lease).values(values)
        return ins.on_duplicate_key_update(term=self.lease.c.term)  # a no-op update

    def renew(
        self,
        namespace: str,
        token: str,
        term: int,
        ttl: float,
        *,
        timeout: float | None = None,
        connection: Caller | None = None,
    ) -> ElectResult:
        """Extend the unexpired lease held by exactly (token, term)."""
        params = {"p_token": token, "p_term": term, "p_ttl": _us(ttl)}
        try:
            result = self._step(
                "renewed", params, namespace, timeout=timeout, connection=connection
            )
        except _LostRound:
            result = None
        return result if result is not None else self._lost(namespace, timeout, connection)

    def resign(
        self,
        namespace: str,
        token: str,
        term: int,
        *,
        timeout: float | None = None,
        connection: Caller | None = None,
    ) -> bool:
        """Vacate the lease held by exactly (token, term). The term stays: it never goes back."""
        params = {"p_token": token, "p_term": term}
        try:
            result = self._step(
                "resigned", params, namespace, timeout=timeout, connection=connection
            )
        except _LostRound:
            return False
        return result is not None and result.won

    def current(
        self, namespace: str, *, timeout: float | None = None, connection: Caller | None = None
    ) -> Lease | None:
        """The lease row as stored now (None if this namespace was never elected)."""
        return self._run(
            lambda conn: self._select_lease(conn, namespace),
            table=self.lease,
            write=False,
            timeout=timeout,
            connection=connection,
        )

    def namespaces(self, *, timeout: float | None = None) -> list[str]:
        """Every namespace with a lease row or a candidate row, sorted."""
        lease, cand = self.lease, self.candidate
        stmt = sa.union(sa.select(lease.c.namespace), sa.select(cand.c.namespace))

        def work(conn: Connection) -> list[str]:
            return sorted(str(r[0]) for r in conn.execute(stmt))

        return self._run(work, table=lease, write=False, timeout=timeout, connection=None)

    # -- candidates -------------------------------------------------------------------------

    def register(
        self,
        namespace: str,
        token: str,
        candidate_id: str,
        hostname: str,
        pid: int,
        ttl: float,
        *,
        timeout: float | None = None,
        connection: Caller | None = None,
    ) -> None:
        """Create or refresh this candidate's row (an upsert: also the heartbeat)."""
        validate_namespace(namespace)
        validate_candidate_id(candidate_id)
        _check_token(token)
        c = self.candidate
        now = db_now_us()
        values = {
            "namespace": namespace,
            "token": token,
            "candidate_id": candidate_id,
            "hostname": hostname[:255],
            "pid": pid,
            "registered_at": now,
            "heartbeat_at": now,
            "expires_at": now + _us(ttl),
        }
        refresh = {"heartbeat_at": now, "expires_at": now + _us(ttl)}
        stmt = self._upsert(c, values, lambda new: refresh)
        # lost to contention: the next heartbeat refreshes it
        self._write(_rowcount(stmt), table=c, lost=0, timeout=timeout, connection=connection)

    heartbeat = register

    def unregister(
        self,
        namespace: str,
        token: str,
        *,
        timeout: float | None = None,
        connection: Caller | None = None,
    ) -> None:
        """Remove this candidate's row."""
        c = self.candidate
        stmt = sa.delete(c).where(c.c.namespace == namespace, c.c.token == token)
        self._write(_rowcount(stmt), table=c, lost=0, timeout=timeout, connection=connection)

    def candidates(
        self, namespace: str, *, timeout: float | None = None, connection: Caller | None = None
    ) -> list[CandidateInfo]:
        """Candidates whose heartbeat has not expired on the database clock."""
        c = self.candidate
        stmt = (
            sa.select(c)
            .where(c.c.namespace == namespace, c.c.expires_at > db_now_us())
            .order_by(c.c.registered_at, c.c.token)
        )

        def work(conn: Connection) -> list[CandidateInfo]:
            return [
                CandidateInfo(
                    candidate_id=r.candidate_id,
                    hostname=r.hostname,
                    pid=int(r.pid),
                    heartbeat_at_us=int(r.heartbeat_at),
                    expires_at_us=int(r.expires_at),
                    token=r.token,
                )
                for r in conn.execute(stmt)
            ]

        return self._run(work, table=c, write=False, timeout=timeout, connection=connection)

    def prune(
        self, namespace: str, *, timeout: float | None = None, connection: Caller | None = None
    ) -> int:
        """Delete candidate rows whose heartbeat expired."""
        c = self.candidate
        stmt = sa.delete(c).where(c.c.namespace == namespace, c.c.expires_at <= db_now_us())
        return self._write(_rowcount(stmt), table=c, lost=0, timeout=timeout, connection=connection)

    # -- beat -------------------------------------------------------------------------------

    def claim_tick(
        self,
        namespace: str,
        token: str,
        term: int,
        entry_name: str,
        due_us: int,
        *,
        retry: bool = False,
        timeout: float | None = None,
    ) -> bool:
        """Claim one tick of a beat entry for the leader (token, term); True if claimed.

        One INSERT ... SELECT that reads the lease row with a share lock (FOR SHARE /
        LOCK IN SHARE MODE; SQLite's write lock serialises everything) and inserts the
        ledger row only if the token, term and unexpired lease still match, so a
        takeover cannot commit in between; a duplicate key means someone claimed it
        first. The entry's state (last due, run count) is updated in the same
        transaction. Whoever gets True may send the tick, once.

        ``retry=True`` after a claim that raised: the first attempt may have committed with
        its answer lost, so a claim already held by this term (terms are never shared)
        counts as ours. Only the caller that never sent the tick may retry it.
        """
        claim, record = self._claim_statements
        returning = self.engine.dialect.insert_returning
        params = {
            "p_ns": namespace,
            "p_key": entry_key(entry_name),
            "p_due": due_us,
            "p_name": entry_name[:500],
            "p_token": token,
            "p_term": term,
        }

        def work(conn: Connection) -> bool:
            result = conn.execute(claim, params)
            claimed = len(result.all()) if returning else result.rowcount
            if claimed != 1:
                return retry and self._claimed_term(conn, params) == term
            conn.execute(record, params)
            return True

        return self._write(work, table=self.beat_ledger, lost=False, timeout=timeout)

    def _claimed_term(self, conn: Connection, params: dict[str, Any]) -> int | None:
        ledger = self.beat_ledger
        return conn.execute(
            sa.select(ledger.c.term).where(
                ledger.c.namespace == params["p_ns"],
                ledger.c.entry_key == params["p_key"],
                ledger.c.due == params["p_due"],
            )
        ).scalar()

    @functools.cached_property
    def _claim_statements(self) -> tuple[sa.Executable, sa.Executable]:
        """The claim and the state update, built once (see ``_statements``)."""
        lease, ledger, state = self.lease, self.beat_ledger, self.beat_state
        now = db_now_us()
        ns = sa.bindparam("p_ns", type_=_key(190))
        key = sa.bindparam("p_key", type_=_key(40))
        due = sa.bindparam("p_due", type_=sa.BigInteger)
        name = sa.bindparam("p_name", type_=sa.String(500))
        source = (
            sa.select(
                ns.label("namespace"),
                key.label("entry_key"),
                due.label("due"),
                name.label("entry_name"),
                lease.c.term,
                now.label("claimed_at"),
            )
            .where(
                lease.c.namespace == ns,
                lease.c.token == sa.bindparam("p_token", type_=sa.String()),
                lease.c.term == sa.bindparam("p_term", type_=sa.BigInteger),
                lease.c.expires_at > now,
            )
            .with_for_update(read=True)
        )
        columns = ["namespace", "entry_key", "due", "entry_name", "term", "claimed_at"]
        claim: sa.Insert
        if self.dialect == "postgresql":
            claim = postgresql.insert(ledger).from_select(columns, source).on_conflict_do_nothing()
        elif self.dialect == "sqlite":
            claim = sqlite.insert(ledger).from_select(columns, source).on_conflict_do_nothing()
        else:
            # INSERT IGNORE reports 0 rows for a duplicate (ON DUPLICATE KEY UPDATE would
            # report a matched row as 1 with the FOUND_ROWS flag: a false claim).
            claim = sa.insert(ledger).from_select(columns, source).prefix_with("IGNORE")
        if self.engine.dialect.insert_returning:
            # INSERT ... SELECT reports rowcount -1 through psycopg: count RETURNING rows.
            claim = claim.returning(ledger.c.due)
        values = {
            "namespace": ns,
            "entry_key": key,
            "entry_name": name,
            "last_due": due,
            "total_run_count": 1,
            "updated_at": now,
        }
        record = self._upsert(
            state,
            values,
            lambda new: {
                "last_due": greatest(state.c.last_due, new.last_due),
                "total_run_count": state.c.total_run_count + 1,
                "updated_at": now,
            },
        )
        return claim, record

    def confirm_tick(
        self, namespace: str, entry_name: str, due_us: int, *, timeout: float | None = None
    ) -> None:
        """Mark a claimed tick as sent (only needed for resending unconfirmed ticks)."""
        g = self.beat_ledger
        stmt = (
            sa.update(g)
            .where(
                g.c.namespace == namespace,
                g.c.entry_key == entry_key(entry_name),
                g.c.due == due_us,
            )
            .values(sent_at=db_now_us())
        )
        self._write(_rowcount(stmt), table=g, lost=0, timeout=timeout)

    def beat_entries(
        self, namespace: str, *, timeout: float | None = None
    ) -> dict[str, tuple[int, int]]:
        """Map each entry name to (last claimed nominal due time in us, run count)."""
        s = self.beat_state
        stmt = sa.select(s.c.entry_name, s.c.last_due, s.c.total_run_count).where(
            s.c.namespace == namespace
        )
        return self._run(
            lambda conn: {
                r.entry_name: (int(r.last_due), int(r.total_run_count)) for r in conn.execute(stmt)
            },
            table=s,
            write=False,
            timeout=timeout,
            connection=None,
        )

    def unconfirmed_ticks(
        self, namespace: str, before_term: int, *, timeout: float | None = None
    ) -> list[tuple[str, int, int]]:
        """(entry name, due, term) of ticks claimed by earlier terms and never confirmed."""
        g = self.beat_ledger
        stmt = (
            sa.select(g.c.entry_name, g.c.due, g.c.term)
            .where(g.c.namespace == namespace, g.c.sent_at.is_(None), g.c.term < before_term)
            .order_by(g.c.due)
        )
        return self._run(
            lambda conn: [(r.entry_name, int(r.due), int(r.term)) for r in conn.execute(stmt)],
            table=g,
            write=False,
            timeout=timeout,
            connection=None,
        )

    def reclaim_tick(
        self,
        namespace: str,
        token: str,
        term: int,
        entry_name: str,
        due_us: int,
        old_term: int,
        *,
        timeout: float | None = None,
    ) -> bool:
        """Take over an unconfirmed tick of ``old_term`` for (token, term); True if taken."""
        g, lease = self.beat_ledger, self.lease
        now = db_now_us()
        holds = (
            sa.select(lease.c.term)
            .where(
                lease.c.namespace == namespace,
                lease.c.token == token,
                lease.c.term == term,
                lease.c.expires_at > now,
            )
            .with_for_update(read=True)
            .scalar_subquery()
        )
        stmt = (
            sa.update(g)
            .where(
                g.c.namespace == namespace,
                g.c.entry_key == entry_key(entry_name),
                g.c.due == due_us,
                g.c.term == old_term,
                g.c.sent_at.is_(None),
                holds == term,
            )
            .values(term=term, claimed_at=now)
        )
        return self._write(_rowcount(stmt), table=g, lost=0, timeout=timeout) == 1

    def prune_ledger(
        self, namespace: str, older_than_us: int, *, timeout: float | None = None
    ) -> int:
        """Delete ledger rows whose nominal due time is before ``older_than_us``."""
        g = self.beat_ledger
        stmt = sa.delete(g).where(g.c.namespace == namespace, g.c.due < older_than_us)
        return self._write(_rowcount(stmt), table=g, lost=0, timeout=timeout)

    def subscribe_wakeups(
        self, namespace: str, callback: Callable[[Wakeup], None]
    ) -> WakeupHandle | None:
        """Plain SQL has no notifications: followers poll."""
        return None

    def close(self) -> None:
        """Dispose of the private engine (idempotent)."""
        if not self._closed:
            self._closed = True
            self.engine.dispose()


def _rowcount(stmt: sa.Executable) -> Callable[[Connection], int]:
    """Work for ``_run``: execute ``stmt`` and return the rows it changed."""
    return lambda conn: int(conn.execute(stmt).rowcount)


def _one_line(exc: DBAPIError) -> str:
    """The driver's message on one line (libpq's spans several)."""
    return "; ".join(line.strip() for line in str(exc.orig or exc).splitlines() if line.strip())


def _us(seconds: float) -> int:
    return round(seconds * 1_000_000)


def _check_token(token: object) -> None:
    if not isinstance(token, str) or len(token) != _TOKEN_LENGTH:
        raise ConfigurationError(
            f"token must be a {_TOKEN_LENGTH}-character string (uuid4().hex): got {token!r}"
        )
