"""Beat entries' shared run state on SQL: the fence every beat send goes through.

One row per (namespace, entry): when the entry last ran (epoch microseconds on the
database's clock), how often, and under which term. A leader that finds an entry due
claims "the run after the state I saw" with one conditional statement that share-locks
the lease row (``FOR SHARE`` / ``LOCK IN SHARE MODE``; SQLite's write lock serialises
everything) and changes the entry's row only if it still holds that state and the lease
still has the claimer's token and term, unexpired (docs/design.md, rule 6). A plain read of
the lease followed by a write let a takeover commit in between. The first run of an entry
is an INSERT ... SELECT from the lease row under the same conditions; a duplicate key
means another leader recorded that run first. A claim may also set the run count and the
entry's identity (an operator's edit adopted, a re-created entry starting fresh): the
compare-and-set and the fence are the same.

A lost claim reads the row and the lease in the same transaction, so the caller can adopt
the stored state (someone else ran it) or stop acting on a term the database has ended.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from .base import RunClaim, RunState, next_run_count
from .schema import db_now_us, entry_key, key_type

if TYPE_CHECKING:
    from .sql import SQLBackend

__all__ = ["SQLBeatStore"]


class SQLBeatStore:
    """The :class:`~celery_election.backends.base.BeatStore` of a :class:`SQLBackend`."""

    def __init__(self, backend: SQLBackend) -> None:
        self.backend = backend
        self.table = backend.beat_run

    def load_runs(self, namespace: str, *, timeout: float | None = None) -> dict[str, RunState]:
        """Every entry's run state in ``namespace``, by entry name."""
        t = self.table
        stmt = sa.select(
            t.c.entry_name, t.c.last_run_at, t.c.total_run_count, t.c.term, t.c.identity
        ).where(t.c.namespace == namespace)
        return self.backend._run(
            lambda conn: {r.entry_name: _state(r) for r in conn.execute(stmt)},
            table=t,
            write=False,
            timeout=timeout,
            connection=None,
        )

    def claim_run(
        self,
        namespace: str,
        token: str,
        term: int,
        entry_name: str,
        expected: RunState | None,
        last_run_us: int,
        *,
        total_run_count: int | None = None,
        identity: str | None = None,
        timeout: float | None = None,
    ) -> RunClaim:
        """Record the run after ``expected`` for the leader (token, term); see the module."""
        insert, update, read = self._statements
        total_run_count = next_run_count(expected, total_run_count)
        params: dict[str, Any] = {
            "p_ns": namespace,
            "p_key": entry_key(entry_name),
            "p_name": entry_name[:500],
            "p_token": token,
            "p_term": term,
            "p_at": last_run_us,
            "p_count": total_run_count,
            "p_identity": identity,
        }
        if expected is not None:
            params["p_was_at"] = expected.last_run_us
            params["p_was_count"] = expected.total_run_count

        def work(conn: Connection) -> RunClaim:
            if expected is None:
                result = conn.execute(insert, params)
                returning = self.backend.engine.dialect.insert_returning
                # INSERT ... SELECT reports rowcount -1 through psycopg: count RETURNING rows
                won = (len(result.all()) if returning else result.rowcount) == 1
            else:
                won = conn.execute(update, params).rowcount == 1
            if won:
                return RunClaim(True, RunState(last_run_us, total_run_count, term, identity), True)
            row = conn.execute(read, params).first()
            holds = self.backend.holds(conn, namespace, token, term)
            return RunClaim(False, None if row is None else _state(row), holds)

        lost = RunClaim(False, expected, True)  # lost to contention: nothing decided
        return self.backend._write(work, table=self.table, lost=lost, timeout=timeout)

    @functools.cached_property
    def _statements(self) -> tuple[sa.Executable, sa.Executable, sa.Executable]:
        """The first-run INSERT, the compare-and-set UPDATE and the read-back, built once."""
        backend, t, lease = self.backend, self.table, self.backend.lease
        now = db_now_us()
        ns = sa.bindparam("p_ns", type_=key_type(190))
        key = sa.bindparam("p_key", type_=key_type(40))
        term = sa.bindparam("p_term", type_=sa.BigInteger)
        at = sa.bindparam("p_at", type_=sa.BigInteger)
        count = sa.bindparam("p_count", type_=sa.BigInteger)
        identity = sa.bindparam("p_identity", type_=sa.String(200))
        holds = [
            lease.c.namespace == ns,
            lease.c.token == sa.bindparam("p_token", type_=sa.String()),
            lease.c.term == term,
            lease.c.expires_at > now,
        ]
        source = sa.select(
            ns.label("namespace"),
            key.label("entry_key"),
            sa.bindparam("p_name", type_=sa.String(500)).label("entry_name"),
            at.label("last_run_at"),
            count.label("total_run_count"),
            lease.c.term,
            now.label("updated_at"),
            identity.label("identity"),
        )
        source = source.where(*holds).with_for_update(read=True)
        columns = [c.name for c in source.selected_columns]
        insert = backend.db.insert_ignore(t, from_select=(columns, source))
        if backend.engine.dialect.insert_returning:
            insert = insert.returning(t.c.last_run_at)
        lease_term = sa.select(lease.c.term).where(*holds).with_for_update(read=True)
        update = (
            sa.update(t)
            .where(
                t.c.namespace == ns,
                t.c.entry_key == key,
                t.c.last_run_at == sa.bindparam("p_was_at", type_=sa.BigInteger),
                t.c.total_run_count == sa.bindparam("p_was_count", type_=sa.BigInteger),
                lease_term.scalar_subquery() == term,
            )
            .values(
                last_run_at=at,
                total_run_count=count,
                term=term,
                updated_at=now,
                identity=identity,
            )
        )
        read = sa.select(t.c.last_run_at, t.c.total_run_count, t.c.term, t.c.identity).where(
            t.c.namespace == ns, t.c.entry_key == key
        )
        return insert, update, read


def _state(row: Any) -> RunState:
    identity = None if row.identity is None else str(row.identity)
    return RunState(int(row.last_run_at), int(row.total_run_count), int(row.term), identity)
