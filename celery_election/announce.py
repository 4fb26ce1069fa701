"""The dispatcher: delivers an Elector's events in order, each once, off its election thread.

Every thread that ends or starts a belief posts here (the election thread, ``resign()``,
``stop()``, and this thread itself when a trust window runs out while the election thread
is stuck in a call); this thread alone decides what is announced: a ``revoked`` only for
the term whose ``elected`` it delivered, so a belief ended from two sides is announced
once. Callbacks and subscriptions run here, so a slow consumer delays later events only.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .transitions import RevokeReason, Subscription, Transition

if TYPE_CHECKING:
    from .elector import Elector

__all__ = ["Announcer"]

log = logging.getLogger("celery_election.elector")

_ERROR_REPEAT = 60.0  # seconds between two ERROR lines for one persisting failure
#: Posted when the database answers again after errors (resets the error log's repeat).
RECOVERED = "recovered"

Item = Transition | BaseException | str
Callbacks = tuple[
    Callable[[int], Any] | None,
    Callable[[int, RevokeReason], Any] | None,
    Callable[[BaseException], Any] | None,
]


class Announcer:
    """One Elector's event stream and the thread that delivers it."""

    def __init__(self, elector: Elector, callbacks: Callbacks) -> None:
        self._elector = elector
        self._callbacks = callbacks
        self._lock = threading.Lock()
        # Each event goes to the subscriptions that existed when it was posted.
        self._events: collections.deque[tuple[Item, list[Subscription]]] = collections.deque()
        self._subscriptions: list[Subscription] = []
        #: this thread's wait (a test with a fake clock waits for it to be asleep)
        self.sleeper = elector._clock.sleeper()
        self._thread: threading.Thread | None = None
        self._closing = False
        # This thread's own: the term announced elected and not yet revoked, and the
        # error being reported as (kind, when last logged, first failure).
        self._announced: int | None = None
        self._error_logged: tuple[type[BaseException], float, float] | None = None

    def post(self, item: Item) -> None:
        """Queue an event (any thread)."""
        with self._lock:
            self._events.append((item, list(self._subscriptions)))
        self.sleeper.wake()

    def recovered(self) -> None:
        """The database answers again: the next error is logged at once."""
        self.post(RECOVERED)

    def wake(self) -> None:
        """Look again now (a trust window may end earlier than planned)."""
        self.sleeper.wake()

    def subscribe(self) -> Subscription:
        """A new ordered stream of transitions."""
        sub = Subscription(self._elector)
        with self._lock:
            self._subscriptions.append(sub)
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        with self._lock:
            if sub in self._subscriptions:
                self._subscriptions.remove(sub)

    def start(self, name: str) -> None:
        self._closing = False
        self._announced = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def stop(self, timeout: float, election: threading.Thread | None) -> None:
        """Deliver what is queued once ``election`` has ended, then close subscriptions."""
        self._closing = True
        self.sleeper.wake()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        with self._lock:
            subs = list(self._subscriptions)
        for sub in subs:
            with sub._cond:
                sub.closed = True
                sub._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._lock:
                items = list(self._events)
                self._events.clear()
            for item, subs in items:
                self._deliver(item, subs)
            if items:
                continue
            election = self._elector._thread
            if self._closing and not (election is not None and election.is_alive()):
                with self._lock:
                    if not self._events:
                        return
                continue
            timeout = self._expiry()
            if self._closing:
                timeout = 0.05 if timeout is None else min(timeout, 0.05)
            if timeout is None or timeout > 0:
                self.sleeper.wait(timeout)

    def _expiry(self) -> float | None:
        """Seconds until the announced lead's trust ends; announce it if it has."""
        e = self._elector
        lead = e._loop.lead
        if lead is None or lead.term != self._announced:
            return None
        left = e._trust_end(lead) - e._clock.monotonic()
        if left > 0:
            return left
        with e._lock:
            # The trust window ended and no renewal came: announce it now, even if the
            # election thread is stuck in a database call.
            ended = e._loop.lead is lead and e._trusted() is None
            if ended:
                e._end_belief(lead, RevokeReason.EXPIRED)
        if ended:
            e._want_lock(False)  # let a follower have the lock now: our belief has ended
        return 0.0

    def _deliver(self, item: Item, subs: list[Subscription]) -> None:
        if isinstance(item, str):
            self._error_logged = None
            return
        if isinstance(item, Transition):
            if item.kind == "revoked":
                if item.term != self._announced:
                    return  # ended from another side too: announced once
                self._announced = None
            else:
                self._announced = item.term
            reason = item.reason.value if item.reason is not None else "won"
            self._elector.stats.transition(item.kind, reason)
        on_elected, on_revoked, on_error = self._callbacks
        try:
            if isinstance(item, BaseException):
                self._log_error(item)
                if on_error is not None:
                    on_error(item)
                return
            # One line per change, every field in it, for a log search
            # ("election leader elected namespace=jobs").
            log.info(
                "election leader %s namespace=%s term=%s candidate=%s reason=%s",
                item.kind,
                item.namespace,
                item.term,
                item.candidate_id,
                reason,
            )
            if item.kind == "elected":
                if on_elected is not None:
                    on_elected(item.term)
            else:
                assert item.reason is not None
                if on_revoked is not None:
                    on_revoked(item.term, item.reason)
        except Exception:
            log.exception("an election callback raised; the election goes on")
        if isinstance(item, Transition):
            for sub in subs:
                sub._put(item)

    def _log_error(self, exc: BaseException) -> None:
        """ERROR at the first failure of a kind, then again every ``_ERROR_REPEAT`` s.

        A worker that could not reach its election database at start said "ready" and
        logged one line, then ran with nobody leading: the repeat keeps it visible until
        the database answers (then one INFO line says so).
        """
        e = self._elector
        now = e._clock.monotonic()
        logged = self._error_logged
        if logged is not None and logged[0] is type(exc) and now - logged[1] < _ERROR_REPEAT:
            log.debug("election error (namespace %r): %s", e.namespace, exc)
            return
        first = logged[2] if logged is not None and logged[0] is type(exc) else now
        self._error_logged = (type(exc), now, first)
        log.error(
            "election error (namespace %r, %s): %s; this process cannot lead until it "
            "answers (failing for %.0fs; retrying)",
            e.namespace,
            e.backend.description,
            exc,
            now - first,
        )
