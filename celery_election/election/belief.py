"""Belief: the one owner of whether this elector leads, and of telling anyone that it does.

Every change of belief goes through one ``Belief`` under its lock, from whichever thread
makes it: the election thread begins, extends and ends it (won, renewed, lost); the
caller of ``resign()`` or ``stop()`` ends it at once; the dispatcher ends it when its trust
window runs out while the election thread is stuck in a call; the lock thread's good pings
lengthen a tagged term's trust and republish it. Because the lead is cleared when belief
ends, each term is announced elected once and revoked once, in that order, whoever ends
it: nothing downstream de-duplicates. The trust watchers hear of every change before the
announcement goes out (a process killed as soon as it says it leads has its window on
record).

Reading belief (``trusted``) takes no lock: one reference and the clock.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from ..core.clock import Clock
from ..core.decisions import Proof, trust_end
from ..core.transitions import Lead, RevokeReason, Transition

__all__ = ["Belief", "TrustWatcher"]

log = logging.getLogger("celery_election.election.elector")

#: ``watcher(term, trusted_until)`` on every change of trust; (None, None) when it ends
TrustWatcher = Callable[[int | None, float | None], Any]


class Belief:
    """Whether one elector leads: begun, extended and ended here alone.

    ``proof`` reads the liveness lock's current proof (a tagged lead's trust is bound by
    it); ``announce`` queues a transition for the dispatcher.
    """

    def __init__(
        self,
        namespace: str,
        candidate_id: str,
        clock: Clock,
        proof: Callable[[], Proof],
        announce: Callable[[Transition], None],
    ) -> None:
        self.namespace, self.candidate_id = namespace, candidate_id
        self._clock = clock
        self._proof = proof
        self._announce = announce
        self._lock = threading.Lock()
        #: notified on every change (``Elector.wait_for_leadership`` waits on it)
        self.changed = threading.Condition(self._lock)
        self._lead: Lead | None = None
        self._vetoed = 0  # no belief in a term up to this one (resigned)
        self._closed = False  # from stop() until the next start(): nothing is believed
        self._watchers: list[TrustWatcher] = []

    # -- reads (any thread, no lock) ---------------------------------------------------------

    def trusted(self) -> Lead | None:
        """The lead believed now: begun, not ended, its trust window not run out."""
        lead = self._lead
        if lead is None or self._clock.monotonic() >= trust_end(lead, self._proof()):
            return None
        return lead

    def trust_end(self, lead: Lead) -> float:
        """Until when ``lead`` may be believed, with the lock's proof as it is now."""
        return trust_end(lead, self._proof())

    @property
    def lead(self) -> Lead | None:
        """The lead begun and not yet ended, whether or not its trust has run out."""
        return self._lead

    @property
    def closed(self) -> bool:
        """Between ``close()`` and ``open()``: nothing is believed."""
        return self._closed

    # -- changes (any thread) -----------------------------------------------------------------

    def open(self) -> None:
        """Allow belief again (the elector started)."""
        with self._lock:
            self._closed = False

    def begin(self, lead: Lead, vacancy: float | None = None) -> bool:
        """Believe ``lead`` (a term just won); False if closed or the term was resigned.

        ``vacancy``: how long the namespace had no leader before (told with the win).
        """
        with self._lock:
            if self._closed or lead.term <= self._vetoed:
                return False
            self._lead = lead
            self._tell(lead)
            self._post("elected", lead.term, vacancy=vacancy)
            self.changed.notify_all()
            return True

    def extend(self, lead: Lead) -> None:
        """A renewed (or tightened) trust window for the term believed; never revives one."""
        with self._lock:
            if self._lead is not None and self._lead.term == lead.term and self.trusted():
                self._lead = lead
                self._tell(lead)

    def republish(self) -> None:
        """A good ping lengthened a tagged lead's trust: the watchers hear of it now."""
        with self._lock:
            lead = self.trusted()
            if lead is not None and lead.tagged:
                self._tell(lead)

    def end(self, reason: RevokeReason, *, veto: int = 0, close: bool = False) -> Lead | None:
        """End belief (announced once, whoever calls first); the lead ended, if any.

        ``veto``: no term up to this one is believed from now on (a resign, so that the
        term is not believed again if the election thread wins it back). ``close``: nothing
        is believed until ``open()`` (a stop).
        """
        with self._lock:
            self._vetoed = max(self._vetoed, veto)
            self._closed = self._closed or close
            return self._end(reason)

    def expire(self) -> tuple[float | None, Lead | None]:
        """Seconds until the believed lead's trust runs out (None: no lead), and the lead.

        Ended here if it has run out: (0, the lead ended) then. The dispatcher calls this,
        so the end is announced on time even while the election thread is stuck in a
        database call.
        """
        lead = self._lead
        if lead is None:
            return None, None
        left = trust_end(lead, self._proof()) - self._clock.monotonic()
        if left > 0:
            return left, None
        with self._lock:
            if self._lead is not lead:
                return 0.0, None  # renewed or ended meanwhile: look again
            return 0.0, self._end(RevokeReason.EXPIRED)

    def watch(self, watcher: TrustWatcher) -> None:
        """Add a trust watcher; it hears the current trust window at once, if any."""
        with self._lock:
            self._watchers.append(watcher)
            lead = self.trusted()
            if lead is not None:
                watcher(lead.term, self.trust_end(lead))

    # -- under the lock ----------------------------------------------------------------------

    def _end(self, reason: RevokeReason) -> Lead | None:
        lead, self._lead = self._lead, None
        if lead is not None:
            self._tell(None)
            self._post("revoked", lead.term, reason)
        self.changed.notify_all()
        return lead

    def _tell(self, lead: Lead | None) -> None:
        for watcher in self._watchers:
            try:
                if lead is None:
                    watcher(None, None)
                else:
                    watcher(lead.term, self.trust_end(lead))
            except Exception:
                log.exception("a trust watcher raised; the election goes on")

    def _post(
        self,
        kind: str,
        term: int,
        reason: RevokeReason | None = None,
        vacancy: float | None = None,
    ) -> None:
        at = self._clock.monotonic()
        self._announce(
            Transition(kind, self.namespace, term, self.candidate_id, reason, at, vacancy)
        )
