"""The lease on a SQL database, through SQLAlchemy Core: SQLite, PostgreSQL, MySQL/MariaDB.

How each step stays correct (docs/design.md, "Rules found by experiment"):

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

The SQL backend in four files, one job each: ``schema.py`` (tables, the database clock),
``connection.py`` (private engine, deadlines, error classes), this file (the lease and the
candidates), ``sql_beat.py`` (beat run state, ``backend.beat``). ``postgres.py`` adds
NOTIFY to the steps and a LISTEN thread.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.dialects import mysql, postgresql, sqlite
from sqlalchemy.engine import URL, Connection, Engine, make_url
from sqlalchemy.exc import DBAPIError, NoSuchTableError
from sqlalchemy.orm import Session

from ..config import validate_candidate_id, validate_namespace, without_celery_prefix
from ..errors import BackendUnavailableError, ConfigurationError, SchemaMissingError
from ..term import CandidateInfo, ElectResult, Lease
from .base import Wakeup, WakeupHandle
from .connection import (
    WATCHDOG,
    Deadline,
    LostRound,
    classify,
    fork_lock,
    one_line,
    private_engine,
)
from .dialects import RETURNING, ROWCOUNT, StepStyle
from .liveness import LivenessSession, sql_session
from .schema import (
    DEFAULT_TABLE_PREFIX,
    TOKEN_LENGTH,
    db_now_us,
    greatest,
    make_metadata,
    validate_table_prefix,
)
from .sql_beat import SQLBeatStore
from .sql_schedule import SQLScheduleStore

__all__ = ["DEFAULT_TABLE_PREFIX", "SQLBackend", "db_now_us", "make_metadata"]

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Where a caller's own transaction can be passed: a Core Connection or an ORM Session.
Caller = Connection | Session

# -- the backend ----------------------------------------------------------------------------


def _same_driver(url: str | URL, like: URL) -> URL:
    """``url`` (Celery prefixes allowed) with ``like``'s driver: psycopg, PyMySQL."""
    text = url if isinstance(url, str) else url.render_as_string(hide_password=False)
    try:
        parsed = make_url(without_celery_prefix(text))
    except Exception as exc:
        raise ConfigurationError(f"election_direct_url is not a database URL: {exc}") from exc
    if parsed.get_backend_name() != like.get_backend_name():
        raise ConfigurationError(
            f"election_direct_url must name the same kind of database as election_url "
            f"({like.get_backend_name()}): got {parsed.get_backend_name()}"
        )
    return _multi_host(parsed.set(drivername=like.drivername))


def _multi_host(url: URL) -> URL:
    """The libpq form ``?host=a:1,b:2`` as SQLAlchemy's repeated ``?host=a:1&host=b:2``.

    SQLAlchemy reads the comma form as one host name ("failed to resolve host"); the
    repeated form reaches libpq as its own multi-host list, with ``target_session_attrs``.
    """
    host = url.query.get("host")
    if url.get_backend_name() != "postgresql" or not isinstance(host, str) or "," not in host:
        return url
    return url.update_query_dict({"host": tuple(h.strip() for h in host.split(","))})


class SQLBackend:
    """Leader election state in SQL tables, one code path for three databases.

    ``url_or_engine`` is a SQLAlchemy URL or an existing Engine. The backend always builds
    its own private engine (from the Engine's URL if given one): the application's pool
    must not be able to starve renewals, and the elector's connections carry their own
    timeouts. Pass ``connection=`` (a Connection or an ORM Session) to a method to run
    that step inside the caller's own transaction instead: it commits or rolls back with
    the caller's work, and is not bounded by a deadline here.
    """

    #: how this dialect runs a step (dialects.py; PostgresBackend brings its own)
    style: StepStyle

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
        direct_url: str | URL | None = None,
    ) -> None:
        if isinstance(url_or_engine, Engine):
            url = url_or_engine.url
        else:
            try:
                url = make_url(url_or_engine)
            except Exception as exc:
                raise ConfigurationError(f"not a database URL: {url_or_engine!r} ({exc})") from exc
        self.table_prefix = validate_table_prefix(table_prefix)
        self._connect_timeout = connect_timeout
        self.engine = private_engine(
            _multi_host(url),
            statement_timeout=statement_timeout,
            connect_timeout=connect_timeout,
            sqlite_busy_timeout=sqlite_busy_timeout,
            allow_network_filesystem=allow_network_filesystem,
            engine_options=dict(engine_options or {}),
        )
        self.dialect = self.engine.dialect.name
        self.description = self.engine.url.render_as_string(hide_password=True)
        #: Where session state (the liveness lock, LISTEN) goes: ``direct_url`` when the
        #: lease URL leads through a transaction pooler, else the lease URL itself.
        self.direct_url = self.engine.url
        if direct_url is not None:
            self.direct_url = _same_driver(direct_url, self.engine.url)
        if self.dialect == "sqlite":
            log.info("election database is the SQLite file %s", self.engine.url.database)
        self.metadata = make_metadata(table_prefix)
        self.lease = self.metadata.tables[f"{table_prefix}lease"]
        self.candidate = self.metadata.tables[f"{table_prefix}candidate"]
        self.beat_run = self.metadata.tables[f"{table_prefix}beat_run"]
        self.style = RETURNING if self.engine.dialect.update_returning else ROWCOUNT
        self._closed = False
        # SQLite runs inside this process: a fork while one of our calls holds its
        # allocator mutex leaves the child stuck on the copy. Forks wait for the call.
        self._fork_guard: threading.Lock | contextlib.nullcontext[None]
        self._fork_guard = contextlib.nullcontext()
        if self.dialect == "sqlite":
            self._fork_guard = fork_lock()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.description} prefix={self.table_prefix!r}>"

    # -- plumbing ---------------------------------------------------------------------------

    @contextmanager
    def _errors(self, table: sa.Table, *, write: bool) -> Iterator[None]:
        try:
            yield
        except DBAPIError as exc:
            kind = classify(exc)
            if kind == "missing":
                raise SchemaMissingError(table.name, self.description) from exc
            if kind == "contention" and write:
                raise LostRound() from exc
            if kind == "read-only":
                raise BackendUnavailableError(self._read_only()) from (exc.orig or exc)
            if kind in ("unavailable", "contention"):
                error = BackendUnavailableError(
                    f"election database {self.description} is unavailable: {one_line(exc)}"
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
            deadline: Deadline | None = None
            try:
                with self._errors(table, write=write), self.engine.connect() as conn:
                    if not write:
                        conn.execution_options(_election_read=True)
                    deadline = WATCHDOG.arm(conn.connection.dbapi_connection, left)
                    try:
                        with conn.begin():
                            return work(conn)
                    finally:
                        deadline.cancel()
                        if deadline.fired:
                            conn.invalidate()
            except (LostRound, SchemaMissingError, BackendUnavailableError) as exc:
                if deadline is not None and deadline.fired:
                    pool = (
                        " (behind PgBouncer, a pool too small for its clients makes calls "
                        "wait like this: README, Deployment topologies)"
                        if self.dialect == "postgresql"
                        else ""
                    )
                    raise BackendUnavailableError(
                        f"election database {self.description} did not answer within "
                        f"{timeout}s; the connection was shut down{pool}"
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
        except LostRound:
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
            t.c.liveness_us,
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
            liveness_us=None if row.liveness_us is None else int(row.liveness_us),
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
        live = sa.bindparam("p_live", type_=sa.BigInteger)  # None: trust not session-bound
        taken = {
            # the floor: the greatest term the candidate saw + 1, and its host's clock, so
            # a term lost with a failed-over primary is never reused (whatever the
            # promoted standby's clock says)
            "term": greatest(t.c.term + 1, now, sa.bindparam("p_floor", type_=sa.BigInteger)),
            "token": token,
            "leader_id": sa.bindparam("p_cid"),
            "acquired_at": now,
            "renewed_at": now,
            "expires_at": now + ttl,
            "liveness_us": live,
        }
        steps = {
            # vacant or expired -> a new, strictly greater term for this token
            "elected": sa.update(t)
            .where(t.c.namespace == ns, sa.or_(t.c.token.is_(None), t.c.expires_at <= now))
            .values(taken),
            # the exact term a liveness-lock holder saw, held by a leader whose trust is
            # bound by a session delta it has waited out: taken even before it expires
            "taken": sa.update(t)
            .where(
                t.c.namespace == ns,
                t.c.term == term,
                t.c.token == sa.bindparam("p_seen_token", type_=sa.String()),
                t.c.liveness_us.is_not(None),
                t.c.liveness_us <= sa.bindparam("p_waited", type_=sa.BigInteger),
            )
            .values(taken),
            # only the exact (token, term), only before it expired
            "renewed": sa.update(t)
            .where(t.c.namespace == ns, t.c.token == token, t.c.term == term, t.c.expires_at > now)
            .values(renewed_at=now, expires_at=now + ttl, liveness_us=live),
            # only the exact (token, term); the term stays: it never goes back
            "resigned": sa.update(t)
            .where(t.c.namespace == ns, t.c.token == token, t.c.term == term)
            .values(token=None, leader_id=None, expires_at=now, liveness_us=None),
        }
        # what NOTIFY tells listeners each step did (a take-over is an election)
        events = {
            "elected": "elected",
            "taken": "elected",
            "renewed": "renewed",
            "resigned": "resigned",
        }
        columns = self._lease_columns()
        return {
            step: self.style.statement(stmt, columns, events[step]) for step, stmt in steps.items()
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
        if self.style.returning:

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

    def _lost(
        self, namespace: str, timeout: float | None, connection: Caller | None
    ) -> ElectResult:
        try:
            lease = self.current(namespace, timeout=timeout, connection=connection)
        except BackendUnavailableError:
            lease = None
        return ElectResult(False, lease)

    # -- schema -----------------------------------------------------------------------------

    def install(self) -> list[str]:
        """Create the tables if missing; the names of those created. Safe to race."""
        last: Exception | None = None
        for _attempt in range(5):
            try:
                with self._transaction() as conn:
                    if self.dialect == "postgresql":
                        # Concurrent CREATE TABLE IF NOT EXISTS races on the catalog
                        # (docs/design.md, rule 10): serialise installers on an advisory lock.
                        if conn.execute(sa.select(sa.func.pg_is_in_recovery())).scalar():
                            # CREATE ... IF NOT EXISTS of existing tables succeeds there
                            raise BackendUnavailableError(self._read_only())
                        key = sa.func.hashtext(f"celery_election:{self.table_prefix}")
                        conn.execute(sa.select(sa.func.pg_advisory_xact_lock(key)))
                    have = set(sa.inspect(conn).get_table_names())
                    created = [t.name for t in self.metadata.sorted_tables if t.name not in have]
                    self.metadata.create_all(conn, checkfirst=True)
                    self._add_missing_columns(conn)
                if created:
                    log.info("created tables %s in %s", ", ".join(created), self.description)
                return created
            except DBAPIError as exc:
                if classify(exc) == "unavailable" and "connect" in str(exc).lower():
                    raise BackendUnavailableError(
                        f"cannot reach election database {self.description}: {one_line(exc)}"
                    ) from (exc.orig or exc)
                last = exc
        raise BackendUnavailableError(
            f"could not create the election tables in {self.description}: {last}"
        ) from last

    def _read_only(self) -> str:
        return (
            f"election database {self.description} is a read-only standby: point "
            f"election_url at the primary, or list every host and add "
            f"target_session_attrs=read-write"
        )

    def _add_missing_columns(self, conn: Connection) -> None:
        """Add the columns that tables made by an older version lack.

        ``lease.liveness_us`` and ``beat_run.identity``: they are nullable, so electors and
        beats of the older version still running are unaffected.
        """
        inspector = sa.inspect(conn)
        for table in (self.lease, self.beat_run):
            have = {c["name"] for c in inspector.get_columns(table.name)}
            for column in table.columns:
                if column.name not in have:
                    type_ = column.type.compile(dialect=self.engine.dialect)
                    conn.exec_driver_sql(
                        f"ALTER TABLE {table.name} ADD COLUMN {column.name} {type_}"
                    )

    def _transaction(self) -> Any:
        """A real transaction, for install's advisory lock (held until it ends).

        The engine autocommits its one-statement calls (see ``private_engine``).
        """
        engine = self.engine
        if self.dialect != "sqlite":
            engine = engine.execution_options(isolation_level="READ COMMITTED")
        return engine.begin()

    def uninstall(self) -> None:
        """Drop the tables if they exist. Terms stay increasing after a re-install."""
        with self._transaction() as conn:
            self.metadata.drop_all(conn, checkfirst=True)
            legacy = sa.MetaData()  # the beat ledger of 0.1 (replaced by beat_run)
            for name in ("beat_state", "beat_ledger"):
                sa.Table(f"{self.table_prefix}{name}", legacy).drop(conn, checkfirst=True)

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
        liveness: float | None = None,
        floor: int = 0,
        timeout: float | None = None,
        connection: Caller | None = None,
    ) -> ElectResult:
        """Take the lease if vacant or expired; with ``term``, renew it instead.

        ``liveness``: this candidate's trust is bound by a liveness session with that
        delta (seconds), so a lock holder may take the term over (see ``take_over``).
        ``floor``: the new term is at least this (see ``Backend.elect``).
        """
        if term is not None:
            return self.renew(
                namespace,
                token,
                term,
                ttl,
                liveness=liveness,
                timeout=timeout,
                connection=connection,
            )
        validate_namespace(namespace)
        validate_candidate_id(candidate_id)
        _check_token(token)
        t = self.lease
        params = {
            "p_token": token,
            "p_cid": candidate_id,
            "p_ttl": _us(ttl),
            "p_live": _live_us(liveness),
            "p_floor": floor,
        }
        if not self.style.reads_in_step:
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
        except LostRound:
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
        liveness: float | None = None,
        timeout: float | None = None,
        connection: Caller | None = None,
    ) -> ElectResult:
        """Extend the unexpired lease held by exactly (token, term).

        ``liveness`` tags the term as bound by a liveness session from now on (None: not).
        """
        params = {"p_token": token, "p_term": term, "p_ttl": _us(ttl), "p_live": _live_us(liveness)}
        try:
            result = self._step(
                "renewed", params, namespace, timeout=timeout, connection=connection
            )
        except LostRound:
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
        except LostRound:
            return False
        return result is not None and result.won

    def take_over(
        self,
        namespace: str,
        token: str,
        candidate_id: str,
        ttl: float,
        seen: Lease,
        waited: float,
        *,
        liveness: float | None = None,
        floor: int = 0,
        timeout: float | None = None,
    ) -> ElectResult:
        """Take exactly the term ``seen``, even before it expires, if its tag allows.

        The leader of ``seen`` must be bound by a liveness session whose delta is no
        longer than ``waited``. Only a holder of the namespace's liveness lock may call
        this, ``waited`` seconds after its grant (measured before the call): the old
        session ended before the grant, so the old leader's trust (last good ping +
        delta) has ended too.
        """
        _check_token(token)
        params = {
            "p_token": token,
            "p_cid": candidate_id,
            "p_ttl": _us(ttl),
            "p_live": _live_us(liveness),
            "p_term": seen.term,
            "p_seen_token": seen.token,
            "p_waited": _us(waited),
            "p_floor": floor,
        }
        try:
            result = self._step("taken", params, namespace, timeout=timeout, connection=None)
        except LostRound:
            result = None
        if result is not None and result.won:
            return result
        return result or self._lost(namespace, timeout, None)

    def liveness_session(self, namespace: str, delta: float, max_wait: float) -> LivenessSession:
        """A liveness lock for ``namespace`` on a connection of its own (liveness.py).

        ``max_wait`` bounds one ``acquire``; the connection's read timeout allows for it.
        """
        return sql_session(
            self.engine,
            self.direct_url,
            self.table_prefix,
            namespace,
            delta,
            max_wait,
            self._connect_timeout,
        )

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

    def holds(self, conn: Connection, namespace: str, token: str, term: int) -> bool:
        """Whether the lease has exactly (token, term), unexpired, read on ``conn`` now."""
        t = self.lease
        stmt = sa.select(sa.func.count()).where(
            t.c.namespace == namespace,
            t.c.token == token,
            t.c.term == term,
            t.c.expires_at > db_now_us(),
        )
        return bool(conn.execute(stmt).scalar())

    @functools.cached_property
    def beat(self) -> SQLBeatStore:
        """The beat entries' shared run state (the fence of every beat send)."""
        return SQLBeatStore(self)

    @functools.cached_property
    def schedule(self) -> SQLScheduleStore:
        """The operable schedule: entries changed at runtime, run now, history, audit."""
        return SQLScheduleStore(self)

    def _in_transaction(self, work: Callable[[Connection], T], *, table: sa.Table) -> T:
        """``work`` in one real transaction (an operator's change: several statements)."""
        for attempt in range(5):
            try:
                with (
                    self._fork_guard,
                    self._errors(table, write=True),
                    self._transaction() as conn,
                ):
                    return work(conn)
            except LostRound:  # a deadlock or serialisation failure: nothing was written
                if attempt == 4:
                    raise BackendUnavailableError(
                        f"election database {self.description} kept refusing the change "
                        f"(lock contention); try again"
                    ) from None
        raise AssertionError("unreachable")  # pragma: no cover

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


def _us(seconds: float) -> int:
    return round(seconds * 1_000_000)


def _live_us(liveness: float | None) -> int | None:
    return None if liveness is None else _us(liveness)


def _check_token(token: object) -> None:
    if not isinstance(token, str) or len(token) != TOKEN_LENGTH:
        raise ConfigurationError(
            f"token must be a {TOKEN_LENGTH}-character string (uuid4().hex): got {token!r}"
        )
