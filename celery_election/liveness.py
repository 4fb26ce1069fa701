"""The elector's liveness thread: waits on, holds and pings a backend's liveness lock.

The rules (DESIGN.md, "Liveness"), with ``delta`` the session's silence bound:

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
import threading
from collections.abc import Callable

from .backends.liveness import LivenessSession, LivenessUnsupported
from .clock import Clock
from .errors import BackendUnavailableError

__all__ = ["RATE_ALLOWANCE", "Liveness"]

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
    def bounds_silence(self) -> bool:
        """Whether the server ends a silent holder's session (else only death does)."""
        return self.session.bounds_silence

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
