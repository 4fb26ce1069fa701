"""Task runs' start records on SQL: the inbox that turns a second delivery into a skip.

One row per (namespace, run key). A worker about to run a task inserts the row if it is
absent, in one statement (PostgreSQL and SQLite ``ON CONFLICT DO NOTHING``, MySQL/MariaDB
``INSERT IGNORE``): the database decides which of two racing deliveries recorded it, so
exactly one runs (docs/design.md, rule 1). The row's times are the database's clock. The
run's end sets ``finished_at``; under ``acks_late`` a redelivery of a run that never
finished takes it over with a compare-and-set on ``attempt``. A lock timeout or deadlock
is not "someone else recorded it": it raises, and the worker tries the delivery later.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ..errors import BackendUnavailableError
from .base import TaskStart
from .connection import LostRound
from .schema import db_now_us

if TYPE_CHECKING:
    from .sql_host import SQLHost

__all__ = ["SQLStartStore"]


class SQLStartStore:
    """The :class:`~celery_election.backends.base.StartStore` of a :class:`SQLBackend`."""

    def __init__(self, backend: SQLHost) -> None:
        self.backend = backend
        self.table = backend.metadata.tables[f"{backend.table_prefix}task_start"]

    def _write(self, stmt: sa.Executable, timeout: float | None, *, rows: bool = False) -> bool:
        """Run one statement; True if it changed exactly one row. Contention raises.

        ``rows``: count the rows it returns (an INSERT's rowcount is -1 through psycopg).
        """

        def work(conn: Connection) -> bool:
            result = conn.execute(stmt)
            return (len(result.all()) if rows else int(result.rowcount)) == 1

        try:
            return self.backend.call(
                work, table=self.table, write=True, timeout=timeout, connection=None
            )
        except LostRound as exc:  # not "a duplicate": nothing is known, try again later
            raise BackendUnavailableError(
                f"election database {self.backend.description} refused a start record "
                f"(lock contention); try again"
            ) from exc

    def record_start(
        self, namespace: str, start: TaskStart, *, timeout: float | None = None
    ) -> bool:
        """Insert the start record unless its key exists: one statement (see the module)."""
        values: dict[str, Any] = {
            "namespace": namespace,
            "run_key": start.run_key,
            "task_id": start.task_id[:255],
            "task_name": start.task_name[:255],
            "hostname": start.hostname[:255],
            "pid": start.pid,
            "attempt": 1,
            "started_at": db_now_us(),
        }
        stmt = self.backend.db.insert_ignore(self.table, values)
        if self.backend.engine.dialect.insert_returning:
            return self._write(stmt.returning(self.table.c.run_key), timeout, rows=True)
        return self._write(stmt, timeout)

    def rerun_start(
        self,
        namespace: str,
        run_key: str,
        attempt: int,
        hostname: str,
        pid: int,
        *,
        timeout: float | None = None,
    ) -> bool:
        """Take the unfinished ``attempt`` over for one more (``acks_late``): one statement."""
        t = self.table
        stmt = (
            sa.update(t)
            .where(
                t.c.namespace == namespace,
                t.c.run_key == run_key,
                t.c.attempt == attempt,
                t.c.finished_at.is_(None),
            )
            .values(attempt=attempt + 1, hostname=hostname[:255], pid=pid, started_at=db_now_us())
        )
        return self._write(stmt, timeout)

    def record_finish(
        self,
        namespace: str,
        run_key: str,
        outcome: str,
        *,
        attempt: int = 1,
        timeout: float | None = None,
    ) -> bool:
        """Mark ``attempt`` finished; a later attempt that took the run over is left alone."""
        t = self.table
        stmt = (
            sa.update(t)
            .where(
                t.c.namespace == namespace,
                t.c.run_key == run_key,
                t.c.attempt == attempt,
                t.c.finished_at.is_(None),
            )
            .values(finished_at=db_now_us(), outcome=outcome[:16])
        )
        return self._write(stmt, timeout)

    def prune_starts(
        self, namespace: str, older_than: float, *, batch: int = 5000, timeout: float | None = None
    ) -> int:
        """Delete up to ``batch`` old records of ``namespace``: one statement (its index)."""
        t = self.table
        cut = db_now_us() - int(older_than * 1_000_000)
        where = sa.and_(t.c.namespace == namespace, t.c.started_at < cut)
        stmt = self.backend.db.delete_at_most(t.c.run_key, where, batch).where(
            t.c.namespace == namespace
        )
        try:
            return int(
                self.backend.call(
                    lambda conn: conn.execute(stmt).rowcount,
                    table=t,
                    write=True,
                    timeout=timeout,
                    connection=None,
                )
            )
        except LostRound as exc:  # a deadlock with the inserts: the next prune goes on
            raise BackendUnavailableError(
                f"election database {self.backend.description} refused a prune of start "
                f"records (lock contention)"
            ) from exc

    def load_start(
        self, namespace: str, run_key: str, *, timeout: float | None = None
    ) -> TaskStart | None:
        """The start record of ``run_key``, or None."""
        t = self.table
        stmt = sa.select(t).where(t.c.namespace == namespace, t.c.run_key == run_key)
        return self.backend.call(
            lambda conn: _start(conn.execute(stmt).first()),
            table=t,
            write=False,
            timeout=timeout,
            connection=None,
        )

    def load_starts(
        self,
        namespace: str,
        *,
        task_id: str | None = None,
        limit: int = 100,
        timeout: float | None = None,
    ) -> list[TaskStart]:
        """The newest start records (of one task id if given), newest first."""
        t = self.table
        stmt = sa.select(t).where(t.c.namespace == namespace)
        if task_id is not None:
            stmt = stmt.where(t.c.task_id == task_id)
        stmt = stmt.order_by(t.c.started_at.desc(), t.c.run_key).limit(limit)

        def work(conn: Connection) -> list[TaskStart]:
            return [s for s in map(_start, conn.execute(stmt)) if s is not None]

        return self.backend.call(work, table=t, write=False, timeout=timeout, connection=None)


def _start(row: sa.Row[Any] | None) -> TaskStart | None:
    if row is None:
        return None
    finished = row.finished_at
    return TaskStart(
        run_key=row.run_key,
        task_id=row.task_id,
        task_name=row.task_name,
        hostname=row.hostname,
        pid=int(row.pid),
        attempt=int(row.attempt),
        started_at_us=int(row.started_at),
        finished_at_us=None if finished is None else int(finished),
        outcome=row.outcome,
    )
