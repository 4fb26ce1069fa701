"""What every database's ``Dialect`` answers, and the defaults (the client-server ones).

The list of what differs and how to add a database is ``dialects.py``'s, which holds the
registry (``DIALECTS``, ``dialect_for``); one module per database subclasses ``Dialect``
here: ``dialect_sqlite.py``, ``dialect_postgresql.py``, ``dialect_mysql.py``. ``StepStyle``
is the shape of a lease step (``RETURNING`` or ``ROWCOUNT``; PostgreSQL's is
``postgres.NotifyStyle``).
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import sqlalchemy as sa
from sqlalchemy.engine import URL, Connection, Engine
from sqlalchemy.exc import DBAPIError

from . import green
from .connection import Timeouts, dispose_in_child
from .locks import LivenessSession

__all__ = ["RETURNING", "ROWCOUNT", "Dialect", "LockRequest", "StepStyle"]


@dataclass(frozen=True)
class LockRequest:
    """A liveness lock to hold on a connection of its own to ``url`` (``engine``'s driver).

    ``max_wait`` bounds one ``acquire``: the connection's read timeout allows for it.
    """

    engine: Engine
    url: URL
    key: bytes
    delta: float
    max_wait: float
    connect_timeout: float


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

    def private_engine(
        self,
        url: URL,
        *,
        timeouts: Timeouts,
        allow_network_filesystem: bool,
        engine_options: dict[str, Any],
    ) -> Engine:
        """The elector's own engine, never the application's.

        This dialect's options and session set-up, then the caller's ``engine_options`` on
        top; a forked child drops it without closing it.
        """
        url = self.engine_url(url, allow_network_filesystem=allow_network_filesystem)
        options: dict[str, Any] = {"pool_pre_ping": False, "pool_recycle": 1800}
        own, connect_args = self.engine_options(url.get_driver_name(), timeouts)
        options.update(own)
        options["connect_args"] = {**connect_args, **engine_options.pop("connect_args", {})}
        options.update(engine_options)
        engine = sa.create_engine(url, **options)
        green.cooperate(engine)
        self.set_up_sessions(engine, timeouts.statement)
        os.register_at_fork(after_in_child=dispose_in_child(weakref.ref(engine)))
        return engine

    def normalise_url(self, url: URL) -> URL:
        """``url`` in the form the driver reads (the lease URL and the direct URL)."""
        return url

    def engine_url(self, url: URL, *, allow_network_filesystem: bool) -> URL:
        """The URL the private engine connects to; refuses one it cannot use safely."""
        return url

    def engine_options(
        self, driver: str, timeouts: Timeouts
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
        return {**options, "pool_timeout": timeouts.statement}, {}

    def set_up_sessions(self, engine: Engine, statement_timeout: float) -> None:
        """Listen for the engine's new connections and set each session up."""

    def transaction(self, engine: Engine) -> Any:
        """A real transaction (the engine autocommits its one-statement calls)."""
        return engine.execution_options(isolation_level="READ COMMITTED").begin()

    def atomic(self, conn: Connection) -> None:
        """Make ``conn``'s next ``begin()`` a real transaction (until it goes back).

        Setting the level talks to the server outside a statement: a connection lost
        there raises the driver's own error, wrapped here as a statement's would be (raw,
        it stopped a beat: the chaos sample's MariaDB cut).
        """
        dbapi = conn.dialect.loaded_dbapi
        try:
            conn.execution_options(isolation_level="READ COMMITTED")
        except dbapi.Error as exc:
            conn.invalidate()
            raise DBAPIError.instance(
                None, None, exc, dbapi.Error, connection_invalidated=True, dialect=conn.dialect
            ) from exc

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
        """INSERT the row(s) unless the key exists; a duplicate inserts nothing, silently.

        ``values``: one row; ``from_select`` = (columns, SELECT): the rows it gives.
        """
        ins = self.insert(table)
        if from_select is not None:
            return self.ignoring(ins.from_select(*from_select))
        return self.ignoring(ins.values(**values or {}))

    def ignoring(self, ins: Any) -> sa.Insert:
        """``ins``, skipping a row whose key exists (``insert_ignore``)."""
        result: sa.Insert = ins.on_conflict_do_nothing()
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

    def liveness_session(self, lock: LockRequest) -> LivenessSession:
        """``lock`` on a connection of its own (locks.py).

        Never from the engine's pool: a pooled connection is shared, and a session lock
        must die with this candidate alone.
        """
        raise NotImplementedError
