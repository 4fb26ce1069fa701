"""What differs between the databases, owned in one place: one small object per dialect.

SQLAlchemy compiles the statements; a ``Dialect`` holds the rest, and the backend picks
one, once, from its URL (``dialect_for``). Nothing else branches on the database's name.

* the engine: URL checks and forms, connect arguments and pool options, the session
  set-up run on each new connection (timeouts, SQLite's WAL and BEGIN IMMEDIATE; rules 8
  and 11 of docs/design.md);
* the clock: ``clock_sql`` and ``greatest_function``, compiled for ``schema.db_now_us``
  and ``schema.greatest`` (rule 2);
* errors: the driver's codes for "lost this round", "table missing", "read-only
  standby" (rule 1, rule 13): ``classify``;
* statements: insert-ignore, insert-if-absent, upsert, DELETE of at most n rows, and
  whether ``SELECT ... FOR UPDATE`` applies;
* the shape of a lease step (``StepStyle``):

  - ``RETURNING`` (SQLite): the conditional UPDATE returns the row it changed;
  - ``ROWCOUNT`` (MySQL/MariaDB, no UPDATE ... RETURNING): the step reports whether it
    matched, and the row after it is read with a second statement;
  - PostgreSQL (``postgres.NotifyStyle``): one statement that updates, returns the row
    whether the step won or lost, and sends NOTIFY to the other candidates;

* ``install()``'s lock against concurrent DDL (rule 10) and the liveness session
  (``locks.py``: advisory lock, GET_LOCK, a lock file).

To add a dialect (the one list of what it takes):

1. subclass ``Dialect`` here: ``name`` (SQLAlchemy's), ``clock_sql`` (epoch microseconds
   on the database's clock, fixed for the statement), ``greatest_function``, the engine
   options and session set-up, ``driver_error`` (its driver's error codes), the statements
   that are not portable (``insert_ignore``, ``insert_if_absent``, ``upsert``,
   ``delete_at_most``), ``install_lock`` and ``liveness_session``; add it to
   ``DIALECTS``;
2. check the key collation in ``schema.key_type`` (keys must compare byte for byte,
   rule 9);
3. name its URL scheme and driver in ``backends/__init__.py`` and run it through
   ``tests/integration/test_backend_suite.py``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import sqlalchemy as sa
from sqlalchemy.dialects import mysql, postgresql, sqlite
from sqlalchemy.engine import URL, Connection, Engine
from sqlalchemy.exc import DBAPIError

from ..errors import BackendUnavailableError, ConfigurationError
from . import connection, green
from .locks import FileSession, LivenessSession, MySQLSession, PostgresSession, pg_connector

__all__ = [
    "DIALECTS",
    "RETURNING",
    "ROWCOUNT",
    "Dialect",
    "MySQL",
    "PostgreSQL",
    "SQLite",
    "StepStyle",
    "dialect_for",
    "unsupported",
]


@dataclass(frozen=True)
class StepStyle:
    """The shape of one lease step on a dialect."""

    #: the step's statement returns the row as it is after the step
    returning: bool
    #: a losing step returns the row too, so looking at the lease needs no read first
    reads_in_step: bool = False

    def statement(
        self, update: sa.Update, columns: Sequence[sa.ColumnElement[Any]], event: str
    ) -> sa.Executable:
        """The statement that runs ``update`` (``event``: what the step does, for NOTIFY)."""
        return update.returning(*columns) if self.returning else update


RETURNING = StepStyle(returning=True)
ROWCOUNT = StepStyle(returning=False)


class Dialect:
    """One database's differences; the defaults are the client-server databases'."""

    #: SQLAlchemy's name for it (``engine.dialect.name``); the clock compiles for it
    name: ClassVar[str]
    #: the database's clock in epoch microseconds, fixed for the whole statement
    clock_sql: ClassVar[str]
    #: the function that spells GREATEST(a, b)
    greatest_function: ClassVar[str] = "GREATEST"
    #: a group's values as one string in an order (``schema.ordered_concat``): the
    #: timeline's marks come as one row per entry, not one per mark
    concat_sql: ClassVar[str] = "string_agg(CAST({value} AS TEXT), {separator} ORDER BY {order})"
    #: the database runs inside this process (SQLite): forks wait for its calls, and the
    #: file's absolute path is logged
    in_process: ClassVar[bool] = False
    #: SELECT ... FOR UPDATE locks the rows it reads (SQLite: its write lock does)
    row_locks: ClassVar[bool] = True
    #: added to "did not answer within" (a call that outlived its deadline)
    deadline_hint: ClassVar[str] = ""

    # -- the engine -------------------------------------------------------------------------

    def normalise_url(self, url: URL) -> URL:
        """``url`` in the form the driver reads (the lease URL and the direct URL)."""
        return url

    def engine_url(self, url: URL, *, allow_network_filesystem: bool) -> URL:
        """The URL the private engine connects to; refuses one it cannot use safely."""
        return url

    def engine_options(
        self,
        *,
        driver: str,
        statement_timeout: float,
        connect_timeout: float,
        sqlite_busy_timeout: float,
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """``create_engine`` options and the connect arguments of ``driver`` (the URL's)."""
        # Each call is one statement (or a few whose order, not atomicity, matters): run
        # them in autocommit, so the server commits a step as it executes it and never
        # holds a lease or beat row while waiting for the client's COMMIT. A link that
        # froze between the two (half-open TCP) held the row against a take-over until the
        # server gave up on the session: 2 x call_timeout on PostgreSQL, never on MySQL.
        # Transactions that need one ask for it (``transaction``). On PostgreSQL it also
        # saves the BEGIN and COMMIT round trips. A call waits for a pooled connection no
        # longer than a statement may run (QueuePool's default, 30 s, outlived the
        # call's deadline when many electors shared one backend).
        options = {"pool_size": 2, "max_overflow": 4, "isolation_level": "AUTOCOMMIT"}
        return {**options, "pool_timeout": statement_timeout}, {}

    def set_up_sessions(self, engine: Engine, statement_timeout: float) -> None:
        """Listen for the engine's new connections and set each session up."""

    def transaction(self, engine: Engine) -> Any:
        """A real transaction (the engine autocommits its one-statement calls)."""
        return engine.execution_options(isolation_level="READ COMMITTED").begin()

    # -- errors -----------------------------------------------------------------------------

    def classify(self, exc: DBAPIError) -> str:
        """What a failed call means (docs/design.md, rule 1).

        "contention": lost this round (lock timeout, deadlock, duplicate key, SQLite
        busy); "missing": a table is missing; "read-only": a standby; "unavailable": the
        connection failed; "other": a bad statement.
        """
        kind = self.driver_error(exc.orig)
        if kind is not None:
            return kind
        if exc.connection_invalidated or isinstance(
            exc, (sa.exc.OperationalError, sa.exc.InterfaceError)
        ):
            return "unavailable"
        return "other"

    def driver_error(self, orig: BaseException | None) -> str | None:
        """What the driver's own error code says, or None: the generic rules decide."""
        return None

    # -- statements -------------------------------------------------------------------------

    def insert(self, table: sa.Table) -> Any:
        """The dialect's INSERT construct (with its ON CONFLICT / ON DUPLICATE KEY)."""
        raise NotImplementedError

    def insert_ignore(
        self,
        table: sa.Table,
        values: dict[str, Any] | None = None,
        *,
        from_select: tuple[list[str], sa.Select[Any]] | None = None,
    ) -> sa.Insert:
        """INSERT the row(s) unless the key exists; a duplicate inserts nothing, silently."""
        filled = _filled(self.insert(table), values, from_select)
        result: sa.Insert = filled.on_conflict_do_nothing()
        return result

    def insert_if_absent(self, table: sa.Table, values: dict[str, Any], column: str) -> sa.Insert:
        """INSERT the row unless the key exists (``column``: one the no-op update keeps)."""
        return self.insert_ignore(table, values)

    def upsert(
        self,
        table: sa.Table,
        values: dict[str, Any],
        update: Callable[[Any], dict[str, Any]],
    ) -> sa.Insert:
        """INSERT, or UPDATE the row with that primary key: one statement.

        ``update`` gets the row that was to be inserted (``excluded`` / ``inserted``).
        """
        ins = self.insert(table).values(values)
        keys = list(table.primary_key.columns)
        upsert: sa.Insert = ins.on_conflict_do_update(
            index_elements=keys, set_=update(ins.excluded)
        )
        return upsert

    def delete_at_most(
        self, key: sa.Column[Any], where: sa.ColumnElement[bool], limit: int
    ) -> sa.Delete:
        """DELETE at most ``limit`` rows matching ``where`` (``key``: the table's id)."""
        ids = sa.select(key).where(where).limit(limit).scalar_subquery()
        return sa.delete(key.table).where(key.in_(ids))

    def for_update(self, select: sa.Select[Any]) -> sa.Select[Any]:
        """``select`` locking the rows it reads until the transaction ends."""
        return select.with_for_update() if self.row_locks else select

    def step_style(self, engine: Engine) -> StepStyle:
        """How a lease step runs (PostgresBackend brings its own, ``NotifyStyle``)."""
        return RETURNING if engine.dialect.update_returning else ROWCOUNT

    # -- install and liveness ---------------------------------------------------------------

    def install_lock(self, conn: Connection, table_prefix: str, read_only: str) -> None:
        """Serialise concurrent installers in ``conn``'s transaction (rule 10)."""

    def liveness_session(
        self,
        engine: Engine,
        url: URL,
        key: bytes,
        delta: float,
        max_wait: float,
        connect_timeout: float,
    ) -> LivenessSession:
        """The liveness lock ``key`` on a connection of its own to ``url`` (locks.py).

        Never from the engine's pool: a pooled connection is shared, and a session lock
        must die with this candidate alone. ``max_wait`` bounds one ``acquire``.
        """
        raise NotImplementedError


class SQLite(Dialect):
    """SQLite: a file on this host, written under one lock; the host's clock."""

    name = "sqlite"
    # SQLite's 'now' is the host clock, constant within one statement step.
    clock_sql = "CAST((julianday('now') - 2440587.5) * 86400000000.0 AS INTEGER)"
    greatest_function = "max"
    # No ORDER BY in an aggregate before SQLite 3.44: the values come in the order of the
    # rows grouped (sorted by the subquery), which their reader checks (schedule/store.py).
    concat_sql = "group_concat({value}, {separator})"
    in_process = True
    row_locks = False
    network_filesystems: ClassVar[frozenset[str]] = frozenset(
        {"nfs", "nfs4", "cifs", "smbfs", "smb3", "fuse.sshfs", "9p", "afs", "ceph"}
    )

    def engine_url(self, url: URL, *, allow_network_filesystem: bool) -> URL:
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
        fstype = connection.filesystem_type(path.parent)
        if fstype in self.network_filesystems and not allow_network_filesystem:
            raise ConfigurationError(
                f"SQLite election file {path} is on a network filesystem ({fstype}): its "
                f"locks are not reliable there. Use PostgreSQL or MySQL, or pass "
                f"allow_network_filesystem=True if you know its locking works"
            )
        return url.set(database=str(path))

    def engine_options(
        self,
        *,
        driver: str,
        statement_timeout: float,
        connect_timeout: float,
        sqlite_busy_timeout: float,
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        return {}, {"timeout": sqlite_busy_timeout, "check_same_thread": False}

    def set_up_sessions(self, engine: Engine, statement_timeout: float) -> None:
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

    def transaction(self, engine: Engine) -> Any:
        return engine.begin()

    def driver_error(self, orig: BaseException | None) -> str | None:
        if not type(orig).__module__.startswith("sqlite3"):
            return None
        message = str(orig).lower()
        if "locked" in message or "busy" in message:
            return "contention"
        if "no such table" in message:
            return "missing"
        if not any(w in message for w in ("interrupt", "unable to open", "disk", "readonly")):
            return "other"  # a bad statement, not an unreachable file
        return None

    def insert(self, table: sa.Table) -> Any:
        return sqlite.insert(table)

    def liveness_session(
        self,
        engine: Engine,
        url: URL,
        key: bytes,
        delta: float,
        max_wait: float,
        connect_timeout: float,
    ) -> LivenessSession:
        db = Path(str(engine.url.database))
        return FileSession(db.with_name(f"{db.name}.{key.hex()[:16]}.lock"), delta)


class PostgreSQL(Dialect):
    """PostgreSQL through psycopg 3 or psycopg2 (``postgres.PostgresBackend`` adds NOTIFY)."""

    name = "postgresql"
    # PostgreSQL's now() is frozen at transaction start; statement_timestamp() is not.
    clock_sql = "CAST(EXTRACT(EPOCH FROM statement_timestamp()) * 1000000 AS BIGINT)"
    deadline_hint = (
        " (behind PgBouncer, a pool too small for its clients makes calls "
        "wait like this: docs, Deployment topologies)"
    )
    contention: ClassVar[frozenset[str]] = frozenset({"40P01", "55P03", "40001", "23505", "57014"})
    missing: ClassVar[frozenset[str]] = frozenset({"42P01"})
    read_only: ClassVar[frozenset[str]] = frozenset({"25006"})  # a hot standby

    def normalise_url(self, url: URL) -> URL:
        """The libpq form ``?host=a:1,b:2`` as SQLAlchemy's repeated ``?host=a:1&host=b:2``.

        SQLAlchemy reads the comma form as one host name ("failed to resolve host"); the
        repeated form reaches libpq as its own multi-host list, with ``target_session_attrs``.
        """
        host = url.query.get("host")
        if not isinstance(host, str) or "," not in host:
            return url
        return url.update_query_dict({"host": tuple(h.strip() for h in host.split(","))})

    def engine_options(
        self,
        *,
        driver: str,
        statement_timeout: float,
        connect_timeout: float,
        sqlite_busy_timeout: float,
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        options, connect_args = super().engine_options(
            driver=driver,
            statement_timeout=statement_timeout,
            connect_timeout=connect_timeout,
            sqlite_busy_timeout=sqlite_busy_timeout,
        )
        connect_args.update(
            connection.pg_connect_args(connect_timeout, "celery-election", driver),
            tcp_user_timeout=int(statement_timeout * 1000),
        )
        return options, connect_args

    def set_up_sessions(self, engine: Engine, statement_timeout: float) -> None:
        ms = int(statement_timeout * 1000)

        @sa.event.listens_for(engine, "connect")
        def _pg_connect(dbapi_conn: Any, record: Any) -> None:
            # Session settings, set once per connection in one statement (a SET LOCAL per
            # transaction would double the statement count, and a standby reconnects for
            # each look). Behind PgBouncer in transaction mode these may not stick; the
            # client-side call deadline still bounds every call.
            with dbapi_conn.cursor() as cur:
                cur.execute(
                    "SELECT set_config('statement_timeout', %s, false),"
                    " set_config('lock_timeout', %s, false),"
                    " set_config('idle_in_transaction_session_timeout', %s, false)",
                    (str(ms), str(ms), str(ms * 2)),
                )
            dbapi_conn.commit()

    def driver_error(self, orig: BaseException | None) -> str | None:
        sqlstate = connection.sqlstate(orig)
        if sqlstate in self.contention:
            return "contention"
        if sqlstate in self.missing:
            return "missing"
        if sqlstate in self.read_only:
            return "read-only"
        return None

    def insert(self, table: sa.Table) -> Any:
        return postgresql.insert(table)

    def install_lock(self, conn: Connection, table_prefix: str, read_only: str) -> None:
        # Concurrent CREATE TABLE IF NOT EXISTS races on the catalog (docs/design.md,
        # rule 10): serialise installers on an advisory lock.
        if conn.execute(sa.select(sa.func.pg_is_in_recovery())).scalar():
            # CREATE ... IF NOT EXISTS of existing tables succeeds there
            raise BackendUnavailableError(read_only)
        key = sa.func.hashtext(f"celery_election:{table_prefix}")
        conn.execute(sa.select(sa.func.pg_advisory_xact_lock(key)))

    def liveness_session(
        self,
        engine: Engine,
        url: URL,
        key: bytes,
        delta: float,
        max_wait: float,
        connect_timeout: float,
    ) -> LivenessSession:
        connect = pg_connector(engine, url, connect_timeout, "celery-election-liveness")
        return PostgresSession(connect, delta, url.render_as_string(hide_password=True), key)


class MySQL(Dialect):
    """MySQL and MariaDB through PyMySQL or mysqlclient (MySQLdb)."""

    name = "mysql"
    # UTC_TIMESTAMP ignores the session time zone; (6) keeps the microseconds.
    clock_sql = "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))"
    concat_sql = "GROUP_CONCAT({value} ORDER BY {order} SEPARATOR {separator})"
    contention: ClassVar[frozenset[int]] = frozenset({1213, 1205, 1062, 1969, 3024})
    missing: ClassVar[frozenset[int]] = frozenset({1146})

    def engine_options(
        self,
        *,
        driver: str,
        statement_timeout: float,
        connect_timeout: float,
        sqlite_busy_timeout: float,
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        options, connect_args = super().engine_options(
            driver=driver,
            statement_timeout=statement_timeout,
            connect_timeout=connect_timeout,
            sqlite_busy_timeout=sqlite_busy_timeout,
        )
        # mysqlclient takes whole seconds (libmariadb's options are unsigned ints)
        io_timeout = (
            statement_timeout if driver == "pymysql" else max(1, math.ceil(statement_timeout))
        )
        connect_args.update(
            connect_timeout=max(1, round(connect_timeout)),
            read_timeout=io_timeout,
            write_timeout=io_timeout,
        )
        return options, connect_args

    def set_up_sessions(self, engine: Engine, statement_timeout: float) -> None:
        secs = statement_timeout

        @sa.event.listens_for(engine, "do_connect")
        def _mysql_flags(dialect: Any, record: Any, cargs: Any, cparams: dict[str, Any]) -> None:
            # SQLAlchemy's PyMySQL and mysqlclient dialects both set CLIENT.FOUND_ROWS: an
            # UPDATE then reports the rows it matched, not those it changed, and a step that
            # matched without changing would count as won (docs/design.md, rule 1).
            cparams["client_flag"] = without_found_rows(cparams.get("client_flag", 0))

        @sa.event.listens_for(engine, "connect")
        def _mysql_connect(dbapi_conn: Any, record: Any) -> None:
            connection.remember_socket(dbapi_conn)  # mysqlclient: for the call deadline
            settings = [
                f"innodb_lock_wait_timeout = {max(1, round(secs))}",
                "sql_mode = CONCAT(@@sql_mode, ',STRICT_ALL_TABLES')",
                # GROUP_CONCAT stops at 1 KB on MySQL (1 MB on MariaDB): a timeline row
                # of 4,000 columns is ~100 KB
                "group_concat_max_len = 67108864",
            ]
            if "mariadb" in dbapi_conn.get_server_info().lower():
                settings.append(f"max_statement_time = {secs}")
            cur = dbapi_conn.cursor()
            cur.execute("SET SESSION " + ", ".join(settings))  # one statement per connection
            cur.close()

    def driver_error(self, orig: BaseException | None) -> str | None:
        if not type(orig).__module__.startswith(("pymysql", "MySQLdb")):
            return None
        code = orig.args[0] if orig is not None and orig.args else None
        if code in self.contention:
            return "contention"
        if code in self.missing:
            return "missing"
        return None

    def insert(self, table: sa.Table) -> Any:
        return mysql.insert(table)

    def insert_ignore(
        self,
        table: sa.Table,
        values: dict[str, Any] | None = None,
        *,
        from_select: tuple[list[str], sa.Select[Any]] | None = None,
    ) -> sa.Insert:
        # INSERT IGNORE reports 0 rows for a duplicate (ON DUPLICATE KEY UPDATE would
        # report a matched row as 1 with the FOUND_ROWS flag: a false claim).
        result: sa.Insert = _filled(sa.insert(table), values, from_select)
        return result.prefix_with("IGNORE")

    def insert_if_absent(self, table: sa.Table, values: dict[str, Any], column: str) -> sa.Insert:
        ins = mysql.insert(table).values(values)
        return ins.on_duplicate_key_update({column: table.c[column]})  # a no-op update

    def upsert(
        self,
        table: sa.Table,
        values: dict[str, Any],
        update: Callable[[Any], dict[str, Any]],
    ) -> sa.Insert:
        # The assignments run left to right: none of ours reads another's result.
        mins = mysql.insert(table).values(values)
        return mins.on_duplicate_key_update(update(mins.inserted))

    def delete_at_most(
        self, key: sa.Column[Any], where: sa.ColumnElement[bool], limit: int
    ) -> sa.Delete:
        try:
            return sa.delete(key.table).where(where).with_dialect_options(mysql_limit=limit)
        except sa.exc.ArgumentError:
            # older SQLAlchemy 2.0 (2.0.30) has no DELETE ... LIMIT for MySQL; MySQL refuses LIMIT
            # in an IN subquery, but not in a derived table inside it
            ids = sa.select(key).where(where).limit(limit).subquery()
            return sa.delete(key.table).where(key.in_(sa.select(ids.c[key.name])))

    def liveness_session(
        self,
        engine: Engine,
        url: URL,
        key: bytes,
        delta: float,
        max_wait: float,
        connect_timeout: float,
    ) -> LivenessSession:
        dialect = engine.dialect
        cargs, cparams = dialect.create_connect_args(url)
        cparams.update(
            connect_timeout=max(1, round(connect_timeout)),
            # whole seconds: mysqlclient takes no fractions
            read_timeout=math.ceil(max_wait + connect_timeout + 5),
            write_timeout=math.ceil(connect_timeout + 5),
        )
        description = url.render_as_string(hide_password=True)
        raw = green.connector(dialect, *cargs, **cparams)

        def connect() -> Any:
            conn = raw()
            connection.remember_socket(conn)  # mysqlclient: for interrupt()
            return conn

        return MySQLSession(connect, delta, description, key)


#: Every dialect, by the names SQLAlchemy gives it.
_MYSQL = MySQL()
DIALECTS: dict[str, Dialect] = {
    "sqlite": SQLite(),
    "postgresql": PostgreSQL(),
    "mysql": _MYSQL,
    "mariadb": _MYSQL,
}


#: MySQL's CLIENT_FOUND_ROWS capability flag (the same bit in PyMySQL and mysqlclient).
FOUND_ROWS = 2


def without_found_rows(client_flag: int) -> int:
    """``client_flag`` with FOUND_ROWS off: a conditional UPDATE counts the rows it changed."""
    return client_flag & ~FOUND_ROWS


def dialect_for(name: str) -> Dialect:
    """The dialect SQLAlchemy calls ``name`` (a URL's backend name, ``engine.dialect.name``)."""
    try:
        return DIALECTS[name]
    except KeyError:
        raise unsupported(name) from None


def unsupported(name: str) -> ConfigurationError:
    return ConfigurationError(
        f"celery_election supports SQLite, PostgreSQL and MySQL/MariaDB, not {name}"
    )


def _filled(
    ins: Any, values: dict[str, Any] | None, from_select: tuple[list[str], Any] | None
) -> Any:
    """An INSERT of ``values``, or of the rows ``from_select`` = (columns, SELECT) gives."""
    return ins.from_select(*from_select) if from_select is not None else ins.values(**values or {})
