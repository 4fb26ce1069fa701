"""The operable schedule on SQL: entries changed at runtime, operator actions, run history.

Four tables (backends/schema.py): ``schedule_entry`` holds one row per entry changed at
runtime (a dynamic entry, or an operator's overlay on a static ``beat_schedule`` entry);
``schedule_rev`` one change counter per namespace; ``schedule_audit`` who changed what,
when; ``schedule_term`` who led the beats when (the leader's history thread writes it,
beat/history.py; the schedule page draws it). The run history is the runs' own rows
(``task_start``, backends/sql_runs.py): a run's claim, send, start and end are its one
row, which the page, the overlap policy and the overdue alarm read.

* **Changes reach the leader by version.** Every change takes the namespace's counter row
  lock, increments it and stamps the entry with the new version, in one transaction. The
  lock orders the commits, so a leader that has seen version N and reads ``version > N``
  never misses a change: one indexed statement per look, 0 rows when nothing changed.
* **Operator writes never race the leader's consumption.** A write reads the row ``FOR
  UPDATE`` and the leader consumes a "run now" with a conditional UPDATE on the same row,
  so a click is sent once even if an edit lands at the same moment.
* **"Run now" is fenced like a run.** A request sets ``run_now_at`` only if none is
  pending (two clicks: one run); the leader clears it with a compare-and-set that also
  requires the lease to hold its (token, term), unexpired (docs/design.md, rule 6), and
  sends only if that won: a stale leader cannot send it, two leaders cannot both.

Everything here is plain data (the spec is JSON); what a spec means is the Celery side's
(``celery_election/schedule.py``). The rows it hands out are ``records.py``'s; the
timeline's marks and their queries are ``marks.py``'s.
"""

from __future__ import annotations

import functools
import json
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ..backends.connection import LostRound
from ..backends.schema import db_now_us, entry_key, key_type
from ..backends.sql import SQLBackend
from ..core.runstate import run_now_task_id
from ..errors import BackendUnavailableError, ConfigurationError
from .marks import (
    MARKS,
    EntryMarks,
    entry_marks,
    marks_statement,
    open_run_statement,
    runs_in_statements,
    sent_runs,
)
from .records import (
    AuditRecord,
    EntryRow,
    RunRecord,
    TermRecord,
    entry_from_row,
    opt_int,
    record_from_row,
)

if TYPE_CHECKING:
    from ..backends.sql_host import SQLHost

__all__ = ["SQLScheduleStore", "schedule_store"]

T = TypeVar("T")
#: The namespaces whose run rows a read covers (a standalone beat's, an embedded one's).
Namespaces = str | Sequence[str]
#: Index walks (one entry's row each) to a statement: SQLite takes 500 at most in a UNION.
PER_STATEMENT = 200

#: What a change function returns: the columns to write (None: delete nothing, write
#: nothing) and the audit detail.
Change = Callable[[EntryRow | None, int], tuple[dict[str, Any] | None, dict[str, Any]]]


#: each SQL backend's store (``schedule_store``), gone with its backend
_STORES: weakref.WeakKeyDictionary[SQLBackend, SQLScheduleStore] = weakref.WeakKeyDictionary()


def schedule_store(backend: object) -> SQLScheduleStore | None:
    """The operable schedule's store of ``backend``: one per backend; None if not SQL.

    Built here, not by the backend: the election core never imports the schedule.
    """
    if not isinstance(backend, SQLBackend):
        return None
    store = _STORES.get(backend)
    if store is None:
        store = _STORES[backend] = SQLScheduleStore(backend)
    return store


class SQLScheduleStore:
    """The schedule tables of a :class:`SQLBackend` (see the module)."""

    def __init__(self, backend: SQLHost) -> None:
        self.backend = backend
        prefix = backend.table_prefix
        tables = backend.metadata.tables
        self.entry = tables[f"{prefix}schedule_entry"]
        self.rev = tables[f"{prefix}schedule_rev"]
        self.run = tables[f"{prefix}task_start"]  # the run rows are the history
        self.audit_table = tables[f"{prefix}schedule_audit"]
        self.term_table = tables[f"{prefix}schedule_term"]

    def _read(self, work: Callable[[Connection], T], table: sa.Table) -> T:
        return self.backend.call(work, table=table, write=False, timeout=None, connection=None)

    def _do(self, work: Callable[[Connection], T], table: sa.Table, *, atomic: bool = False) -> T:
        """A write; lost to another writer (SQLite busy, a deadlock), an ``ElectionError``.

        Its callers on the beat retry what fails with one (the history, the pruning, a
        "run now"): a lost round that escaped as itself stopped the beat (a chaos run).
        """
        try:
            return self.backend.call(work, table=table, write=True, timeout=None,
                                     connection=None, atomic=atomic)  # fmt: skip
        except LostRound as exc:
            raise BackendUnavailableError(
                f"{table.name}: the election database was busy with another writer; "
                "not written this time"
            ) from exc

    # -- reading ----------------------------------------------------------------------------

    def changes(self, namespace: str, since: int) -> list[EntryRow]:
        """Rows written after version ``since`` (deleted ones included), oldest first."""
        t = self.entry
        stmt = (
            sa.select(t)
            .where(t.c.namespace == namespace, t.c.version > since)
            .order_by(t.c.version)
        )
        return self._read(lambda conn: [entry_from_row(r) for r in conn.execute(stmt)], t)

    def entries(self, namespace: str) -> list[EntryRow]:
        """Every live (not deleted) row of ``namespace``, by name."""
        rows = [r for r in self.changes(namespace, -1) if not r.deleted]
        return sorted(rows, key=lambda r: r.name)

    def db_now(self) -> int:
        """The database's clock (epoch microseconds)."""
        return int(
            self._read(lambda conn: conn.execute(sa.select(db_now_us())).scalar_one(), self.entry)
        )

    # -- operator writes --------------------------------------------------------------------

    def change(self, namespace: str, name: str, action: str, actor: str, work: Change) -> EntryRow:
        """Apply one operator change to entry ``name`` in one transaction; the new row.

        ``work(current, now)`` gets the row as stored (locked) and the database's clock and
        returns the columns to write and the audit detail; it raises to refuse the change.
        """
        backend, t = self.backend, self.entry
        this = sa.and_(t.c.namespace == namespace, t.c.entry_key == entry_key(name))

        def run(conn: Connection) -> EntryRow:
            version = self._bump(conn, namespace)
            now = int(conn.execute(sa.select(db_now_us())).scalar_one())
            locked = sa.select(t).where(this)
            found = conn.execute(backend.db.for_update(locked)).first()
            current = None if found is None else entry_from_row(found)
            if current is not None and current.deleted:
                current = None
            values, detail = work(current, now)
            if values is None:
                raise ConfigurationError(f"nothing to change for {name!r}")
            values = {**values, "version": version, "updated_at": now, "updated_by": actor[:255]}
            if found is None:
                self._insert_entry(conn, namespace, name, now, values)
            else:
                if current is None:  # re-created after a delete: a fresh row
                    values = {
                        "paused_at": None,
                        "skip_before": None,
                        "run_now_at": None,
                        "created_at": now,
                        **values,
                    }
                conn.execute(sa.update(t).where(this).values(**values))
            self._audit(conn, namespace, name, action, actor, now, detail)
            row = conn.execute(sa.select(t).where(this)).one()
            return entry_from_row(row)

        return backend.call_in_transaction(run, table=t)

    def _insert_entry(
        self, conn: Connection, namespace: str, name: str, now: int, values: dict[str, Any]
    ) -> None:
        """The entry's first row: an overlay's defaults, then ``values``."""
        insert = {
            "namespace": namespace,
            "entry_key": entry_key(name),
            "name": name[:500],
            "task": None,
            "spec": "{}",
            "enabled": True,
            "deleted": False,
            "created_at": now,
            **values,
        }
        conn.execute(sa.insert(self.entry).values(**insert))

    def _audit(
        self,
        conn: Connection,
        namespace: str,
        name: str,
        action: str,
        actor: str,
        now: int,
        detail: dict[str, Any],
    ) -> None:
        """Record who changed ``name``, how and when."""
        conn.execute(
            sa.insert(self.audit_table).values(
                namespace=namespace,
                name=name[:500],
                action=action,
                actor=actor[:255],
                at=now,
                detail=json.dumps(detail, default=str, sort_keys=True),
            )
        )

    def _bump(self, conn: Connection, namespace: str) -> int:
        """The namespace's next version; holds its counter row's lock until commit.

        UPDATE first, which takes the row's exclusive lock at once: an INSERT IGNORE of an
        existing row takes a shared one on MySQL, and two writers that both held it then
        deadlocked on their UPDATEs. The row is inserted only the first time.
        """
        rev = self.rev
        bump = sa.update(rev).where(rev.c.namespace == namespace).values(version=rev.c.version + 1)
        if conn.execute(bump).rowcount == 0:
            conn.execute(self.backend.db.insert_ignore(rev, {"namespace": namespace, "version": 0}))
            conn.execute(bump)
        return int(
            conn.execute(sa.select(rev.c.version).where(rev.c.namespace == namespace)).scalar_one()
        )

    # -- the leader -------------------------------------------------------------------------

    def claim_run_now(
        self, namespace: str, lease: tuple[str, str, int], name: str, requested_at: int,
        task: str = "",
    ) -> bool:  # fmt: skip
        """Consume the pending "run now" seen at ``requested_at``; True: send it (once).

        ``lease`` is the leader's (namespace, token, term) in the election it leads. Lost
        to another writer (SQLite busy under load), it raises: the beat asks again at its
        next tick. Taken for "not won", the click was dropped (a matrix run saw it). A won
        click is a run's row in the same transaction (claimed in the leader's namespace,
        task id ``run_now_task_id``): sent by this leader, or by the next if it is not.
        """
        lease_ns, token, term = lease
        params = {
            "p_ns": namespace,
            "p_lease_ns": lease_ns,
            "p_key": entry_key(name),
            "p_seen": requested_at,
            "p_token": token,
            "p_term": term,
        }
        task_id = run_now_task_id(lease_ns, name, requested_at)

        def work(conn: Connection) -> bool:
            if conn.execute(self._claim_statement, params).rowcount != 1:
                return False
            run = (name, requested_at, task_id, task, "run_now", None)
            self.backend.runs.write_claimed(conn, lease_ns, term, [run])
            return True

        return self._do(work, self.entry, atomic=True)  # the click taken, and its run's row

    @functools.cached_property
    def _claim_statement(self) -> sa.Executable:
        t, lease = self.entry, self.backend.lease
        ns = sa.bindparam("p_ns", type_=key_type(190))
        term = sa.bindparam("p_term", type_=sa.BigInteger)
        lease_term = (
            sa.select(lease.c.term)
            .where(
                lease.c.namespace == sa.bindparam("p_lease_ns", type_=key_type(190)),
                lease.c.token == sa.bindparam("p_token", type_=sa.String()),
                lease.c.term == term,
                lease.c.expires_at > db_now_us(),
            )
            .with_for_update(read=True)
        )
        return (
            sa.update(t)
            .where(
                t.c.namespace == ns,
                t.c.entry_key == sa.bindparam("p_key", type_=key_type(40)),
                t.c.run_now_at == sa.bindparam("p_seen", type_=sa.BigInteger),
                lease_term.scalar_subquery() == term,
            )
            .values(run_now_at=None)
        )

    def record_many(self, rows: list[dict[str, Any]]) -> None:
        """Add the rows of runs a policy did not send (:func:`history_row`), in one call.

        Insert-if-absent: a batch written again after a lost answer is not doubled.
        """
        if rows:
            stmt = self.backend.db.insert_ignore(self.run)
            self._do(lambda conn: conn.execute(stmt, rows), self.run)

    def last_sent(self, namespaces: Namespaces, name: str) -> RunRecord | None:
        """The entry's latest run on its way or done (for the overlap policy)."""
        return self.last_sent_many(namespaces, [name]).get(name)

    def last_sent_many(self, namespaces: Namespaces, names: list[str]) -> dict[str, RunRecord]:
        """Each named entry's latest run (a page of many entries), by name.

        One walk of the entry index per entry and namespace, from its newest end: the
        page's cost does not grow with the history (a grouping of every row did).
        """
        r = self.run

        def latest(ns: str, key: Any) -> sa.Select[Any]:
            return (
                sa.select(r)
                .where(sent_runs(r, ns, key))
                .order_by(r.c.started_at.desc(), r.c.run_key.desc())
                .limit(1)
            )

        rows = [record_from_row(x) for x in self._per_entry(namespaces, names, latest)]
        keys = {entry_key(n): n for n in names}
        return {keys[x.entry_key]: x for x in sorted(rows, key=lambda x: (x.sent_at, x.id))}

    def open_runs(self, namespaces: Namespaces, names: list[str]) -> dict[str, RunRecord]:
        """By entry key: the run each named entry owes a finish for (``marks.open_run_statement``).

        Where two namespaces hold an entry's runs, the one with its latest finish says.
        """
        found = self._per_entry(namespaces, names, functools.partial(open_run_statement, self.run))
        out: dict[str, tuple[int, RunRecord]] = {}
        for row in found:
            if out.get(row.entry_key, (-1,))[0] < int(row.last_finish):
                out[row.entry_key] = (int(row.last_finish), record_from_row(row))
        return {k: run for k, (_, run) in out.items()}

    def _per_entry(
        self, namespaces: Namespaces, names: list[str], one: Callable[[str, Any], sa.Select[Any]]
    ) -> list[Any]:
        """The rows of ``one(namespace, key)``, an index walk of one row, for each entry.

        PostgreSQL: one statement per namespace, a LATERAL walk per key of a VALUES list
        (1,000 entries in about 0.1 s). Elsewhere: :data:`PER_STATEMENT` walks to a
        UNION ALL (PostgreSQL planned each walk of one of those for 0.5 ms).
        """
        keys = [entry_key(n) for n in dict.fromkeys(names)]
        if not keys:
            return []
        out: list[Any] = []
        if self.backend.engine.dialect.name == "postgresql":
            listed = sa.values(sa.column("key", key_type(40)), name="listed").data(
                [(k,) for k in keys]
            )
            for ns in _names(namespaces):
                walk = one(ns, listed.c.key).lateral("walk")
                stmt = sa.select(walk).select_from(listed).join(walk, sa.true())
                out += self._read(functools.partial(_all, stmt), self.run)
            return out
        pairs = [(ns, key) for ns in _names(namespaces) for key in keys]
        for i in range(0, len(pairs), PER_STATEMENT):
            parts = [one(ns, key).subquery().select() for ns, key in pairs[i : i + PER_STATEMENT]]
            union = sa.union_all(*parts) if len(parts) > 1 else parts[0]
            out += self._read(functools.partial(_all, union), self.run)
        return out

    def history(
        self,
        namespaces: Namespaces,
        name: str,
        *,
        limit: int = 20,
        before: int | None = None,
    ) -> list[RunRecord]:
        """The entry's runs, newest first (``before``: a ``sent_at``, for the next page)."""
        r = self.run
        stmt = sa.select(r).where(_in(r, namespaces), r.c.entry_key == entry_key(name))
        if before is not None:
            stmt = stmt.where(r.c.started_at < before)
        stmt = stmt.order_by(r.c.started_at.desc(), r.c.run_key.desc()).limit(limit)
        return self._read(lambda conn: [record_from_row(row) for row in conn.execute(stmt)], r)

    def audit(self, namespace: str, *, limit: int = 50) -> list[AuditRecord]:
        """The latest operator changes of ``namespace``, newest first."""
        a = self.audit_table
        stmt = sa.select(a).where(a.c.namespace == namespace).order_by(a.c.id.desc()).limit(limit)
        rows = self._read(lambda conn: conn.execute(stmt).all(), a)
        return [
            AuditRecord(int(r.id), r.name, r.action, r.actor, int(r.at), json.loads(r.detail))
            for r in rows
        ]

    # -- leadership history -----------------------------------------------------------------

    def term_started(self, namespace: str, term: int, leader_id: str) -> None:
        """Record that ``term`` of election ``namespace`` began (idempotent).

        The start and the leader's label are the lease row's when it still holds that term
        (its acquired_at, on the database clock), else the database's clock now.
        """
        t, lease = self.term_table, self.backend.lease
        now = db_now_us()
        from_lease = sa.select(
            lease.c.namespace, lease.c.term, sa.func.coalesce(lease.c.leader_id, leader_id[:255]),
            sa.func.coalesce(lease.c.acquired_at, now), now,
        ).where(lease.c.namespace == namespace, lease.c.term == term)  # fmt: skip
        cols = ["namespace", "term", "leader_id", "started_at", "seen_at"]
        db = self.backend.db

        def run(conn: Connection) -> None:
            if conn.execute(db.insert_ignore(t, from_select=(cols, from_lease))).rowcount:
                return
            conn.execute(db.insert_ignore(t, {
                "namespace": namespace, "term": term, "leader_id": leader_id[:255],
                "started_at": now, "seen_at": now,
            }))  # fmt: skip

        self._do(run, t)

    def term_seen(self, namespace: str, term: int, *, ended: bool = False) -> None:
        """The term's leader is alive now (``ended``: and stops leading now)."""
        t = self.term_table
        values: dict[str, Any] = {"seen_at": db_now_us()}
        if ended:
            values["ended_at"] = db_now_us()
        stmt = (
            sa.update(t)
            .where(t.c.namespace == namespace, t.c.term == term, t.c.ended_at.is_(None))
            .values(**values)
        )
        self._do(lambda conn: conn.execute(stmt), t)

    def terms(self, from_us: int, to_us: int) -> list[TermRecord]:
        """Terms that overlap [from_us, to_us], by namespace and term."""
        t = self.term_table
        stmt = (
            sa.select(t)
            .where(t.c.started_at <= to_us, sa.func.coalesce(t.c.ended_at, t.c.seen_at) >= from_us)
            .order_by(t.c.namespace, t.c.term)
        )
        rows = self._read(lambda conn: conn.execute(stmt).all(), t)
        return [
            TermRecord(
                r.namespace,
                int(r.term),
                r.leader_id,
                int(r.started_at),
                int(r.seen_at),
                opt_int(r.ended_at),
            )
            for r in rows
        ]

    def marks(
        self, namespaces: Namespaces, from_us: int, to_us: int, column_us: int
    ) -> list[EntryMarks]:
        """The history of ``namespace`` sent in [from_us, to_us), as the timeline shows it.

        Per entry (by key), its columns (``column_us`` wide, from ``from_us``) that have runs:
        the worst mark of their runs, how many there are and the most late of the late ones.
        The database groups a range of the covering ``task_start_window`` index (no row
        read) and answers one row per entry: a day of a thousand entries is ~100,000 marks,
        and as many rows cost more to fetch and convert in Python than to group.
        """
        stmt = marks_statement(self.run, _in(self.run, namespaces), from_us, to_us, column_us)

        def read(conn: Connection) -> list[EntryMarks]:
            return [entry_marks(*row) for row in conn.execute(stmt)]

        return self._read(read, self.run)

    def runs_in(
        self, namespaces: Namespaces, key: str, from_us: int, to_us: int, *, limit: int = 20
    ) -> tuple[list[RunRecord], dict[str, int]]:
        """An entry's runs sent in [from_us, to_us): the worst first, and how many of each mark.

        ``key`` is the entry's key (``entry_key(name)``): a removed entry has no name. What
        the timeline fetches when a column of it is pointed at.
        """
        where = _in(self.run, namespaces)
        runs, counts = runs_in_statements(self.run, where, key, from_us, to_us, limit=limit)

        def read(conn: Connection) -> tuple[list[RunRecord], dict[str, int]]:
            found = [record_from_row(row) for row in conn.execute(runs)]
            return found, {MARKS[int(m)]: int(n) for m, n in conn.execute(counts)}

        return self._read(read, self.run)

    def prune_terms(self, namespace: str, older_than_us: int) -> int:
        """Forget the terms of election ``namespace`` that ended before ``older_than_us``."""
        t = self.term_table
        stmt = sa.delete(t).where(
            t.c.namespace == namespace, sa.func.coalesce(t.c.ended_at, t.c.seen_at) < older_than_us
        )
        return int(self._do(lambda conn: conn.execute(stmt).rowcount, t))


def _all(stmt: Any, conn: Connection) -> list[Any]:
    return list(conn.execute(stmt).all())


def _names(namespaces: Namespaces) -> list[str]:
    return [namespaces] if isinstance(namespaces, str) else list(dict.fromkeys(namespaces))


def _in(t: sa.Table, namespaces: Namespaces) -> sa.ColumnElement[bool]:
    """The run rows of these namespaces (a standalone beat's, and an embedded one's)."""
    names = _names(namespaces)
    return t.c.namespace == names[0] if len(names) == 1 else t.c.namespace.in_(names)
