"""What the election thread's phases hand each other, and how it calls its backend.

``ElectionLoop`` (election/loop.py) follows, leads and resigns. Each phase owns its
timers as a value it is given (``Following``, ``Leading``) instead of fields that
several methods write; the row as last read (``Reading``) outlives the phases and a
restart; ``BackendCalls`` puts the attempt deadline, the timing and the failure count
around every call. All of it is the election thread's alone.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..core.config import ElectionConfig
from ..core.lease import Lease
from ..core.stats import ElectorStats
from ..core.transitions import Backoff
from .announce import RECOVERED, Announcer

__all__ = ["BackendCalls", "Candidate", "Following", "HoldingBack", "Leading", "Reading", "Request"]

log = logging.getLogger("celery_election.election.elector")


class Request(enum.Enum):
    """What a caller asks of the election thread."""

    RESIGN = "resign"
    STOP = "stop"


@dataclass(slots=True, eq=False)  # one elector run: equal only to itself
class Candidate:
    """Who runs for the namespace: the names and the secret token of one elector run."""

    namespace: str
    candidate_id: str
    hostname: str
    token: str = field(repr=False)
    register: bool
    #: it may take a term (``election_eligible``): else it only reads the row
    eligible: bool = True
    #: the release it runs: it holds back from a vacancy while a newer one lives
    release: str | None = None


@dataclass
class Following:
    """A follower's timers (clock readings), made as it starts following."""

    #: its next look (0: now)
    look_at: float = 0.0
    #: the latest a wakeup may push the next look back to
    look_by: float = 0.0
    #: after a resign: it stays out of the election until then
    backoff_until: float = 0.0
    #: set with a term won: when the leader first renews it (0: at once)
    renew_at: float = 0.0


@dataclass
class HoldingBack:
    """A follower leaving a vacancy to a newer release (decisions.defer_take)."""

    #: since when a newer release has been seen at this vacancy (None: none seen)
    since: float | None = None
    #: holding back now: it elects nothing and wants no lock
    active: bool = False


@dataclass
class Leading:
    """A leader's timers: its next renewal, and how following starts if the term is lost."""

    renew_at: float
    #: planned by the renewal that found the term lost (else: look at once)
    after: Following = field(default_factory=Following)


class Reading:
    """The row as last read, and the greatest term seen: a floor for the next term.

    ``before``: the previous run's reading, whose last lease and greatest term carry
    over (a term is never reused after a restart).
    """

    __slots__ = ("greatest_term", "had", "last_lease", "vacant_since")

    def __init__(self, before: Reading | None = None) -> None:
        self.last_lease: Lease | None = None if before is None else before.last_lease
        self.greatest_term: int = 0 if before is None else before.greatest_term
        #: since when every read has found the row vacant (None: not vacant)
        self.vacant_since: float | None = None
        #: the greatest term held: a later one with our token was handed to us (a transfer)
        self.had: int = 0 if before is None else before.had

    def read(self, lease: Lease | None, now: float, *, looked: bool = False) -> None:
        """Remember the row a step returned (a look's None: the namespace has no row)."""
        if lease is None:
            if looked and self.vacant_since is None:
                self.vacant_since = now
            return
        self.last_lease = lease
        self.greatest_term = max(self.greatest_term, lease.term)
        if lease.held:
            self.vacant_since = None
        elif self.vacant_since is None:
            self.vacant_since = now


class BackendCalls:
    """The election thread's backend calls: each bounded, timed, and its failure reported."""

    def __init__(
        self,
        config: ElectionConfig,
        namespace: str,
        stats: ElectorStats,
        announcer: Announcer,
        backoff: Backoff,
    ) -> None:
        self._timeout, self._namespace = config.call_timeout, namespace
        self._stats, self.announcer, self._backoff = stats, announcer, backoff
        self.failures = 0  # in a row: the back-off grows with them

    def __call__(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """One backend call with the attempt deadline; errors are reported, then raised."""
        op = getattr(fn, "__name__", "call")
        began = time.perf_counter()
        try:
            result = fn(*args, timeout=self._timeout, **kwargs)
        except Exception as exc:
            self._stats.call(op, time.perf_counter() - began, False)
            self.failures += 1
            self.announcer.post(exc)
            raise
        self._stats.call(op, time.perf_counter() - began, True)
        if self.failures:
            log.info("election database reachable again (namespace %r)", self._namespace)
            self.announcer.post(RECOVERED)  # the next error is logged at once
        self.failures = 0
        return result

    def retry_delay(self) -> float:
        """The back-off before the next try after a failed call."""
        return self._backoff(max(1, self.failures))
