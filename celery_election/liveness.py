"""The elector's liveness thread: waits on, holds and pings a backend's liveness lock.

The rules (docs/design.md, "Liveness"), with ``delta`` the session's silence bound:

* Whoever holds the lock pings it every ``delta / 4``. A ping that started at ``p`` and
  succeeded proves the server will not end the session before ``p + delta``, so a leader
  whose term is tagged with its delta trusts itself until
  ``min(lease trust, p + delta x 11/12)`` (the 1/12 allows for clock rate error, as the
  lease's safety margin does).
* A follower blocks in ``acquire`` (no statements while it waits). A grant means the
  previous holder's session has ended, and with it, at most delta later, the previous
  leader's trust: so ``waited`` seconds after the grant the follower may take over a term
  tagged with a delta no longer than ``waited`` (``backend.take_over``).

This thread only holds the lock and reports; the Elector decides. It never touches the
lease, and every wait is interruptible so ``stop()`` is prompt.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from .backends.base import Backend, WakeupHandle
from .backends.sessions import LivenessSession, LivenessUnsupported
from .clock import Clock, Sleeper
from .config import ElectionConfig
from .errors import BackendUnavailableError
from .term import Lease
from .transitions import Lead, RevokeReason

__all__ = ["RATE_ALLOWANCE", "Liveness", "LivenessRules"]

log = logging.getLogger(__name__)

#: A ping's proof lasts delta x (1 - this): clocks may run fast by up to 1/12 (chrony).
RATE_ALLOWANCE = 1 / 12


class Liveness:
    """Holds one namespace's liveness lock while ``want(True)``; pings while held.

    ``on_change(kind)`` is called from this thread with "granted", "lost" or "renewed"
    (a good ping); it must be quick and must not call back into this object's waits.
    """

    def __init__(
        self,
        session: LivenessSession,
        delta: float,
        max_wait: float,
        clock: Clock,
        on_change: Callable[[str], None],
        name: str,
    ) -> None:
        self.session = session
        self.delta = delta
        self.ping_interval = delta / 4
        self.max_wait = max_wait
        self._clock = clock
        self._on_change = on_change
        self._cond = threading.Condition()
        self._wanted = False
        self._closed = False
        self._acquiring = False
        #: boot-time reading when the current grant was seen (None: not held)
        self.granted_at: float | None = None
        #: until when the last good ping proves the session alive (frozen after a loss)
        self.good_until: float | None = None
        self.failures = 0
        #: the server cannot hold a liveness session: this thread stays idle
        self.unsupported = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    @property
    def held(self) -> bool:
        """Whether the lock is held and has been pinged since the grant."""
        return self.granted_at is not None

    @property
    def wanted(self) -> bool:
        """Whether the lock is asked for."""
        return self._wanted

    def want(self, wanted: bool) -> None:
        """Ask for the lock (block for it in the background) or give it back."""
        with self._cond:
            if wanted == self._wanted:
                return
            self._wanted = wanted
            self._cond.notify_all()
            acquiring = self._acquiring
        if not wanted and acquiring:
            self.session.interrupt()  # a blocked acquire gives up now

    def close(self) -> None:
        """Release the lock, disconnect and end the thread."""
        with self._cond:
            self._closed = True
            self._wanted = False
            self._cond.notify_all()
            acquiring = self._acquiring
        if acquiring:
            self.session.interrupt()
        self._thread.join(self.max_wait + 5)
        self.session.close()
        self.granted_at = None

    def _wait(self, seconds: float | None) -> None:
        with self._cond:
            if not self._closed:
                self._cond.wait(seconds)

    def _run(self) -> None:
        while True:
            with self._cond:
                if self._closed:
                    break
                wanted = self._wanted
            try:
                if self.granted_at is not None:
                    if not wanted:
                        self._release()
                    else:
                        self._wait(self.ping_interval)
                        if self.wanted and not self._closed:
                            self._ping()
                elif wanted and not self.unsupported:
                    self._acquire()
                else:
                    self._wait(None)
            except Exception:  # never kill the thread; the lease still protects
                log.exception("liveness thread error; retrying")
                self._lose()
                self._wait(1.0)
        if self.granted_at is not None:
            self._release()

    def _acquire(self) -> None:
        with self._cond:
            if self._closed or not self._wanted:
                return
            self._acquiring = True
        try:
            got = self.session.acquire(self.max_wait)
        except InterruptedError:
            return
        except LivenessUnsupported as exc:
            log.warning("liveness is off: %s; the lease alone decides", exc)
            self.unsupported = True
            return
        except BackendUnavailableError as exc:
            self.failures += 1
            log.debug("liveness lock wait failed: %s", exc)
            self._wait(min(5.0, 0.1 * 2 ** min(self.failures, 6)))
            return
        finally:
            with self._cond:
                self._acquiring = False
        self.failures = 0
        if not got:
            return
        if not self.wanted:  # asked to let go while the grant was on its way
            self.session.release()
            return
        self.granted_at = self._clock.monotonic()
        self._ping()
        if self.granted_at is not None:
            self._on_change("granted")

    def _ping(self) -> None:
        started = self._clock.monotonic()
        try:
            self.session.ping()
        except BackendUnavailableError as exc:
            log.warning("liveness session lost (%s); the lease alone bounds trust now", exc)
            self._lose()
            return
        self.good_until = started + self.delta * (1 - RATE_ALLOWANCE)
        self._on_change("renewed")

    def _lose(self) -> None:
        if self.granted_at is not None:
            self.granted_at = None
            self._on_change("lost")

    def _release(self) -> None:
        self.granted_at = None
        try:
            self.session.release()
        except Exception:
            log.debug("liveness release failed; the session ends it", exc_info=True)
        self._on_change("lost")


class LivenessRules:
    """The Elector's part of the liveness protocol (see the module docstring).

    A mixin of ``Elector``: what a follower does with the lock (wait on it, take over
    delta after its grant) and how a leader's trust follows its pings. The rest of the
    protocol, the lease, is in elector.py.
    """

    # The Elector's state these rules read and write (set in Elector.__init__).
    config: ElectionConfig
    backend: Backend
    namespace: str
    _clock: Clock
    _lock: threading.Lock
    _live: Liveness | None
    _lead: Lead | None
    _last_lease: Lease | None
    _token: str
    _poke: bool
    _held_term: int | None
    _next_renew: float
    _follow_until: float
    _look_by: float
    _sleeper: Sleeper
    _dispatch_sleeper: Sleeper
    _wakeup: WakeupHandle | None

    if TYPE_CHECKING:

        def _set_lead(self, lead: Lead | None) -> None: ...

        def _drop_lead(self, reason: RevokeReason) -> None: ...

    def _liveness_wait(self, live: Liveness, lease: Lease, now: float) -> float:
        """Wait on the liveness lock for a leader whose trust the lock bounds.

        Granted: take the term over once the leader's delta has passed since the grant.
        Not granted: the liveness thread blocks on the lock and its grant pokes us (a
        resign releases it, so no poll is needed for a clean handoff); the lease stays
        the net: we still look when it would end (a lock wait can hang on a link that
        died without a word, and on SQLite a stopped holder keeps its file lock), later
        when a NOTIFY says the leader renewed, at the latest every fallback_interval.
        """
        assert lease.liveness_us is not None
        live.want(True)
        granted = live.granted_at
        healthy = self._wakeup is not None and self._wakeup.healthy
        if granted is not None:
            wait = max(0.0, granted + lease.liveness_us / 1_000_000 - now) + 0.001
            look_by = now + wait
        else:
            wait = min(self.config.fallback_interval, lease.remaining + random.uniform(0, 0.05))
            look_by = now + max(wait, self.config.fallback_interval if healthy else 0.0)
        with self._lock:
            self._follow_until, self._look_by = now + wait, look_by
        return wait

    def _takeover_due(self, now: float) -> tuple[Lease | None, float]:
        """The lease to take over now (with the seconds waited since the grant), if any."""
        live, lease = self._live, self._last_lease
        granted = None if live is None else live.granted_at
        if (
            granted is None
            or lease is None
            or not lease.held
            or lease.liveness_us is None
            or lease.token == self._token
        ):
            return None, 0.0
        waited = now - granted
        return (lease, waited) if waited * 1_000_000 >= lease.liveness_us else (None, 0.0)

    def _start_liveness(self) -> Liveness | None:
        """The liveness thread, if configured and the backend can hold a session."""
        delta = self.config.liveness
        make = getattr(self.backend, "liveness_session", None)
        if delta is None or make is None:
            return None
        try:
            session = make(self.namespace, delta, self.config.fallback_interval)
        except Exception as exc:
            log.warning("liveness is off for namespace %r: %s", self.namespace, exc)
            return None
        if session is None:
            return None
        return Liveness(
            session,
            delta,
            self.config.fallback_interval,
            self._clock,
            self._on_liveness,
            f"celery-election-liveness-{self.namespace}",
        )

    def _tag(self) -> float | None:
        """The liveness delta to tag a step with: only while the lock is held."""
        live = self._live
        return live.delta if live is not None and live.held else None

    def _new_lead(self, term: int, lease_until: float, tagged: bool) -> Lead:
        good = self._live.good_until if self._live is not None else None
        deadline = lease_until
        if tagged:
            deadline = min(lease_until, good if good is not None else -1.0)
        return Lead(term, deadline, lease_until, tagged)

    def _on_liveness(self, kind: str) -> None:
        """From the liveness thread: a good ping, a grant, or a lost session."""
        with self._lock:
            lead = self._lead
            if lead is not None and self._clock.monotonic() >= lead.trusted_until:
                # Trust ran out before this ping: leadership ended, and a late ping must
                # not revive it (the dispatcher may not have announced it yet).
                self._drop_lead(RevokeReason.EXPIRED)
                lead = None
            if lead is not None and lead.tagged:
                new = self._new_lead(lead.term, lead.lease_until, True)
                if new.trusted_until != lead.trusted_until:
                    self._set_lead(new)
                    if new.trusted_until < lead.trusted_until:
                        self._dispatch_sleeper.wake()  # announce the earlier end on time
            if kind == "renewed":
                return
            # granted: a follower looks at the row now (a leader renews to tag its term);
            # lost: a tagged leader renews untagged now, before its ping trust runs out.
            self._poke = True
            if self._held_term is not None:
                self._next_renew = 0.0
        self._sleeper.wake()

    @property
    def liveness(self) -> str:
        """The liveness lock: "off", "holding" it, "waiting" for it, or "idle".

        Idle: on, but nobody's trust is bound by the lock now (no leader, or one that
        has not taken the lock yet), so this candidate neither holds nor waits.
        """
        live = self._live
        if live is None or live.unsupported:
            return "off"
        if live.held:
            return "holding"
        return "waiting" if live.wanted else "idle"
