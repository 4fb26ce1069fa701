"""What the SQL backend's stores use of it: one class, so none of them imports sql.py.

The beat runs (``sql_beat``), the operable schedule's tables (``celery_election.schedule``)
and the installer (``sql_install``) each get the backend they serve as a ``SQLHost``: its
engine and dialect, its tables, and how a call runs (inherited from ``sql_calls.SQLCalls``:
one short transaction of its own, bounded, errors mapped). ``SQLBackend`` is the one
implementation.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from .sessions import LivenessSession
from .sql_calls import SQLCalls

__all__ = ["SQLHost"]


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


class SQLHost(SQLCalls):
    """The SQL backend as its stores see it (see the module)."""

    table_prefix: str
    metadata: sa.MetaData
    lease: sa.Table
    candidate: sa.Table
    beat_run: sa.Table
    key_hold: sa.Table

    @property
    def runs(self) -> ClaimWriter:
        """The run rows (a beat's claim writes them in its transaction: sql_runs.py)."""
        raise NotImplementedError

    def liveness_session(self, namespace: str, delta: float, max_wait: float) -> LivenessSession:
        """A liveness lock named by ``namespace`` on a connection of its own."""
        raise NotImplementedError
