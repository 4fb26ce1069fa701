"""What an Elector reports: its state, its transitions and why, in order.

Kept apart from the protocol (election/elector.py) so that consumers (the Celery worker's bootstep,
AsyncElector, tests) read one small module for the vocabulary of leadership changes.
"""

from __future__ import annotations

import collections
import enum
import random
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

__all__ = [
    "Backoff",
    "Lead",
    "RevokeReason",
    "State",
    "Subscription",
    "Transition",
    "exponential_backoff",
]

#: Delay (seconds) before retry number ``attempt`` (1, 2, ...) after consecutive errors.
Backoff = Callable[[int], float]


def exponential_backoff(base: float = 0.1, cap: float = 5.0) -> Backoff:
    """Doubling delays from ``base`` up to ``cap``, each jittered into its upper half."""

    def delay(attempt: int) -> float:
        ceiling = min(cap, base * 2.0 ** min(attempt - 1, 30))
        return ceiling / 2 + random.uniform(0, ceiling / 2)

    return delay


class State(str, enum.Enum):
    """What an elector is doing."""

    STOPPED = "stopped"
    FOLLOWER = "follower"
    LEADER = "leader"
    RESIGNING = "resigning"
    STOPPING = "stopping"


class RevokeReason(str, enum.Enum):
    """Why leadership ended."""

    #: The backend says the lease is no longer ours (taken after expiry, or gone).
    LOST = "lost"
    #: No renewal succeeded inside the trust window (database slow or unreachable).
    EXPIRED = "expired"
    #: ``resign()`` was called.
    RESIGNED = "resigned"
    #: ``stop()`` was called.
    STOPPED = "stopped"
    #: It handed its term to another candidate (``transfer``).
    TRANSFERRED = "transferred"


@dataclass(frozen=True)
class Transition:
    """One change of belief: ``kind`` is "elected" or "revoked"."""

    kind: str
    namespace: str
    term: int
    candidate_id: str
    reason: RevokeReason | None = None
    #: Boot-time clock reading when the belief changed.
    at: float = 0.0
    #: "elected": seconds the namespace had no leader before this term, at most (database
    #: clock; ``lease.vacancy``), when known.
    vacancy: float | None = None


class Subscription:
    """An ordered stream of transitions; iterate it, or ``get()`` with a timeout."""

    def __init__(self, unsubscribe: Callable[[Subscription], None]) -> None:
        self._unsubscribe = unsubscribe
        self._items: collections.deque[Transition] = collections.deque()
        self._cond = threading.Condition()
        self.closed = False

    def put(self, item: Transition) -> None:
        """Deliver ``item`` to this stream (the dispatcher's call, in order)."""
        with self._cond:
            self._items.append(item)
            self._cond.notify_all()

    def get(self, timeout: float | None = None) -> Transition | None:
        """The next transition, or None after ``timeout`` seconds (real time) or close."""
        with self._cond:
            self._cond.wait_for(lambda: self._items or self.closed, timeout)
            return self._items.popleft() if self._items else None

    def __iter__(self) -> Iterator[Transition]:
        while True:
            item = self.get()
            if item is None:
                return
            yield item

    def close(self) -> None:
        """Stop receiving; a blocked ``get()`` returns None."""
        with self._cond:
            self.closed = True
            self._cond.notify_all()
        self._unsubscribe(self)


@dataclass(frozen=True)
class Lead:
    """What a leading elector believes: its term, and what bounds its trust.

    Trust lasts until ``lease_until`` (attempt start + ttl - margin) and, when ``grant``
    is set, no longer than that liveness grant's proof (``decisions.trust_end``): the
    row says this term's trust is bound by the lock held under that grant.
    """

    term: int
    lease_until: float
    grant: int | None = None

    @property
    def tagged(self) -> bool:
        """Whether the term's trust is bound by the liveness lock."""
        return self.grant is not None
