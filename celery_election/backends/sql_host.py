"""What the SQL backend's stores use of it: one protocol, so none of them imports sql.py.

The beat runs (``sql_beat``), the operable schedule's tables (``celery_election.schedule``)
and the installer (``sql_install``) each get the backend they serve as a ``SQLHost``: its
engine and dialect, its tables, and how a call runs (``sql_calls.SQLCalls``: one short
transaction of its own, bounded, errors mapped). ``SQLBackend`` is the one implementation.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.orm import Session

from .dialect_base import Dialect
from .sessions import LivenessSession

__all__ = ["SQLHost"]

T = TypeVar("T")


class ClaimWriter(Protocol):
    """What a claim's transaction writes of the run rows (``SQLRunStore.write_claimed``)."""

    def write_claimed(
        self,
        conn: Connection,
        namespace: str,
        term: int,
        runs: Sequence[tuple[str, int, str, str, str, int | None]],
    ) -> None:
        """The rows of the runs the claim won: (entry, due, task id, task, kind, due at)."""


class SQLHost(Protocol):
    """The SQL backend as its stores see it (see the module)."""

    engine: Engine
    #: what differs on this database (dialects.py)
    db: Dialect
    #: the URL with its password hidden, for messages
    description: str
    table_prefix: str
    metadata: sa.MetaData
    meta: sa.Table
    lease: sa.Table
    candidate: sa.Table
    beat_run: sa.Table
    key_hold: sa.Table

    @property
    def runs(self) -> ClaimWriter:
        """The run rows (a beat's claim writes them in its transaction: sql_runs.py)."""

    def liveness_session(self, namespace: str, delta: float, max_wait: float) -> LivenessSession:
        """A liveness lock named by ``namespace`` on a connection of its own."""

    def holds(self, conn: Connection, namespace: str, token: str, term: int) -> bool:
        """Whether the lease has exactly (token, term), unexpired, read on ``conn`` now."""

    def call(
        self,
        work: Callable[[Connection], T],
        *,
        table: sa.Table,
        write: bool,
        timeout: float | None,
        connection: Connection | Session | None,
        atomic: bool = False,
    ) -> T:
        """Run ``work`` bounded by ``timeout``: autocommit, or one transaction (``atomic``)."""

    def call_write(
        self,
        work: Callable[[Connection], T],
        *,
        table: sa.Table,
        lost: T,
        timeout: float | None,
        connection: Connection | Session | None = None,
        atomic: bool = False,
    ) -> T:
        """A write whose loss to contention means ``lost``, not an error."""

    def call_in_transaction(self, work: Callable[[Connection], T], *, table: sa.Table) -> T:
        """``work`` in one real transaction (several statements)."""

    def begin(self) -> Any:
        """A real transaction (the engine autocommits its one-statement calls)."""

    def read_only_message(self) -> str:
        """What to do when the database is a read-only standby."""
