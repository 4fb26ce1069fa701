"""The dispatcher: delivers an Elector's events in order off its election thread.

``Belief`` (election/belief.py) posts each transition here once, in order; the election thread
posts its errors. Callbacks and subscriptions run on this thread, so a slow consumer
delays later events only, never the protocol. Between events this thread also watches
the believed lead's trust window (``expire``): when it runs out while the election
thread is stuck in a database call, the end is announced on time.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable
from typing import Any

from ..core import tracing
from ..core.clock import Clock
from ..core.stats import ElectorStats
from ..core.transitions import RevokeReason, Subscription, Transition

__all__ = ["Announcer"]

log = logging.getLogger("celery_election.election.elector")

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
    """One Elector's event stream and the thread that delivers it.

    ``expire()`` returns the seconds until the believed lead's trust runs out (None: no
    lead), ending it if it has (``Belief.expire``, wired by the Elector).
    """

    def __init__(
        self,
        namespace: str,
        database: str,
        clock: Clock,
        stats: ElectorStats,
        callbacks: Callbacks,
        expire: Callable[[], float | None],
    ) -> None:
        self._namespace, self._database = namespace, database
        self._clock, self._stats = clock, stats
        self._callbacks = callbacks
        self._expire = expire
        self._lock = threading.Lock()
        # Each event goes to the subscriptions that existed when it was posted.
        self._events: collections.deque[tuple[Item, list[Subscription]]] = collections.deque()
        self._subscriptions: list[Subscription] = []
        #: this thread's wait (a test with a fake clock waits for it to be asleep)
        self.sleeper = clock.sleeper()
        self._thread: threading.Thread | None = None
        self._election: threading.Thread | None = None
        self._closing = False
        # This thread's own: the error being reported as (kind, when last logged, first
        # failure).
        self._error_logged: tuple[type[BaseException], float, float] | None = None

    def post(self, item: Item) -> None:
        """Queue an event (any thread)."""
        with self._lock:
            self._events.append((item, list(self._subscriptions)))
        self.sleeper.wake()

    def subscribe(self) -> Subscription:
        """A new ordered stream of transitions."""
        sub = Subscription(self.unsubscribe)
        with self._lock:
            self._subscriptions.append(sub)
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        with self._lock:
            if sub in self._subscriptions:
                self._subscriptions.remove(sub)

    def start(self, name: str, election: threading.Thread) -> None:
        """Deliver from now on; ``election``: the election thread it outlives at a stop."""
        self._closing = False
        self._election = election
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def stop(self, timeout: float) -> None:
        """Deliver what is queued once the election thread ends; close subscriptions."""
        self._closing = True
        self.sleeper.wake()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        with self._lock:
            subs = list(self._subscriptions)
        for sub in subs:
            sub.close()  # a blocked ``get()`` returns None; unsubscribed

    def _run(self) -> None:
        while True:
            with self._lock:
                items = list(self._events)
                self._events.clear()
            for item, subs in items:
                self._deliver(item, subs)
            if items:
                continue
            election = self._election
            if self._closing and not (election is not None and election.is_alive()):
                with self._lock:
                    if not self._events:
                        return
                continue
            timeout = self._expire()
            if self._closing:
                timeout = 0.05 if timeout is None else min(timeout, 0.05)
            if timeout is None or timeout > 0:
                self.sleeper.wait(timeout)

    def _deliver(self, item: Item, subs: list[Subscription]) -> None:
        if isinstance(item, str):
            self._error_logged = None
            return
        if isinstance(item, Transition):
            reason = item.reason.value if item.reason is not None else "won"
            self._stats.transition(item.kind, reason)
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
            # a span, when an OpenTelemetry SDK is set up, timed by the change itself
            tracing.transition(item, ago=self._clock.monotonic() - item.at)
            for sub in subs:
                sub.put(item)

    def _log_error(self, exc: BaseException) -> None:
        """ERROR at the first failure of a kind, then again every ``_ERROR_REPEAT`` s.

        A worker that could not reach its election database at start said "ready" and
        logged one line, then ran with nobody leading: the repeat keeps it visible until
        the database answers (then one INFO line says so).
        """
        now = self._clock.monotonic()
        logged = self._error_logged
        if logged is not None and logged[0] is type(exc) and now - logged[1] < _ERROR_REPEAT:
            log.debug("election error (namespace %r): %s", self._namespace, exc)
            return
        first = logged[2] if logged is not None and logged[0] is type(exc) else now
        self._error_logged = (type(exc), now, first)
        log.error(
            "election error (namespace %r, %s): %s; this process cannot lead until it "
            "answers (failing for %.0fs; retrying)",
            self._namespace,
            self._database,
            exc,
            now - first,
        )
