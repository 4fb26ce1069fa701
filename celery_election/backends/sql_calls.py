"""Every call of the SQL backend: one short transaction of its own, bounded, errors mapped.

(docs/design.md, rules 1 and 8.) A call runs in its own transaction on the private engine,
under a client-side deadline (``connection.WATCHDOG``): a call that outlives it has its
socket shut down and its connection discarded. A pooled connection that died while idle
is retried once on a fresh one (every step is safe to repeat). The dialect says what a
failed call means (``Dialect.classify``): a lost round (``LostRound``, for writes), a
missing table (``SchemaMissingError``), a read-only standby or an unreachable database
(``BackendUnavailableError``). A caller's own Connection or ORM Session runs the work in
the caller's transaction instead.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError, NoSuchTableError
from sqlalchemy.orm import Session

from ..errors import BackendUnavailableError, IncompatibleSchemaError, SchemaMissingError
from .connection import WATCHDOG, Deadline, LostRound, one_line
from .dialect_base import Dialect
from .schema import PROTOCOL, SCHEMA_VERSION

__all__ = ["Caller", "SQLCalls", "check_versions", "read_versions", "rowcount"]

T = TypeVar("T")

#: Where a caller's own transaction can be passed: a Core Connection or an ORM Session.
Caller = Connection | Session


def rowcount(
    stmt: sa.Executable, params: dict[str, Any] | None = None
) -> Callable[[Connection], int]:
    """Work for ``call``: execute ``stmt`` (with ``params``) and return the rows it changed."""
    return lambda conn: int(conn.execute(stmt, params).rowcount)


def read_versions(meta: sa.Table, conn: Connection) -> dict[str, int]:
    """The meta table's rows (``schema``, ``protocol``); tables of 0.1.0 have none."""
    rows = conn.execute(sa.select(meta.c.name, meta.c.value))
    return {name: int(value) for name, value in rows}


def check_versions(versions: dict[str, int], where: str) -> None:
    """Refuse tables, or peers, newer than this code: before anything is written."""
    schema, protocol = versions.get("schema", 1), versions.get("protocol", 1)
    if schema > SCHEMA_VERSION:
        raise IncompatibleSchemaError(
            f"the election tables in {where} are schema version {schema}, newer than "
            f"this celery-election understands ({SCHEMA_VERSION}): upgrade celery-election "
            f"on this host"
        )
    if protocol > PROTOCOL:
        raise IncompatibleSchemaError(
            f"the processes electing in {where} speak election protocol {protocol}; this "
            f"celery-election speaks {PROTOCOL}: upgrade celery-election on this host"
        )


class SQLCalls:
    """How :class:`~celery_election.backends.sql.SQLBackend` runs each call (see the module)."""

    engine: Engine
    meta: sa.Table
    #: the tables' versions were found compatible (``check_versions``)
    _versions_checked = False
    #: what differs on this database (dialects.py)
    db: Dialect
    #: the URL with its password hidden, for messages
    description: str
    #: SQLite runs inside this process: forks wait for a call (``connection.fork_lock``)
    _fork_guard: threading.Lock | contextlib.nullcontext[None]

    @contextmanager
    def _errors(self, table: sa.Table, *, write: bool) -> Iterator[None]:
        try:
            yield
        except DBAPIError as exc:
            kind = self.db.classify(exc)
            if kind == "missing":
                raise SchemaMissingError(table.name, self.description) from exc
            if kind == "contention" and write:
                raise LostRound() from exc
            if kind == "read-only":
                raise BackendUnavailableError(self.read_only_message()) from (exc.orig or exc)
            if kind in ("unavailable", "contention"):
                error = BackendUnavailableError(
                    f"election database {self.description} is unavailable: {one_line(exc)}"
                )
                error.connection_invalidated = exc.connection_invalidated
                raise error from (exc.orig or exc)
            raise
        except NoSuchTableError as exc:
            raise SchemaMissingError(table.name, self.description) from exc

    def call(
        self,
        work: Callable[[Connection], T],
        *,
        table: sa.Table,
        write: bool,
        timeout: float | None,
        connection: Caller | None,
        atomic: bool = False,
    ) -> T:
        """Run ``work`` in one short transaction of its own, bounded by ``timeout``.

        Its statements commit each as it runs (autocommit: a step holds no row while the
        client's COMMIT is on its way), or all together (``atomic``: a claim and its runs'
        rows). Before this backend's first write, the tables' versions are checked once:
        tables or peers newer than this code are refused before anything is written.
        """
        if write and not self._versions_checked:
            self._check_versions(timeout)
        if connection is not None:
            # The caller's transaction: no commit, no deadline, no retry here.
            conn = connection.connection() if isinstance(connection, Session) else connection
            with self._errors(table, write=write):
                return work(conn)
        with self._fork_guard:
            return self._run_bounded(work, table=table, write=write, timeout=timeout, atomic=atomic)

    def _check_versions(self, timeout: float | None) -> None:
        try:
            with self._fork_guard:
                versions = self._run_bounded(
                    lambda conn: read_versions(self.meta, conn),
                    table=self.meta,
                    write=False,
                    timeout=timeout,
                )
        except SchemaMissingError:
            versions = {}  # tables of 0.1.0, or none yet (the write will say which)
        check_versions(versions, self.description)
        self._versions_checked = True

    def _run_bounded(
        self,
        work: Callable[[Connection], T],
        *,
        table: sa.Table,
        write: bool,
        timeout: float | None,
        atomic: bool = False,
    ) -> T:
        started = time.monotonic()
        for attempt in (1, 2):
            left = None if timeout is None else max(0.05, timeout - (time.monotonic() - started))
            deadline: Deadline | None = None
            try:
                with self._errors(table, write=write), self.engine.connect() as conn:
                    if not write:
                        conn.execution_options(_election_read=True)
                    elif atomic:
                        self.db.atomic(conn)
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
                    raise BackendUnavailableError(
                        f"election database {self.description} did not answer within "
                        f"{timeout}s; the connection was shut down{self.db.deadline_hint}"
                    ) from exc
                if attempt == 1 and getattr(exc, "connection_invalidated", False):
                    # A pooled connection died while idle (server restart, killed
                    # backend). Every step is safe to repeat: renew and resign are
                    # scoped to (token, term), and a repeated take shows up as "held
                    # by this token". So try once more on a fresh connection.
                    continue
                raise
        raise AssertionError("unreachable")  # pragma: no cover

    def call_write(
        self,
        work: Callable[[Connection], T],
        *,
        table: sa.Table,
        lost: T,
        timeout: float | None,
        connection: Caller | None = None,
        atomic: bool = False,
    ) -> T:
        """A write whose loss to contention means ``lost``, not an error."""
        try:
            return self.call(work, table=table, write=True, timeout=timeout,
                             connection=connection, atomic=atomic)  # fmt: skip
        except LostRound:
            return lost

    def call_in_transaction(self, work: Callable[[Connection], T], *, table: sa.Table) -> T:
        """``work`` in one real transaction (an operator's change: several statements)."""
        for attempt in range(5):
            try:
                with (
                    self._fork_guard,
                    self._errors(table, write=True),
                    self.begin() as conn,
                ):
                    return work(conn)
            except LostRound:  # a deadlock or serialisation failure: nothing was written
                time.sleep(random.uniform(0.01, 0.05) * (attempt + 1))  # apart, then again
                if attempt == 4:
                    raise BackendUnavailableError(
                        f"election database {self.description} kept refusing the change "
                        f"(lock contention); try again"
                    ) from None
        raise AssertionError("unreachable")  # pragma: no cover

    def begin(self) -> Any:
        """A real transaction, for install's advisory lock (held until it ends).

        The engine autocommits its one-statement calls (see ``Dialect.private_engine``).
        """
        return self.db.transaction(self.engine)

    def read_only_message(self) -> str:
        return (
            f"election database {self.description} is a read-only standby: point "
            f"election_url at the primary, or list every host and add "
            f"target_session_attrs=read-write"
        )
