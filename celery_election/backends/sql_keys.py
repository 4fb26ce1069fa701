"""Key holds on SQL: each step one conditional statement on the key's row (rule 1).

The same shape as the lease's steps (sql_lease.py): every condition in the WHERE clause,
the new term computed in SQL (greatest(term + 1, database clock, floor): rule 4), won if
the row changed. A key's row is created vacant by an idempotent insert the first time
it is held, and stays when released (the term never goes back). The holder's liveness is
one session lock named by its token (``holder_key``), not one lock per key: all of a
holder's keys free together when its session ends, and one connection serves them all.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, cast

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ..core.keys import check_key, holder_lock_name, key_hash
from ..core.lease import Bid, ElectResult, Lease, us
from .locks import lock_key
from .schema import db_now_us
from .sql_calls import rowcount
from .sql_lease import (
    HoldSteps,
    bid_params,
    hold_updates,
    lease_columns,
    lease_from_row,
    vacant_values,
)

if TYPE_CHECKING:
    from .sessions import KeySession
    from .sql_host import SQLHost

__all__ = ["SQLKeyStore", "key_updates"]


def key_updates(t: sa.Table) -> dict[str, sa.Update]:
    """Each step's conditional UPDATE of a key row: the lease's on the key's row, and two.

    Taken, taken over and released as the lease is (``sql_lease.hold_updates``); renewed
    all at once per holder; and an operator's release.
    """
    now = db_now_us()
    ns = sa.bindparam("p_ns", type_=sa.String())
    kh = sa.bindparam("p_kh", type_=sa.String())
    token = sa.bindparam("p_token", type_=sa.String())
    ttl = sa.bindparam("p_ttl", type_=sa.BigInteger)
    steps = hold_updates(t, (t.c.namespace == ns, t.c.key_hash == kh), "holder_id")
    return {
        **steps,
        # every unexpired hold of this token (a token is one holder session)
        "renewed": sa.update(t)
        .where(t.c.namespace == ns, t.c.token == token, t.c.expires_at > now)
        .values(
            renewed_at=now,
            expires_at=now + ttl,
            liveness_us=sa.bindparam("p_live", type_=sa.BigInteger),
        ),
        # an operator's: only the term they saw, only while held
        "forced": sa.update(t)
        .where(
            t.c.namespace == ns,
            t.c.key_hash == kh,
            t.c.term == sa.bindparam("p_term", type_=sa.BigInteger),
            t.c.token.is_not(None),
        )
        .values(vacant_values("holder_id")),
    }


class SQLKeyStore:
    """The :class:`~celery_election.backends.base.KeyStore` of a SQL backend."""

    def __init__(self, backend: SQLHost) -> None:
        self.backend = backend
        self.table = backend.key_hold
        self.returning = bool(backend.engine.dialect.update_returning)

    @functools.cached_property
    def _updates(self) -> dict[str, sa.Update]:
        return key_updates(self.table)

    @functools.cached_property
    def _steps(self) -> HoldSteps:
        """The lease's runner over the key's row (no NOTIFY: nobody waits on a key)."""
        style = self.backend.db.step_style(self.backend.engine)
        columns = lease_columns(self.table)
        statements = {n: style.statement(u, columns, n) for n, u in self._updates.items()}
        return HoldSteps(self.backend, self.table, statements, style, self._read)

    def _read(
        self, params: dict[str, Any], timeout: float | None, connection: Any = None
    ) -> Lease | None:
        """The row ``params`` name (``p_ns``, ``p_kh``), as stored now."""
        t = self.table
        stmt = sa.select(*lease_columns(t)).where(
            t.c.namespace == params["p_ns"], t.c.key_hash == params["p_kh"]
        )
        return self.backend.call(
            lambda conn: lease_from_row(conn.execute(stmt).first()),
            table=t,
            write=False,
            timeout=timeout,
            connection=None,
        )

    @staticmethod
    def _params(bid: Bid) -> dict[str, Any]:
        check_key(bid.namespace, bid.key, bid.token)
        return {**bid_params(bid), "p_kh": key_hash(bid.key)}

    def hold(self, bid: Bid, *, timeout: float | None = None) -> ElectResult:
        """Take ``bid.key`` if vacant or expired (see ``KeyStore.hold``)."""
        params = self._params(bid)
        vacant = {"namespace": bid.namespace, "key_hash": params["p_kh"], "key": bid.key,
                  "term": 0, "expires_at": 0}  # fmt: skip
        return self._steps.take(params, vacant, timeout, None)

    def take_over(
        self, bid: Bid, seen: Lease, waited: float, *, timeout: float | None = None
    ) -> ElectResult:
        """Take exactly the hold ``seen`` (see ``KeyStore.take_over``)."""
        params = self._params(bid)
        params.update(p_term=seen.term, p_seen_token=seen.token, p_waited=us(waited))
        return self._steps.run("taken", params, timeout, None)

    def renew(self, bid: Bid, *, timeout: float | None = None) -> list[Lease]:
        """Extend every unexpired hold of ``bid.token``; the holds it extended."""
        params = {"p_ns": bid.namespace, "p_token": bid.token, "p_ttl": us(bid.ttl),
                  "p_live": us(bid.liveness)}  # fmt: skip
        stmt = self._steps.statements["renewed"]
        t = self.table
        mine = sa.select(*lease_columns(t)).where(
            t.c.namespace == bid.namespace, t.c.token == bid.token,
            t.c.expires_at > db_now_us(),
        )  # fmt: skip

        def work(conn: Connection) -> list[Lease]:
            result = conn.execute(stmt, params)
            # Without RETURNING: the token's unexpired rows after the UPDATE are the ones
            # it extended (only this holder writes its token, one step at a time).
            rows = result.all() if self.returning else conn.execute(mine).all()
            return [h for h in map(lease_from_row, rows) if h is not None]

        return self.backend.call_write(work, table=t, lost=[], timeout=timeout)

    def release(
        self, namespace: str, key: str, token: str, term: int, *, timeout: float | None = None
    ) -> bool:
        """Vacate the hold of exactly (token, term)."""
        params = {"p_ns": namespace, "p_kh": key_hash(key)}
        return self._vacate("resigned", {**params, "p_token": token, "p_term": term}, timeout)

    def force_release(
        self, namespace: str, key: str, term: int, *, timeout: float | None = None
    ) -> bool:
        """Vacate the hold of exactly ``term`` (an operator's, fenced)."""
        params = {"p_ns": namespace, "p_kh": key_hash(key), "p_term": term}
        return self._vacate("forced", params, timeout)

    def _vacate(self, step: str, params: dict[str, Any], timeout: float | None) -> bool:
        stmt = self._updates[step]  # no RETURNING: the count says
        return bool(
            self.backend.call_write(
                rowcount(stmt, params),
                table=self.table,
                lost=0,
                timeout=timeout,
            )
        )

    def get(self, namespace: str, key: str, *, timeout: float | None = None) -> Lease | None:
        """The key's row as stored now (None: never held)."""
        return self._read({"p_ns": namespace, "p_kh": key_hash(key)}, timeout)

    def held(self, namespace: str, *, timeout: float | None = None) -> list[Lease]:
        """The unexpired holds of ``namespace``, by key."""
        t = self.table
        stmt = (
            sa.select(*lease_columns(t))
            .where(t.c.namespace == namespace, t.c.token.is_not(None), t.c.expires_at > db_now_us())
            .order_by(t.c.key)
        )
        return self.backend.call(
            lambda conn: [h for h in map(lease_from_row, conn.execute(stmt)) if h is not None],
            table=t,
            write=False,
            timeout=timeout,
            connection=None,
        )

    def holder_key(self, token: str) -> bytes:
        """The lock that names holder ``token``."""
        return lock_key(self.backend.table_prefix, holder_lock_name(token))

    def holder_session(self, token: str, delta: float) -> KeySession | None:
        """Holder ``token``'s lock on a connection of its own (locks.py; ``ended`` probes)."""
        session = self.backend.liveness_session(holder_lock_name(token), delta, 1.0)
        return cast("KeySession", session)
