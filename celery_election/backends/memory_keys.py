"""Key holds in the memory backend: the SQL store's conditions, as Python (the model).

Each step checks exactly what the SQL step's WHERE clause checks (sql_keys.py), under one
lock, with the backend's clock as the database clock. A holder's liveness lock is one of
the memory backend's liveness locks, named by its token, so ``kill_liveness`` of that
name ends a holder's session from outside, as ``pg_terminate_backend`` would.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..core.clock import Clock
from ..core.keys import check_key, holder_lock_name
from ..core.lease import Bid, ElectResult, Lease
from .memory_hold import HoldRow, as_lease, extend, seen_waited, take, vacant, vacate

if TYPE_CHECKING:
    from .sessions import KeySession

#: ``(name, delta)`` -> a memory liveness session of that name (MemoryBackend's locks)
SessionMaker = Callable[[str, float], "KeySession"]

__all__ = ["MemoryKeyStore"]


class MemoryKeyStore:
    """The :class:`~celery_election.backends.base.KeyStore` of a MemoryBackend."""

    def __init__(
        self,
        clock: Clock,
        enter: Callable[[str], None],
        session: SessionMaker,
    ) -> None:
        self.clock, self._enter, self._session = clock, enter, session
        self._lock = threading.Lock()
        self._rows: dict[tuple[str, str], HoldRow] = {}

    def _take(self, bid: Bid, can: Callable[[HoldRow, int], bool]) -> ElectResult:
        check_key(bid.namespace, bid.key, bid.token)
        with self._lock:
            now = self.clock.wall_us()
            row = self._rows.setdefault((bid.namespace, bid.key), HoldRow())
            won = can(row, now)
            if won:
                take(row, now, bid)
            return ElectResult(won, as_lease(bid.namespace, row, now, bid.key))

    def hold(self, bid: Bid, *, timeout: float | None = None) -> ElectResult:
        """Take ``bid.key`` if vacant or expired."""
        self._enter("keys.hold")
        return self._take(bid, vacant)

    def take_over(
        self, bid: Bid, seen: Lease, waited: float, *, timeout: float | None = None
    ) -> ElectResult:
        """Take exactly the hold ``seen``, tagged with a delta no longer than ``waited``."""
        self._enter("keys.take_over")
        return self._take(bid, seen_waited(seen.term, seen.token, waited))

    def renew(self, bid: Bid, *, timeout: float | None = None) -> list[Lease]:
        """Extend every unexpired hold of ``bid.token``."""
        self._enter("keys.renew")
        out = []
        with self._lock:
            now = self.clock.wall_us()
            for (ns, key), row in sorted(self._rows.items()):
                if ns == bid.namespace and row.token == bid.token and row.expires_at > now:
                    extend(row, now, bid.ttl, bid.liveness)
                    out.append(as_lease(ns, row, now, key))
        return out

    def _vacate(self, namespace: str, key: str, fits: Callable[[HoldRow], bool]) -> bool:
        with self._lock:
            row = self._rows.get((namespace, key))
            if row is None or not fits(row):
                return False
            vacate(row, self.clock.wall_us())
            return True

    def release(
        self, namespace: str, key: str, token: str, term: int, *, timeout: float | None = None
    ) -> bool:
        """Vacate the hold of exactly (token, term)."""
        self._enter("keys.release")
        return self._vacate(namespace, key, lambda r: r.token == token and r.term == term)

    def force_release(
        self, namespace: str, key: str, term: int, *, timeout: float | None = None
    ) -> bool:
        """Vacate the hold of exactly ``term``, while held (an operator's)."""
        self._enter("keys.force_release")
        return self._vacate(namespace, key, lambda r: r.term == term and r.token is not None)

    def get(self, namespace: str, key: str, *, timeout: float | None = None) -> Lease | None:
        """The key's row as stored now (None: never held)."""
        self._enter("keys.get")
        with self._lock:
            row = self._rows.get((namespace, key))
            return None if row is None else as_lease(namespace, row, self.clock.wall_us(), key)

    def held(self, namespace: str, *, timeout: float | None = None) -> list[Lease]:
        """The unexpired holds of ``namespace``, by key."""
        self._enter("keys.held")
        with self._lock:
            now = self.clock.wall_us()
            rows = [as_lease(ns, r, now, k) for (ns, k), r in sorted(self._rows.items())]
        return [h for h in rows if h.namespace == namespace and h.held]

    def holder_key(self, token: str) -> bytes:
        """The lock that names holder ``token``."""
        return holder_lock_name(token).encode()

    def holder_session(self, token: str, delta: float) -> KeySession:
        """Holder ``token``'s lock: a memory liveness lock named by it (its ``ended`` probes)."""
        return self._session(holder_lock_name(token), delta)
