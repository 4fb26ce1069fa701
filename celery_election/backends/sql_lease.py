"""A hold's steps as statements, and their runner: the lease's, and each key's.

One conditional UPDATE of the held row each (``hold_updates``: the lease's row or a
key's; ``HoldSteps`` runs them). docs/design.md, rule 1: every condition of a step is in
its WHERE clause and the new term is computed in SQL, so whoever changed the row won. The
statements are built once per backend with bound parameters (building one, on PostgreSQL
its CTE and UNION, cost more than running it); the dialect's ``StepStyle`` wraps each
UPDATE (RETURNING, the row count, or PostgreSQL's NOTIFY statement).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from ..core.lease import Bid, ElectResult, Lease, us
from ..errors import BackendUnavailableError
from .connection import LostRound
from .dialect_base import StepStyle
from .schema import db_now_us, greatest
from .sql_calls import rowcount

if TYPE_CHECKING:
    from .sql_calls import Caller
    from .sql_host import SQLHost

__all__ = [
    "EVENTS",
    "HoldSteps",
    "bid_params",
    "hold_updates",
    "lease_columns",
    "lease_from_row",
    "lease_statements",
    "lease_updates",
    "taken_values",
    "vacant_values",
]


def bid_params(bid: Bid) -> dict[str, Any]:
    """A take's parameters, the lease's and a key's (which adds its hash, ``p_kh``)."""
    return {"p_ns": bid.namespace, "p_token": bid.token, "p_cid": bid.holder_id[:255],
            "p_ttl": us(bid.ttl), "p_live": us(bid.liveness), "p_floor": bid.floor}  # fmt: skip


#: What NOTIFY tells listeners each step did (a take-over or a transfer is an election; a
#: transfer asked for says the leader lives).
EVENTS = {
    "elected": "elected",
    "taken": "elected",
    "transferred": "elected",
    "asked": "renewed",
    "renewed": "renewed",
    "resigned": "resigned",
}


def lease_columns(t: sa.Table) -> list[sa.ColumnElement[Any]]:
    """The columns a step returns (and ``lease_from_row`` reads), the database clock too.

    The lease's, or a key's (a ``key`` table: its holder read as the leader, and the key).
    """
    key = "key" in t.c
    return [
        t.c.namespace,
        t.c.term,
        t.c.holder_id.label("leader_id") if key else t.c.leader_id,
        t.c.expires_at,
        db_now_us().label("db_now"),
        t.c.acquired_at,
        t.c.renewed_at,
        t.c.token,
        t.c.liveness_us,
        sa.null().label("transfer_to") if key else t.c.transfer_to,
        *([t.c.key] if key else []),
    ]


def lease_from_row(row: sa.Row[Any] | None) -> Lease | None:
    """The lease in a row of ``lease_columns`` (None: no row)."""
    if row is None:
        return None
    return Lease(
        namespace=row.namespace,
        term=int(row.term),
        leader_id=row.leader_id,
        expires_at_us=int(row.expires_at),
        db_now_us=int(row.db_now),
        acquired_at_us=None if row.acquired_at is None else int(row.acquired_at),
        renewed_at_us=None if row.renewed_at is None else int(row.renewed_at),
        token=row.token,
        liveness_us=None if row.liveness_us is None else int(row.liveness_us),
        transfer_to=row.transfer_to,
        key=row._mapping.get("key", ""),
    )


def lease_statements(
    lease: sa.Table, candidate: sa.Table, style: StepStyle
) -> dict[str, sa.Executable]:
    """Each step's statement, as ``style`` runs it, by step name."""
    columns = lease_columns(lease)
    return {
        step: style.statement(stmt, columns, EVENTS[step])
        for step, stmt in lease_updates(lease, candidate).items()
    }


def lease_updates(t: sa.Table, c: sa.Table) -> dict[str, sa.Update]:
    """Each step's conditional UPDATE of the lease row ``t``, with bound parameters.

    ``c``: the candidates table, which a transfer's target must be live and eligible in.
    """
    row = (t.c.namespace == sa.bindparam("p_ns", type_=sa.String()),)
    steps = hold_updates(t, row, "leader_id", transfer_to=None)
    return {**steps, **_transfer_updates(t, c)}


def taken_values(t: sa.Table, holder: str, **also: Any) -> dict[str, Any]:
    """The row as a take leaves it: a new, strictly greater term for ``p_token``."""
    now = db_now_us()
    return {
        # the floor: the greatest term the candidate saw + 1, and its host's clock, so
        # a term lost with a failed-over primary is never reused (whatever the
        # promoted standby's clock says)
        "term": greatest(t.c.term + 1, now, sa.bindparam("p_floor", type_=sa.BigInteger)),
        "token": sa.bindparam("p_token", type_=sa.String()),
        holder: sa.bindparam("p_cid"),
        "acquired_at": now,
        "renewed_at": now,
        "expires_at": now + sa.bindparam("p_ttl", type_=sa.BigInteger),
        "liveness_us": sa.bindparam("p_live", type_=sa.BigInteger),  # None: not session-bound
        **also,
    }


def vacant_values(holder: str, **also: Any) -> dict[str, Any]:
    """The row as a resign leaves it: no holder, expired now; its term stays."""
    return {"token": None, holder: None, "expires_at": db_now_us(), "liveness_us": None, **also}


def hold_updates(
    t: sa.Table, row: tuple[sa.ColumnElement[bool], ...], holder: str, **also: Any
) -> dict[str, sa.Update]:
    """The steps of a hold of the row ``row`` names in ``t``: the lease's, and each key's.

    ``holder``: the column naming the holder; ``also``: columns a take and a resign reset.
    """
    now = db_now_us()
    token = sa.bindparam("p_token", type_=sa.String())
    term = sa.bindparam("p_term", type_=sa.BigInteger)
    ttl = sa.bindparam("p_ttl", type_=sa.BigInteger)
    live = sa.bindparam("p_live", type_=sa.BigInteger)
    taken = taken_values(t, holder, **also)
    return {
        # vacant or expired -> a new, strictly greater term for this token
        "elected": sa.update(t)
        .where(*row, sa.or_(t.c.token.is_(None), t.c.expires_at <= now))
        .values(taken),
        # the exact term a liveness-lock holder saw, held by a holder whose trust is
        # bound by a session delta it has waited out: taken even before it expires
        "taken": sa.update(t)
        .where(
            *row,
            t.c.term == term,
            t.c.token == sa.bindparam("p_seen_token", type_=sa.String()),
            t.c.liveness_us.is_not(None),
            t.c.liveness_us <= sa.bindparam("p_waited", type_=sa.BigInteger),
        )
        .values(taken),
        # only the exact (token, term), only before it expired
        "renewed": sa.update(t)
        .where(*row, t.c.token == token, t.c.term == term, t.c.expires_at > now)
        .values(renewed_at=now, expires_at=now + ttl, liveness_us=live),
        # only the exact (token, term); the term stays: it never goes back
        "resigned": sa.update(t)
        .where(*row, t.c.token == token, t.c.term == term)
        .values(vacant_values(holder, **also)),
    }


def _transfer_updates(t: sa.Table, c: sa.Table) -> dict[str, sa.Update]:
    """A transfer asked for (by an operator) and made (by the leader): the target named.

    Both need the exact (token, term) of an unexpired lease and a target that is a live,
    eligible candidate of the namespace, checked in the same statement. The transfer
    moves the term to the target with a new, greater term, untagged (no lock holder may
    take it over; only its expiry frees it): nobody else can win in between, and the
    target believes it only after renewing it (election/loop.py, ``_accept``).
    """
    now = db_now_us()
    ns = sa.bindparam("p_ns", type_=sa.String())
    target = sa.bindparam("p_target", type_=sa.String())
    holder = (
        t.c.namespace == ns,
        t.c.token == sa.bindparam("p_token", type_=sa.String()),
        t.c.term == sa.bindparam("p_term", type_=sa.BigInteger),
        t.c.expires_at > now,
    )
    live_target = sa.exists(
        sa.select(sa.literal(1))
        .select_from(c)
        .where(
            c.c.namespace == ns,
            c.c.token == target,
            c.c.expires_at > now,
            sa.or_(c.c.eligible.is_(None), c.c.eligible.is_(True)),
        )
    )
    moved = {**taken_values(t, "leader_id", transfer_to=None), "token": target,
             "leader_id": sa.bindparam("p_target_cid"), "liveness_us": None}  # fmt: skip
    return {
        # an operator's request, for the leader to act on at its next renewal
        "asked": sa.update(t).where(*holder, live_target).values(transfer_to=target),
        # the leader's hand-over, its belief already ended
        "transferred": sa.update(t).where(*holder, live_target).values(moved),
    }


class HoldSteps:
    """A hold's steps run on its row: the lease's (``SQLBackend``) and each key's.

    ``statements``: each step's, as ``style`` runs it; ``read(params, timeout,
    connection)``: the row ``params`` name, as stored now (None: no row).
    """

    def __init__(
        self,
        host: SQLHost,
        table: sa.Table,
        statements: dict[str, sa.Executable],
        style: StepStyle,
        read: Callable[[dict[str, Any], float | None, Caller | None], Lease | None],
    ) -> None:
        self.host, self.table, self.statements = host, table, statements
        self.style, self.read = style, read

    def step(
        self, event: str, params: dict[str, Any], timeout: float | None, connection: Caller | None
    ) -> ElectResult | None:
        """Run one conditional UPDATE (``event`` names which).

        The row after it with ``won=True`` if it matched, or (where the dialect reads the
        row in the same statement) the row as read with ``won=False``; None if it matched
        nothing and nothing was read.
        """
        statement = self.statements[event]
        call = functools.partial(
            self.host.call, table=self.table, write=True, timeout=timeout, connection=connection
        )
        if self.style.returning:
            row = call(lambda conn: conn.execute(statement, params).first())
            lease = lease_from_row(row)
            return None if lease is None else ElectResult(bool(getattr(row, "won", True)), lease)
        if call(rowcount(statement, params)) != 1:
            return None
        # MySQL has no UPDATE ... RETURNING: report the row as stored after the step
        lease = self.read(params, timeout, connection)
        assert lease is not None
        return ElectResult(True, lease)

    def tried(
        self, event: str, params: dict[str, Any], timeout: float | None, connection: Caller | None
    ) -> ElectResult | None:
        """``step``, a lost round (contention) as a step that matched nothing."""
        try:
            return self.step(event, params, timeout, connection)
        except LostRound:
            return None

    def lost(
        self, params: dict[str, Any], timeout: float | None, connection: Caller | None
    ) -> ElectResult:
        """A step that did not win: the row as it is now (None if it cannot be read)."""
        try:
            return ElectResult(False, self.read(params, timeout, connection))
        except BackendUnavailableError:
            return ElectResult(False, None)

    def run(
        self, event: str, params: dict[str, Any], timeout: float | None, connection: Caller | None
    ) -> ElectResult:
        """One step, won or lost (a lost round is lost), and the row after it."""
        result = self.tried(event, params, timeout, connection)
        if result is not None and result.won:
            return result
        return result or self.lost(params, timeout, connection)

    def take(
        self,
        params: dict[str, Any],
        vacant: dict[str, Any],
        timeout: float | None,
        connection: Caller | None,
    ) -> ElectResult:
        """Up to three rounds of ``elected`` (the first creates the row ``vacant``); won or lost."""
        insert = self.host.db.insert_if_absent(self.table, vacant, "term")
        lost = ElectResult(False, None)
        try:
            for _attempt in range(3):
                result = self.step("elected", params, timeout, connection)
                if result is not None and result.won:
                    return result
                lost = result or self.lost(params, timeout, connection)
                if lost.lease is None:
                    # never held: create the vacant row, then race
                    self.host.call(
                        rowcount(insert),
                        table=self.table,
                        write=True,
                        timeout=timeout,
                        connection=connection,
                    )
                elif lost.lease.held:
                    return lost
                # else the row was vacant when read (a racer inserted it but has not taken
                # it yet, or its holder just released it): try again
        except LostRound:
            return self.lost(params, timeout, connection)
        return lost
