"""The run rows on SQL: core/runstate.py's transitions, each one conditional statement.

One row per (namespace, run key). A call reads the row, applies the transition (the same
pure function the memory store applies under its lock) and writes the result with one
statement that changes the row only if it still holds what was read: the state, the
attempt, the starting delivery and whether it finished (an absent row: an insert if
absent, PostgreSQL and SQLite ``ON CONFLICT DO NOTHING``, MySQL/MariaDB ``INSERT
IGNORE``). Of two deliveries that race, one write wins and the other reads again and
decides on what it finds (docs/design.md, rule 1). Times are the database's clock. A
lock timeout or deadlock is not an answer: it raises, and the worker tries later.

The common steps skip the read: a run's first start tries the insert first (a run nobody
started is absent), and its end is one UPDATE whose WHERE is ``runstate.finish``'s guard.
So a run costs its worker two statements, each its own commit.

0.2 workers in a rolling upgrade still insert-if-absent into these rows and take an
unfinished run over by its attempt; their rows have no state and read as started (or
ended, once finished).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ..core import runstate
from ..core.runstate import CLAIMED, DROPPED, ENDED, SENT, STARTED, Delivery, Row, Start
from ..errors import BackendUnavailableError
from .base import Alive, End, RunRecord
from .connection import LostRound
from .schema import db_now_us, entry_key
from .sql_calls import rowcount

if TYPE_CHECKING:
    from .sql_host import SQLHost

__all__ = ["SQLRunStore"]

#: Writes lost to another writer of the same row before a call gives up (contention).
TRIES = 8
T = TypeVar("T")
#: Runs per confirm or drop statement.
BATCH = 500
#: A run a beat's claim won: (entry, due, task id, task name, kind, due at).
Claimed = tuple[str, int, str, str, str, int | None]


class SQLRunStore:
    """The :class:`~celery_election.backends.base.RunStore` of a :class:`SQLBackend`."""

    def __init__(self, backend: SQLHost) -> None:
        self.backend = backend
        self.table = backend.metadata.tables[f"{backend.table_prefix}task_start"]

    # -- transitions --------------------------------------------------------------------------

    def start(
        self, namespace: str, d: Delivery, alive: Alive, *, task_name: str = "", hostname: str = "",
        ends: Sequence[End] = (),
    ) -> Start:  # fmt: skip
        """Delivery ``d``'s start: run, skip or put off (runstate.start), its row written.

        ``ends`` (earlier runs' ends) go in its first write's transaction.
        """
        if d.claimed:  # a beat run's row, claimed or sent (runstate.start): the update alone
            started = self._start_claimed(namespace, d, hostname, ends)
            ends = ()  # written, whichever row it found
            if started is not None:
                return started
        first = runstate.start(None, d, alive)  # a run nobody started: the insert alone
        assert first.row is not None
        if self._write(namespace, d.key, None, first.row, task_name=task_name, hostname=hostname,
                       ends=ends):  # fmt: skip
            return first
        for _ in range(TRIES):
            raw = self._read(namespace, d.key)
            decided = runstate.start(None if raw is None else _row(raw), d, alive)
            if decided.row is None or self._write(
                namespace, d.key, raw, decided.row, task_name=task_name, hostname=hostname
            ):
                return decided
        raise self._contention("start")

    def release(self, namespace: str, key: str, delivery: str) -> bool:
        """A started delivery gives its run back before the body (it was put off)."""
        return self._apply(namespace, key, lambda r: runstate.release(r, delivery))

    def _start_claimed(
        self, namespace: str, d: Delivery, hostname: str, ends: Sequence[End]
    ) -> Start | None:
        """``runstate.start`` of a claimed or sent row in one UPDATE; None: not such a row.

        A beat run's first delivery, the common case: one statement, where the general
        path (insert if absent, read, write) took three.
        """
        t = self.table
        values: dict[str, Any] = {"state": STARTED, "attempt": t.c.attempt + 1,
                                  "delivery": d.token, "worker": d.worker,
                                  "acks_late": d.acks_late, "began_at": db_now_us()}  # fmt: skip
        if hostname:
            values["hostname"] = hostname[:255]
        mine = (t.c.namespace == namespace, t.c.run_key == d.key)
        stmt = sa.update(t).where(*mine, t.c.state.in_((CLAIMED, SENT))).values(values)
        returning = self.backend.engine.dialect.update_returning

        def work(conn: Connection) -> Any:
            if returning:
                return conn.execute(stmt.returning(*t.c)).first()
            if conn.execute(stmt).rowcount != 1:
                return None
            return conn.execute(sa.select(t).where(*mine)).first()  # the row it just wrote

        raw = self._in_write(work, "start", ends)
        return None if raw is None else Start("run", "started", _row(raw))

    def write_claimed(
        self, conn: Connection, namespace: str, term: int, runs: Sequence[Claimed]
    ) -> None:
        """The rows of the runs a beat's claim won, claimed under ``term``, in its transaction.

        Each (entry, due, task id, task name, kind, due at): the row is also the run's
        history (kind "run" or "run_now"; when it fell due). Insert-if-absent: a retried
        claim whose first answer was lost wrote them already.
        """
        rows = [_claimed(namespace, term, *run) for run in runs]
        if rows:
            conn.execute(self._insert_claimed, rows)

    @functools.cached_property
    def _insert_claimed(self) -> sa.Executable:
        return self.backend.db.insert_ignore(self.table, {"started_at": db_now_us()})

    def confirm(self, namespace: str, task_ids: Collection[str]) -> int:
        """The broker accepted these beat runs: claimed -> sent (``runstate.confirm``)."""
        return self._settle(namespace, task_ids, "confirm", state=SENT)

    def drop(self, namespace: str, task_ids: Collection[str], why: str) -> int:
        """Claimed runs given up unsent (``runstate.drop``): dropped, finished."""
        return self._settle(namespace, task_ids, "drop", state=DROPPED, outcome=why[:16],
                            finished_at=db_now_us())  # fmt: skip

    def _settle(self, namespace: str, task_ids: Collection[str], what: str, **values: Any) -> int:
        """Move claimed runs on: one UPDATE per ``BATCH`` runs; how many changed."""
        t, ids, changed = self.table, list(task_ids), 0
        for i in range(0, len(ids), BATCH):
            keys = [runstate.run_key(task_id) for task_id in ids[i : i + BATCH]]
            stmt = (
                sa.update(t)
                .where(t.c.namespace == namespace, t.c.run_key.in_(keys), t.c.state == CLAIMED)
                .values(values)
            )
            changed += self._in_write(rowcount(stmt), what)
        return changed

    def finish(self, namespace: str, key: str, delivery: str, outcome: str) -> bool:
        """The body of ``delivery`` ended: close the run (if that delivery still runs it).

        One UPDATE: its WHERE is ``runstate.finish``'s guard (started by this delivery, or
        reaped as lost while it ran).
        """
        return self._changed(self._finish(namespace, key, delivery, outcome))

    def _finish(self, namespace: str, key: str, delivery: str, outcome: str) -> sa.Update:
        t = self.table
        return (
            sa.update(t)
            .where(
                t.c.namespace == namespace,
                t.c.run_key == key,
                t.c.delivery == delivery,
                sa.or_(t.c.state == STARTED, t.c.outcome == runstate.LOST),
            )
            .values(state=ENDED, outcome=outcome[:16], finished_at=db_now_us())
        )

    def _apply(self, namespace: str, key: str, step: Any) -> bool:
        for _ in range(TRIES):
            raw = self._read(namespace, key)
            new = None if raw is None else step(_row(raw))
            if new is None:
                return False
            if self._write(namespace, key, raw, new):
                return True
        raise self._contention("change")

    # -- reads and housekeeping ---------------------------------------------------------------

    def load(self, namespace: str, key: str) -> RunRecord | None:
        """The run of ``key``, or None."""
        raw = self._read(namespace, key)
        return None if raw is None else _stored(raw)

    def newest(
        self, namespace: str, *, task_id: str | None = None, limit: int = 100
    ) -> list[RunRecord]:
        """The newest runs (of one task id if given), newest first."""
        t = self.table
        stmt = sa.select(t).where(t.c.namespace == namespace)
        if task_id is not None:
            stmt = stmt.where(t.c.task_id == task_id)
        stmt = stmt.order_by(t.c.started_at.desc(), t.c.run_key).limit(limit)
        return self.backend.call(
            lambda conn: [_stored(r) for r in conn.execute(stmt)],
            table=t, write=False, timeout=None, connection=None,
        )  # fmt: skip

    def prune(
        self, namespace: str, older_than: float, *, batch: int = 5000, history: bool = False
    ) -> int:
        """Delete up to ``batch`` runs of ``namespace`` written ``older_than`` s ago.

        ``history``: the beat's runs (the schedule's history, kept longer), else the others.
        One statement, through the (namespace, started_at, ...) index. A run still claimed
        stays: it holds its entry until a leader sends it (sql_beat.py).
        """
        t = self.table
        cut = db_now_us() - int(older_than * 1_000_000)
        kept = sa.or_(t.c.state.is_(None), t.c.state != CLAIMED)
        beat = t.c.kind.is_not(None) if history else t.c.kind.is_(None)
        where = sa.and_(t.c.namespace == namespace, t.c.started_at < cut, kept, beat)
        stmt = self.backend.db.delete_at_most(t.c.run_key, where, batch).where(
            t.c.namespace == namespace
        )
        # a deadlock with the starts raises: the next prune goes on
        return self._in_write(rowcount(stmt), "prune")

    # -- the statements -------------------------------------------------------------------------

    def _read(self, namespace: str, key: str) -> Any:
        t = self.table
        stmt = sa.select(t).where(t.c.namespace == namespace, t.c.run_key == key)
        return self.backend.call(lambda conn: conn.execute(stmt).first(), table=t,
                                 write=False, timeout=None, connection=None)  # fmt: skip

    def _write(
        self, namespace: str, key: str, raw: Any, row: Row, *, task_name: str = "",
        hostname: str = "", ends: Sequence[End] = (),
    ) -> bool:  # fmt: skip
        """Write ``row`` if the stored one is still ``raw`` (None: absent); True if written."""
        t = self.table
        values: dict[str, Any] = {
            "state": row.state, "attempt": row.attempt, "delivery": row.delivery,
            "worker": row.worker, "acks_late": row.acks_late, "term": row.term,
            "outcome": row.outcome,
        }  # fmt: skip
        if row.state == STARTED:
            values["began_at"] = db_now_us()
        if hostname:
            values["hostname"] = hostname[:255]
        # ended or dropped: finished, so 0.2 workers skip it; open (a release, a run its
        # own try takes back after a reap): not finished
        values["finished_at"] = None if row.state in runstate.OPEN else db_now_us()
        if raw is None:
            values.update(
                namespace=namespace, run_key=key, task_id=row.task_id[:255],
                task_name=(task_name or row.entry)[:255], pid=0, started_at=db_now_us(),
                entry_name=row.entry[:500], due=row.due, hostname=hostname[:255],
            )  # fmt: skip
            stmt: Any = self.backend.db.insert_ignore(t, values)
            if self.backend.engine.dialect.insert_returning:
                return self._changed(stmt.returning(t.c.run_key), rows=True, ends=ends)
            return self._changed(stmt, ends=ends)
        stmt = (
            sa.update(t)
            .where(
                t.c.namespace == namespace,
                t.c.run_key == key,
                t.c.state.is_not_distinct_from(raw.state),
                t.c.attempt == raw.attempt,
                t.c.delivery.is_not_distinct_from(raw.delivery),
                t.c.finished_at.is_(None)
                if raw.finished_at is None
                else t.c.finished_at.is_not(None),
            )
            .values(values)
        )
        return self._changed(stmt)

    def _changed(self, stmt: Any, *, rows: bool = False, ends: Sequence[End] = ()) -> bool:
        """Run one write; True if it changed exactly one row. Contention raises.

        ``rows``: count the rows RETURNING gives (an INSERT's rowcount is -1 through psycopg).
        """

        def work(conn: Connection) -> bool:
            result = conn.execute(stmt)
            return (len(result.all()) if rows else int(result.rowcount)) == 1

        return self._in_write(work, "write", ends)

    def _in_write(self, work: Callable[[Connection], T], what: str, ends: Sequence[End] = ()) -> T:
        """``work`` in one write; lost to contention, it raises. ``ends`` first, atomically.

        A lock timeout or a deadlock is not "someone else wrote it": nothing is known.
        """
        run = work
        if ends:

            def run(conn: Connection) -> T:
                for end in ends:
                    conn.execute(self._finish(*end))
                return work(conn)

        try:
            return self.backend.call(run, table=self.table, write=True, timeout=None,
                                     connection=None, atomic=bool(ends))  # fmt: skip
        except LostRound as exc:
            raise self._contention(what) from exc

    def _contention(self, what: str) -> BackendUnavailableError:
        return BackendUnavailableError(
            f"election database {self.backend.description} refused a run's {what} "
            f"(lock contention); try again"
        )


def _claimed(
    namespace: str, term: int, entry: str, due: int, task_id: str, task: str, kind: str,
    due_at: int | None,
) -> Any:  # fmt: skip
    """The row of a run a beat's claim won (``write_claimed``)."""
    return dict(namespace=namespace, run_key=runstate.run_key(task_id), task_id=task_id,
                task_name=(task or entry)[:255], hostname="", pid=0, attempt=0, state=CLAIMED,
                term=term, entry_name=entry[:500], due=due, entry_key=entry_key(entry),
                kind=kind, due_at=due_at, count=1)  # fmt: skip


def _row(raw: Any) -> Row:
    """A stored row as runstate's (a 0.2 row: started, or ended once finished)."""
    state = raw.state or (ENDED if raw.finished_at is not None else STARTED)
    return Row(
        entry=raw.entry_name or raw.task_name, due=int(raw.due or 0), task_id=raw.task_id,
        term=int(raw.term or 0), state=state, attempt=int(raw.attempt),
        delivery=raw.delivery, worker=raw.worker, acks_late=bool(raw.acks_late),
        outcome=raw.outcome,
    )  # fmt: skip


def _stored(raw: Any) -> RunRecord:
    ended = raw.finished_at
    return RunRecord(raw.run_key, _row(raw), raw.task_name, raw.hostname, int(raw.started_at),
                  None if ended is None else int(ended))  # fmt: skip
