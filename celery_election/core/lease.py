"""Lease and candidate values as the database stores them, and the trust-window rule.

All database times are epoch microseconds from the database's own clock. ``remaining`` is
``expires_at - now`` computed by the database in the same statement that read the row, so
a caller can schedule work from it without ever comparing a host clock with the lease.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import overload

__all__ = ["Bid", "CandidateInfo", "ElectResult", "Lease", "trusted_until", "us", "vacancy"]


def _dt(micros: int | None) -> datetime | None:
    if micros is None or micros <= 0:
        return None
    return datetime.fromtimestamp(micros / 1_000_000, tz=timezone.utc)


@overload
def us(seconds: float) -> int: ...
@overload
def us(seconds: None) -> None: ...
def us(seconds: float | None) -> int | None:
    """Seconds (a ttl, a wait, a liveness delta; None: untagged) as the tables' microseconds."""
    return None if seconds is None else round(seconds * 1_000_000)


@dataclass(frozen=True)
class Lease:
    """One namespace's lease row, or one key's hold, read at ``db_now_us`` on the database clock.

    ``term`` is the fencing token: it strictly increases every time the lease changes
    hands, so a write tagged with an old term can be refused by whoever checks it.
    """

    namespace: str
    term: int
    leader_id: str | None
    expires_at_us: int
    db_now_us: int
    acquired_at_us: int | None = None
    renewed_at_us: int | None = None
    #: The holder's per-instance secret; renew and resign require it.
    token: str | None = field(default=None, repr=False)
    #: The holder's liveness delta in microseconds when its trust is bound by a liveness
    #: session (then a follower holding the lock may take the term over); else None.
    liveness_us: int | None = None
    #: An operator asked the holder of this term to hand it to the candidate with this
    #: token (``celery election transfer``); None: nobody asked.
    transfer_to: str | None = field(default=None, repr=False)
    #: The key a singleton task holds (its holder: ``leader_id``); "": the election's lease
    key: str = ""

    @property
    def held(self) -> bool:
        """True if someone holds the lease and it has not expired on the database clock."""
        return self.token is not None and self.expires_at_us > self.db_now_us

    @property
    def remaining(self) -> float:
        """Seconds until the lease expires, on the database clock (0 when not held)."""
        return max(0.0, (self.expires_at_us - self.db_now_us) / 1_000_000) if self.held else 0.0

    def held_by(self, token: str) -> bool:
        """True if this instance token holds the unexpired lease."""
        return self.held and self.token == token

    @property
    def expires_at(self) -> datetime | None:
        return _dt(self.expires_at_us)

    @property
    def acquired_at(self) -> datetime | None:
        return _dt(self.acquired_at_us)

    @property
    def renewed_at(self) -> datetime | None:
        return _dt(self.renewed_at_us)


@dataclass(frozen=True)
class Bid:
    """A bid for a hold, the lease (``key`` "") or a key alike: what a take writes.

    ``token`` is the holder's per-instance secret, ``holder_id`` its name for people;
    ``liveness`` binds the hold to the holder's session of that delta in seconds (others
    may take it over once that session ended); a new term is at least ``floor``.
    """

    namespace: str
    token: str
    holder_id: str
    ttl: float
    key: str = ""
    liveness: float | None = None
    floor: int = 0


@dataclass(frozen=True)
class ElectResult:
    """The outcome of one elect/renew step: did this step win, and the row after it.

    ``lease`` is None only when the step lost to contention and the row could not be read.
    """

    won: bool
    lease: Lease | None


@dataclass(frozen=True)
class CandidateInfo:
    """A live candidate as listed by ``backend.candidates()``."""

    candidate_id: str
    hostname: str
    pid: int
    heartbeat_at_us: int
    expires_at_us: int
    token: str = field(default="", repr=False)
    #: it may take a term (``election_eligible``); an ineligible one only follows
    eligible: bool = True
    #: the release it runs (``election_release``; None: a release that did not say)
    release: str | None = None

    @property
    def heartbeat_at(self) -> datetime | None:
        return _dt(self.heartbeat_at_us)


def trusted_until(attempt_started: float, ttl: float, safety_margin: float) -> float:
    """When a lease won by an attempt that started at ``attempt_started`` stops being trusted.

    The database computed the expiry as (its clock at the statement) + ttl, and the
    statement ran after ``attempt_started``, so the lease lasts at least until
    ``attempt_started + ttl`` on any clock that runs at the database clock's rate. The
    margin absorbs rate differences between the two clocks (docs/design.md, rule 3).
    """
    return attempt_started + ttl - safety_margin


def vacancy(before: Lease | None, after: Lease) -> float | None:
    """Seconds the namespace had no leader before ``after``'s term, at most; None: unknown.

    On the database clock, from ``before`` (the row as this candidate last read it): a
    resigned row was vacant since its resign; a row still held then was last known alive
    at its last renewal (its leader may have lived up to one renew interval longer).
    """
    if before is None or before.term >= after.term or not after.acquired_at_us:
        return None
    end = before.expires_at_us if before.token is None else before.renewed_at_us
    end = end or before.acquired_at_us
    if not end:
        return None  # never held (a fresh row)
    return max(0.0, (after.acquired_at_us - end) / 1_000_000)
