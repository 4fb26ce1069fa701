"""Beat entries' shared run state on SQL: the fence every beat send goes through.

One row per (namespace, entry): when the entry last ran (epoch microseconds on the
database's clock), how often, and under which term. A leader that finds entries due
claims "the run after the state I saw" for each in one transaction (``claim_runs``):
one UPDATE ... FROM a derived table of the requests (each row's own expected state, new
state and key) and one INSERT ... SELECT from it for first runs, both fenced by a
share-locked read of the lease row (``FOR SHARE`` / ``LOCK IN SHARE MODE``; SQLite's
write lock serialises everything). A row changes only if it still holds the expected
state and the lease still has the claimer's token and term, unexpired (docs/design.md,
rule 6); a plain read of the lease followed by a write let a takeover commit in between.
A first run that meets a duplicate key was recorded first by another leader. A claim may
also set the run count and the entry's identity (an operator's edit adopted, a
re-created entry starting fresh): the compare-and-set and the fence are the same. One
entry's claim is a batch of one: a second statement for it was a second fence to keep.

A lost claim reads the rows and the lease in the same transaction, so the caller can adopt
the stored state (someone else ran it) or stop acting on a term the database has ended.

A claim of a run to send also writes the run's row (``task_start``, backends/sql_runs.py)
in its transaction: claimed under the term, task id ``runstate.run_task_id`` of the new
state, keyed in its entry by the run it follows (``due``). Until the broker accepted the run
(``RunStore.confirm``) or it was dropped, that row holds the entry: the next claim's
WHERE finds no claimed row of the run it follows (a primary-key probe), so a run claimed
and not sent is a row a leader reads (:meth:`SQLBeatStore.pending_runs`), never a gap.

``BATCH`` entries go in a transaction. On PostgreSQL the derived table is ``unnest`` of
one array per column (``BATCH_ARRAYS`` entries per transaction): one SQL text whatever
the size, so psycopg converts and the server plans it once, where a UNION ALL of 500 rows
of bound values cost a third of a second per statement to plan and 3,500 placeholders to
convert (issue 37's 10,000-entry burst). PostgreSQL and SQLite name the rows they changed
(RETURNING); MySQL/MariaDB cannot for an UPDATE, so there the batch first locks its rows
(``FOR UPDATE``): a locked row that holds the expected state is changed by the UPDATE
unless the lease refuses the whole statement, so the row count tells which won. One round
trip per entry made a leader send a burst of 1,000 at half stock's rate (issue 37).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Connection

from ..core.runstate import CLAIMED, run_key, run_task_id
from .base import (
    PendingRun,
    RunClaim,
    RunRequest,
    RunState,
    check_batch,
    next_run_count,
    pending_run,
)
from .schema import db_now_us, entry_key, key_type

if TYPE_CHECKING:
    from .sql_host import SQLHost

__all__ = ["BATCH", "BATCH_ARRAYS", "SQLBeatStore"]

#: Requests per batch statement (SQLite allows 500 terms in a compound SELECT).
BATCH = 500
#: Requests per transaction where the requests are arrays (PostgreSQL): one statement
#: each, short enough that the lease row's share lock does not hold a renewal up long.
BATCH_ARRAYS = 2000


class SQLBeatStore:
    """The :class:`~celery_election.backends.base.BeatStore` of a :class:`SQLBackend`."""

    def __init__(self, backend: SQLHost) -> None:
        self.backend = backend
        self.table = backend.beat_run
        self.rows = backend.metadata.tables[f"{backend.table_prefix}task_start"]
        # PostgreSQL: a batch's requests are bound as arrays (one statement shape)
        self.arrays = backend.engine.dialect.name == "postgresql"

    def load_runs(self, namespace: str, *, timeout: float | None = None) -> dict[str, RunState]:
        """Every entry's run state in ``namespace``, by entry name."""
        t = self.table
        stmt = sa.select(
            t.c.entry_name, t.c.last_run_at, t.c.total_run_count, t.c.term, t.c.identity
        ).where(t.c.namespace == namespace)
        return self.backend.call(
            lambda conn: {r.entry_name: _state(r) for r in conn.execute(stmt)},
            table=t,
            write=False,
            timeout=timeout,
            connection=None,
        )

    def claim_runs(
        self,
        namespace: str,
        token: str,
        term: int,
        requests: Sequence[RunRequest],
        *,
        timeout: float | None = None,
    ) -> list[RunClaim]:
        """Many claims, ``BATCH`` per transaction; see the module and ``BeatStore``."""
        check_batch(requests)
        out: list[RunClaim] = []
        batch = BATCH_ARRAYS if self.arrays else BATCH
        for start in range(0, len(requests), batch):
            chunk = list(requests[start : start + batch])
            lost = [RunClaim(False, r.expected, True, answered=False) for r in chunk]
            work = functools.partial(self._claim_chunk, namespace, token, term, chunk)
            out += self.backend.call_write(work, table=self.table, lost=lost, timeout=timeout,
                                           atomic=chunk[0].pending)  # fmt: skip
        return out

    def pending_runs(self, namespace: str, *, timeout: float | None = None) -> list[PendingRun]:
        """The runs whose rows are claimed and not confirmed (any term), oldest first.

        Through the (namespace, state) index; a scheduled run with its entry's stored
        state, which is its own (the claim past it waits while it is claimed).
        """
        r, t = self.rows, self.table
        claimed = (
            sa.select(r.c.entry_name, r.c.due, r.c.term, r.c.started_at, r.c.task_id)
            .where(r.c.namespace == namespace, r.c.state == CLAIMED)
            .order_by(r.c.started_at)
        )
        keys = sa.bindparam("p_keys", expanding=True, type_=key_type(40))
        states = sa.select(
            t.c.entry_name, t.c.last_run_at, t.c.total_run_count, t.c.term, t.c.identity
        ).where(t.c.namespace == namespace, t.c.entry_key.in_(keys))

        def work(conn: Connection) -> list[PendingRun]:
            rows = conn.execute(claimed).all()
            names = list({str(row.entry_name) for row in rows})
            stored = {str(s.entry_name): _state(s)
                      for s in conn.execute(states, {"p_keys": [entry_key(n) for n in names]})
                      } if names else {}  # fmt: skip
            found = [pending_run(namespace, str(row.entry_name), int(row.due or 0), int(row.term),
                                 int(row.started_at), str(row.task_id),
                                 stored.get(str(row.entry_name))) for row in rows]  # fmt: skip
            return [p for p in found if p is not None]

        return self.backend.call(work, table=t, write=False, timeout=timeout, connection=None)

    def _write_rows(
        self, conn: Connection, namespace: str, term: int, won: Sequence[RunRequest]
    ) -> None:
        """The rows of the runs a claim won, in its transaction (sql_runs.py)."""
        runs = [(r.entry_name, 0 if r.expected is None else r.expected.last_run_us,
                 run_task_id(namespace, r.entry_name, r.last_run_us), r.task_name, "run",
                 r.due_at) for r in won]  # fmt: skip
        self.backend.runs.write_claimed(conn, namespace, term, runs)

    def _claim_chunk(
        self, namespace: str, token: str, term: int, chunk: list[RunRequest], conn: Connection
    ) -> list[RunClaim]:
        """One transaction: the batch UPDATE and INSERT, then the losers' stored state."""
        keys = [entry_key(r.entry_name) for r in chunk]
        states = {
            k: RunState(r.last_run_us, next_run_count(r.expected, r.total_run_count), term,
                        r.identity)
            for k, r in zip(keys, chunk, strict=True)
        }  # fmt: skip
        fence = {"p_ns": namespace, "p_token": token, "p_term": term}
        updates = [(k, r) for k, r in zip(keys, chunk, strict=True) if r.expected is not None]
        inserts = [(k, r) for k, r in zip(keys, chunk, strict=True) if r.expected is None]
        dialect = self.backend.engine.dialect
        locked: dict[str, Any] = {}
        if not dialect.update_returning:
            # MySQL/MariaDB: lock the rows first, so the UPDATE's row count says which won
            rows = conn.execute(self._read_many, {**fence, "p_keys": keys})
            locked = {r.entry_key: r for r in rows}
        won = self._update(conn, namespace, fence, updates, states, locked) if updates else set()
        if inserts:
            size = 0 if self.arrays else _padded(len(inserts))
            params = {**fence, **_rows(namespace, inserts, states, with_was=False, size=size)}
            result = conn.execute(self._insert_many(size), params)
            if dialect.insert_returning:
                won |= {str(r[0]) for r in result}
            elif result.rowcount > 0:
                # only this leader writes its term: a row absent when locked that now
                # holds this term's state was inserted by this statement
                absent = [k for k, _ in inserts if k not in locked]
                now = self._read(conn, fence, absent)
                won |= {k for k in absent if now.get(k) == states[k]}
        if chunk[0].pending:
            self._write_rows(
                conn, namespace, term, [r for k, r in zip(keys, chunk, strict=True) if k in won]
            )
        out: dict[str, RunClaim] = {k: RunClaim(True, states[k], True) for k in won}
        rest = [k for k in keys if k not in won]
        if rest:
            stored = self._read(conn, fence, rest)
            holds = self._leads(conn, namespace, token, term)
            out.update({k: RunClaim(False, stored.get(k), holds) for k in rest})
        return [out[k] for k in keys]

    def _update(
        self,
        conn: Connection,
        namespace: str,
        fence: dict[str, Any],
        updates: list[tuple[str, RunRequest]],
        states: dict[str, RunState],
        locked: dict[str, Any],
    ) -> set[str]:
        """The batch's compare-and-set UPDATE: the keys of the entries it advanced.

        MySQL/MariaDB (no RETURNING): the claimed rows of the runs the requests follow are
        locked first too; a locked entry row that holds the expected state, whose run is
        not claimed, is changed unless the lease refuses the whole statement.
        """
        held: set[str] = set()
        was: dict[str, str] = {}
        returning = self.backend.engine.dialect.update_returning
        if not returning:
            was = {k: _was_key(namespace, r.entry_name, r.expected) for k, r in updates}
            rows = conn.execute(self._held, {**fence, "p_keys": [*was.values(), PAD]})
            held = {str(row.run_key) for row in rows}
        size = 0 if self.arrays else _padded(len(updates))
        params = {**fence, **_rows(namespace, updates, states, with_was=True, size=size)}
        result = conn.execute(self._update_many(size), params)
        if returning:
            return {str(r[0]) for r in result}
        match = {
            k for k, r in updates
            if k in locked and _key_of(locked[k]) == _key_of_state(r.expected)
            and was[k] not in held
        }  # fmt: skip
        return match if match and result.rowcount == len(match) else set()

    def _read(
        self, conn: Connection, fence: dict[str, Any], keys: list[str]
    ) -> dict[str, RunState]:
        """The stored states of ``keys``, by key (absent: no row)."""
        if not keys:
            return {}
        rows = conn.execute(self._read_many, {**fence, "p_keys": keys})
        return {str(r.entry_key): _state(r) for r in rows}

    def _source(self, n: int, *, with_was: bool) -> Any:
        """The requests as a derived table: ``n`` one-row SELECTs of bound values.

        ``n`` = 0: ``unnest`` of one bound array per column (PostgreSQL), any length.
        """
        if n == 0:
            columns = _COLUMNS + (_WAS_COLUMNS if with_was else ())
            arrays = [sa.cast(sa.bindparam(f"p_{name}"), postgresql.ARRAY(type_))
                      for name, type_ in columns]  # fmt: skip
            rows = sa.func.unnest(*arrays).table_valued(
                *[sa.column(name, type_) for name, type_ in columns]
            )
            return rows.render_derived(name="v")
        selects: list[Any] = []
        for i in range(n):
            cols: list[Any] = [
                sa.bindparam(f"k{i}", type_=key_type(40)).label("entry_key"),
                sa.bindparam(f"n{i}", type_=sa.String(500)).label("entry_name"),
                sa.bindparam(f"a{i}", type_=sa.BigInteger).label("at"),
                sa.bindparam(f"c{i}", type_=sa.BigInteger).label("count"),
                sa.bindparam(f"i{i}", type_=sa.String(200)).label("identity"),
            ]
            if with_was:
                cols.append(sa.bindparam(f"wa{i}", type_=sa.BigInteger).label("was_at"))
                cols.append(sa.bindparam(f"wc{i}", type_=sa.BigInteger).label("was_count"))
                cols.append(sa.bindparam(f"wk{i}", type_=key_type(40)).label("was_key"))
            selects.append(sa.select(*cols))
        query: Any = selects[0] if n == 1 else sa.union_all(*selects)
        subquery: sa.Subquery = query.subquery("v")
        return subquery

    def _leads(self, conn: Connection, namespace: str, token: str, term: int) -> bool:
        """Whether the lease has exactly (token, term), unexpired, read on ``conn`` now."""
        stmt = sa.select(sa.func.count()).where(*_holds(self.backend.lease, namespace, term))
        return bool(conn.execute(stmt, {"p_token": token}).scalar())

    def _unheld(self, was_key: Any) -> sa.ColumnElement[bool]:
        """The hold: the run the claim follows has no row still claimed (a key probe)."""
        r = self.rows
        ns = sa.bindparam("p_ns", type_=key_type(190))
        return ~sa.exists().where(r.c.namespace == ns, r.c.run_key == was_key, r.c.state == CLAIMED)

    @functools.cached_property
    def _held(self) -> sa.Executable:
        """Which of some runs' rows are claimed, locked (MySQL/MariaDB: see ``_read_many``)."""
        r = self.rows
        keys = sa.bindparam("p_keys", expanding=True, type_=key_type(40))
        return (
            sa.select(r.c.run_key)
            .where(r.c.namespace == sa.bindparam("p_ns", type_=key_type(190)),
                   r.c.run_key.in_(keys), r.c.state == CLAIMED)
            .with_for_update()
        )  # fmt: skip

    def _lease_term(self) -> sa.ScalarSelect[Any]:
        """The lease's term if it has the claimer's token and term, unexpired; share-locked."""
        lease = self.backend.lease
        ns = sa.bindparam("p_ns", type_=key_type(190))
        holds = _holds(lease, ns, sa.bindparam("p_term", type_=sa.BigInteger))
        return sa.select(lease.c.term).where(*holds).with_for_update(read=True).scalar_subquery()

    @functools.lru_cache(maxsize=64)  # noqa: B019  (one store per backend, few sizes)
    def _update_many(self, n: int) -> sa.Executable:
        """The compare-and-set of ``n`` entries' states in one fenced UPDATE."""
        t = self.table
        v = self._source(n, with_was=True)
        term = sa.bindparam("p_term", type_=sa.BigInteger)
        stmt = (
            sa.update(t)
            .where(
                t.c.namespace == sa.bindparam("p_ns", type_=key_type(190)),
                t.c.entry_key == v.c.entry_key,
                t.c.last_run_at == v.c.was_at,
                t.c.total_run_count == v.c.was_count,
                self._unheld(v.c.was_key),
                self._lease_term() == term,
            )
            .values(
                last_run_at=v.c.at,
                total_run_count=v.c["count"],
                term=term,
                updated_at=db_now_us(),
                identity=v.c.identity,
            )
        )
        if self.backend.engine.dialect.update_returning:
            return stmt.returning(t.c.entry_key)
        return stmt

    @functools.lru_cache(maxsize=64)  # noqa: B019
    def _insert_many(self, n: int) -> sa.Executable:
        """First runs of ``n`` entries in one fenced INSERT ... SELECT (duplicates: lost)."""
        t = self.table
        v = self._source(n, with_was=False)
        term = sa.bindparam("p_term", type_=sa.BigInteger)
        source = sa.select(
            sa.bindparam("p_ns", type_=key_type(190)).label("namespace"),
            v.c.entry_key,
            v.c.entry_name,
            v.c.at.label("last_run_at"),
            v.c["count"].label("total_run_count"),
            term.label("term"),
            db_now_us().label("updated_at"),
            v.c.identity,
        ).where(self._lease_term() == term, v.c.entry_key != PAD)
        columns = [c.name for c in source.selected_columns]
        insert = self.backend.db.insert_ignore(t, from_select=(columns, source))
        if self.backend.engine.dialect.insert_returning:
            return insert.returning(t.c.entry_key)
        return insert

    @functools.cached_property
    def _read_many(self) -> sa.Executable:
        """The stored state of some entries (row-locked where RETURNING is missing)."""
        t = self.table
        keys = sa.bindparam("p_keys", expanding=True, type_=key_type(40))
        columns = (t.c.entry_key, t.c.last_run_at, t.c.total_run_count, t.c.term)
        stmt = sa.select(*columns, t.c.identity).where(
            t.c.namespace == sa.bindparam("p_ns", type_=key_type(190)), t.c.entry_key.in_(keys)
        )
        if not self.backend.engine.dialect.update_returning:
            return stmt.with_for_update()
        return stmt


def _state(row: Any) -> RunState:
    identity = None if row.identity is None else str(row.identity)
    return RunState(int(row.last_run_at), int(row.total_run_count), int(row.term), identity)


#: The key of a padding row: no entry's (keys are SHA-1 hex), so it matches no row.
PAD = ""
#: Statement sizes: a batch is padded up to one, so a few compiled statements serve every
#: burst (compiling a 300-row statement took 0.4 s, each new size once).
_SIZES = (1, 4, 16, 64, 200, BATCH)


def _padded(n: int) -> int:
    return next(size for size in _SIZES if size >= n)


#: The columns of a batch's derived table (``_source``), and the expected state's.
_COLUMNS: tuple[tuple[str, Any], ...] = (
    ("entry_key", sa.String(40)),
    ("entry_name", sa.String(500)),
    ("at", sa.BigInteger),
    ("count", sa.BigInteger),
    ("identity", sa.String(200)),
)
_WAS_COLUMNS: tuple[tuple[str, Any], ...] = (
    ("was_at", sa.BigInteger),
    ("was_count", sa.BigInteger),
    ("was_key", sa.String(40)),
)


def _rows(
    namespace: str,
    items: list[tuple[str, RunRequest]],
    states: dict[str, RunState],
    *,
    with_was: bool,
    size: int,
) -> dict[str, Any]:
    """The bound values of a derived table of requests (see ``_source``), padded.

    ``size`` = 0: one array per column (``unnest``), no padding.
    """
    if size == 0:
        got = [states[key] for key, _ in items]
        arrays: dict[str, Any] = {
            "p_entry_key": [key for key, _ in items],
            "p_entry_name": [r.entry_name[:500] for _, r in items],
            "p_at": [state.last_run_us for state in got],
            "p_count": [state.total_run_count for state in got],
            "p_identity": [state.identity for state in got],
        }
        if with_was:
            was = [r.expected for _, r in items]
            assert all(w is not None for w in was)
            arrays["p_was_at"] = [w.last_run_us for w in was if w is not None]
            arrays["p_was_count"] = [w.total_run_count for w in was if w is not None]
            arrays["p_was_key"] = [_was_key(namespace, r.entry_name, r.expected) for _, r in items]
        return arrays
    params: dict[str, Any] = {}
    for i in range(len(items), size):
        params.update({f"k{i}": PAD, f"n{i}": PAD, f"a{i}": 0, f"c{i}": 0, f"i{i}": None})
        if with_was:
            params.update({f"wa{i}": 0, f"wc{i}": 0, f"wk{i}": PAD})
    for i, (key, r) in enumerate(items):
        state = states[key]
        params[f"k{i}"] = key
        params[f"n{i}"] = r.entry_name[:500]
        params[f"a{i}"] = state.last_run_us
        params[f"c{i}"] = state.total_run_count
        params[f"i{i}"] = state.identity
        if with_was:
            assert r.expected is not None
            params[f"wa{i}"] = r.expected.last_run_us
            params[f"wc{i}"] = r.expected.total_run_count
            params[f"wk{i}"] = _was_key(namespace, r.entry_name, r.expected)
    return params


def _was_key(namespace: str, entry_name: str, expected: RunState | None) -> str:
    """The row key of the run an entry's claim follows (its stored one; none: PAD)."""
    if expected is None:
        return PAD
    return run_key(run_task_id(namespace, entry_name, expected.last_run_us))


def _key_of(row: Any) -> tuple[int, int]:
    return int(row.last_run_at), int(row.total_run_count)


def _key_of_state(state: RunState | None) -> tuple[int, int] | None:
    return None if state is None else (state.last_run_us, state.total_run_count)


def _holds(lease: sa.Table, ns: Any, term: Any) -> list[sa.ColumnElement[bool]]:
    """The fence on the lease row: the claimer's token and term, unexpired."""
    return [
        lease.c.namespace == ns,
        lease.c.token == sa.bindparam("p_token", type_=sa.String()),
        lease.c.term == term,
        lease.c.expires_at > db_now_us(),
    ]
