"""A hold's row in memory and its steps: the lease's and each key's, as Python.

Each condition is the WHERE clause of the SQL step it models (``sql_lease.hold_updates``),
checked under the owning store's lock with its clock as the database clock.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..core.lease import Bid, Lease, us

__all__ = ["HoldRow", "as_lease", "extend", "seen_waited", "take", "vacant", "vacate"]


@dataclass
class HoldRow:
    term: int = 0
    token: str | None = None
    holder: str | None = None
    acquired_at: int | None = None
    renewed_at: int | None = None
    expires_at: int = 0
    liveness_us: int | None = None
    transfer_to: str | None = None  # the lease's alone


def as_lease(namespace: str, row: HoldRow, now: int, key: str = "") -> Lease:
    """The row as a read at ``now`` returns it (``key``: a key's; "": the lease)."""
    return Lease(
        namespace=namespace,
        term=row.term,
        leader_id=row.holder,
        expires_at_us=row.expires_at,
        db_now_us=now,
        acquired_at_us=row.acquired_at,
        renewed_at_us=row.renewed_at,
        token=row.token,
        liveness_us=row.liveness_us,
        transfer_to=row.transfer_to,
        key=key,
    )


def vacant(row: HoldRow, now: int) -> bool:
    """The ``elected`` step's condition: nobody holds the row, or the hold expired."""
    return row.token is None or row.expires_at <= now


def seen_waited(seen_term: int, seen_token: str | None, waited: float) -> Callable[..., bool]:
    """The ``taken`` step's: exactly the hold seen, tagged with a delta within ``waited``."""

    def can(row: HoldRow, now: int) -> bool:
        return (
            row.term == seen_term
            and row.token == seen_token
            and row.liveness_us is not None
            and row.liveness_us <= us(waited)
        )

    return can


def take(row: HoldRow, now: int, bid: Bid) -> None:
    """A new, strictly greater term for ``bid.token`` (at least ``bid.floor``)."""
    row.term = max(row.term + 1, now, bid.floor)
    row.token, row.holder = bid.token, bid.holder_id[:255]
    row.acquired_at = row.renewed_at = now
    row.expires_at = now + us(bid.ttl)
    row.liveness_us, row.transfer_to = us(bid.liveness), None


def extend(row: HoldRow, now: int, ttl: float, tag: float | None) -> None:
    row.renewed_at = now
    row.expires_at = now + us(ttl)
    row.liveness_us = us(tag)


def vacate(row: HoldRow, now: int) -> None:
    """Nobody holds it, expired now; its term stays (it never goes back)."""
    row.token = row.holder = row.transfer_to = None
    row.expires_at = now
    row.liveness_us = None
