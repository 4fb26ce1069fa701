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

The SQL backend, one job per file: ``dialects.py`` (what differs between the databases;
the private engine: ``Dialect.private_engine``), ``schema.py`` (tables, the database
clock), ``connection.py`` (call deadlines, fork safety), ``sql_calls.py`` (each call's
transaction, deadline, retry and error mapping), ``sql_lease.py`` (the lease steps'
statements), this file (the lease), ``sql_candidates.py`` (the candidates),
``sql_install.py`` (the tables), ``sql_beat.py`` (``backend.beat``: beat run state),
``sql_keys.py`` (``backend.keys``: key holds), ``sql_runs.py`` (``backend.runs``: the run
rows); ``postgres.py`` adds NOTIFY to the steps and a LISTEN thread.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Mapping
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import URL, Connection, Engine, make_url

from ..core.config import validate_candidate_id, validate_namespace, without_celery_prefix
from ..core.lease import Bid, CandidateInfo, ElectResult, Lease, us
from ..errors import ConfigurationError
from . import sql_install
from .base import Wakeup, WakeupHandle
from .connection import Timeouts, fork_lock
from .dialect_base import LockRequest, StepStyle
from .dialects import dialect_for
from .locks import LivenessSession, lock_key
from .schema import (
    DEFAULT_TABLE_PREFIX,
    db_now_us,
    make_metadata,
    validate_table_prefix,
)
from .sql_beat import SQLBeatStore
from .sql_calls import Caller
from .sql_candidates import SQLCandidates, check_token
from .sql_keys import SQLKeyStore
from .sql_lease import HoldSteps, bid_params, lease_columns, lease_from_row, lease_statements
from .sql_runs import SQLRunStore

__all__ = ["DEFAULT_TABLE_PREFIX", "Caller", "SQLBackend", "db_now_us", "make_metadata"]

log = logging.getLogger(__name__)


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
    return parsed.set(drivername=like.drivername)


class SQLBackend(SQLCandidates):
    """Leader election state in SQL tables, one code path for three databases.

    ``url_or_engine`` is a SQLAlchemy URL or an existing Engine. The backend always builds
    its own private engine (from the Engine's URL if given one): the application's pool
    must not be able to starve renewals, and the elector's connections carry their own
    timeouts. Pass ``connection=`` (a Connection or an ORM Session) to a method to run
    that step inside the caller's own transaction instead: it commits or rolls back with
    the caller's work, and is not bounded by a deadline here. How each call runs:
    ``SQLCalls`` (sql_calls.py); what differs between the databases: ``self.db``
    (dialects.py).
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
        self.db = dialect_for(url.get_backend_name())
        self.engine = self.db.private_engine(
            self.db.normalise_url(url),
            timeouts=Timeouts(statement_timeout, connect_timeout, sqlite_busy_timeout),
            allow_network_filesystem=allow_network_filesystem,
            engine_options=dict(engine_options or {}),
        )
        self.dialect = self.engine.dialect.name
        self.description = self.engine.url.render_as_string(hide_password=True)
        #: Where session state (the liveness lock, LISTEN) goes: ``direct_url`` when the
        #: lease URL leads through a transaction pooler, else the lease URL itself.
        self.direct_url = self.engine.url
        if direct_url is not None:
            self.direct_url = self.db.normalise_url(_same_driver(direct_url, self.engine.url))
        if self.db.in_process:
            log.info("election database is the SQLite file %s", self.engine.url.database)
        self.metadata = make_metadata(table_prefix)
        self.meta = self.metadata.tables[f"{table_prefix}meta"]
        self.lease = self.metadata.tables[f"{table_prefix}lease"]
        self.candidate = self.metadata.tables[f"{table_prefix}candidate"]
        self.beat_run = self.metadata.tables[f"{table_prefix}beat_run"]
        self.key_hold = self.metadata.tables[f"{table_prefix}key"]
        self.style = self.db.step_style(self.engine)
        self._closed = False
        # SQLite runs inside this process: a fork while one of our calls holds its
        # allocator mutex leaves the child stuck on the copy. Forks wait for the call.
        self._fork_guard = contextlib.nullcontext()
        if self.db.in_process:
            self._fork_guard = fork_lock()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.description} prefix={self.table_prefix!r}>"

    # -- one step of the lease (its statements: sql_lease.py) -------------------------------

    def _select_lease(self, conn: Connection, namespace: str) -> Lease | None:
        stmt = sa.select(*lease_columns(self.lease)).where(self.lease.c.namespace == namespace)
        return lease_from_row(conn.execute(stmt).first())

    @functools.cached_property
    def _steps(self) -> HoldSteps:
        """The lease's steps (sql_lease.py), each statement built once."""

        def read(
            params: dict[str, Any], timeout: float | None, conn: Caller | None
        ) -> Lease | None:
            return self.current(params["p_ns"], timeout=timeout, connection=conn)

        statements = lease_statements(self.lease, self.candidate, self.style)
        return HoldSteps(self, self.lease, statements, self.style, read)

    # -- schema (sql_install.py: its functions are these methods) ---------------------------

    install = sql_install.install
    uninstall = sql_install.uninstall
    drop_ddl = sql_install.drop_ddl
    create_ddl = sql_install.create_ddl

    # -- the lease --------------------------------------------------------------------------

    def elect(
        self,
        bid: Bid,
        *,
        term: int | None = None,
        timeout: float | None = None,
        connection: Caller | None = None,
    ) -> ElectResult:
        """Take the lease if vacant or expired; with ``term``, renew it instead.

        ``bid.liveness``: this candidate's trust is bound by a liveness session with
        that delta (seconds), so a lock holder may take the term over (see ``take_over``).
        ``bid.floor``: the new term is at least this (see ``Backend.elect``).
        """
        ns, token = bid.namespace, bid.token
        if term is not None:
            return self.renew(ns, token, term, bid.ttl, liveness=bid.liveness,
                              timeout=timeout, connection=connection)  # fmt: skip
        validate_namespace(ns)
        validate_candidate_id(bid.holder_id)
        check_token(token)
        if not self.style.reads_in_step:
            # Without a read in the same statement, a losing UPDATE would cost a second
            # statement to report the row. So look first, and only try the UPDATE when
            # the lease looks vacant or expired: the UPDATE still decides, and a stale
            # read can only delay an attempt, never let two win.
            seen = self.current(ns, timeout=timeout, connection=connection)
            if seen is not None and seen.held:
                return ElectResult(False, seen)
        params = bid_params(bid)
        vacant = {"namespace": ns, "term": 0, "expires_at": 0}
        return self._steps.take(params, vacant, timeout, connection)

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
        params = {"p_ns": namespace, "p_token": token, "p_term": term, "p_ttl": us(ttl),
                  "p_live": us(liveness)}  # fmt: skip
        return self._steps.run("renewed", params, timeout, connection)

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
        params = {"p_ns": namespace, "p_token": token, "p_term": term}
        result = self._steps.tried("resigned", params, timeout, connection)
        return result is not None and result.won

    def take_over(
        self, bid: Bid, seen: Lease, waited: float, *, timeout: float | None = None
    ) -> ElectResult:
        """Take exactly the term ``seen``, even before it expires, if its tag allows.

        The leader of ``seen`` must be bound by a liveness session whose delta is no
        longer than ``waited``. Only a holder of the namespace's liveness lock may call
        this, ``waited`` seconds after its grant (measured before the call): the old
        session ended before the grant, so the old leader's trust (last good ping +
        delta) has ended too.
        """
        check_token(bid.token)
        params = bid_params(bid)
        params.update(p_term=seen.term, p_seen_token=seen.token, p_waited=us(waited))
        return self._steps.run("taken", params, timeout, None)

    def transfer(
        self,
        namespace: str,
        token: str,
        term: int,
        target: CandidateInfo,
        ttl: float,
        *,
        floor: int = 0,
        timeout: float | None = None,
    ) -> ElectResult:
        """Hand the unexpired term (token, term) to ``target``, a live, eligible candidate.

        One conditional write that names the target: the term moves to it with a new,
        greater term, untagged, or nothing changes. Call it only after belief in ``term``
        has ended (``Elector.transfer``). The row after the step either way.
        """
        check_token(token)
        check_token(target.token)
        params = {
            "p_ns": namespace,
            "p_token": token,
            "p_term": term,
            "p_target": target.token,
            "p_target_cid": target.candidate_id,
            "p_ttl": us(ttl),
            "p_floor": floor,
        }
        return self._steps.run("transferred", params, timeout, None)

    def ask_transfer(
        self, namespace: str, seen: Lease, target: CandidateInfo, *, timeout: float | None = None
    ) -> bool:
        """Ask the holder of the term ``seen`` to hand it to ``target`` (an operator's call).

        Written only if ``seen`` is still the unexpired lease and ``target`` a live,
        eligible candidate; the leader acts on it at its next renewal.
        """
        if seen.token is None:
            return False
        check_token(target.token)
        params = {"p_ns": namespace, "p_token": seen.token, "p_term": seen.term,
                  "p_target": target.token}  # fmt: skip
        result = self._steps.tried("asked", params, timeout, None)
        return result is not None and result.won

    def liveness_session(self, namespace: str, delta: float, max_wait: float) -> LivenessSession:
        """A liveness lock for ``namespace`` on a connection of its own (locks.py)."""
        key = lock_key(self.table_prefix, namespace)
        return self.db.liveness_session(
            LockRequest(self.engine, self.direct_url, key, delta, max_wait, self._connect_timeout)
        )

    def current(
        self, namespace: str, *, timeout: float | None = None, connection: Caller | None = None
    ) -> Lease | None:
        """The lease row as stored now (None if this namespace was never elected)."""
        return self.call(
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

        return self.call(work, table=lease, write=False, timeout=timeout, connection=None)

    @functools.cached_property
    def beat(self) -> SQLBeatStore:
        """The beat entries' shared run state (the fence of every beat send)."""
        return SQLBeatStore(self)

    @functools.cached_property
    def keys(self) -> SQLKeyStore:
        """Key holds (singleton tasks; sql_keys.py)."""
        return SQLKeyStore(self)

    @functools.cached_property
    def runs(self) -> SQLRunStore:
        """The run rows (run once on the workers: sql_runs.py)."""
        return SQLRunStore(self)

    def subscribe_wakeups(
        self, namespace: str, callback: Callable[[Wakeup], None]
    ) -> WakeupHandle | None:
        """Plain SQL has no notifications: followers poll."""
        return None

    def release_idle(self) -> None:
        """Close the pooled connections nobody is using: a waiting follower holds none.

        Called by an elector about to wait long (a standby); the next call reconnects.
        A connection in use elsewhere (beat, the schedule) is left alone.
        """
        pool = self.engine.pool
        if not self._closed and pool.checkedout() == 0 and pool.checkedin() > 0:  # type: ignore[attr-defined]
            self.engine.dispose(close=True)

    def topology_warnings(self, *, lock_on: bool) -> list[str]:
        """Nothing to say for plain SQL (PostgresBackend reads its replication)."""
        return []

    def close(self) -> None:
        """Dispose of the private engine (idempotent)."""
        if not self._closed:
            self._closed = True
            self.engine.dispose()
