"""The elector's lock thread: waits on, holds and pings a backend's liveness lock.

The rules are in core/decisions.py. This thread only holds the lock and publishes what it
proves, as one immutable ``Proof`` that only it writes; it posts each change to its owner
(an Elector, a KeyHolder) and never touches the lease or the owner's fields. A follower
blocks in ``acquire`` (no statements while it waits); every other wait goes through the
Clock, so the rules run on the fake clock too, and is interruptible so ``stop()`` is prompt.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable

from ..backends.base import Backend
from ..backends.sessions import LivenessSession, LivenessUnsupported
from ..core.clock import Clock, Sleeper
from ..core.config import ElectionConfig
from ..core.decisions import LockNews, Proof, extend, granted
from ..errors import BackendUnavailableError

__all__ = ["LockThread", "lock_proof", "lock_status", "start_lock_thread"]

log = logging.getLogger(__name__)

_NO_PROOF = Proof()


class LockThread:
    """Holds one namespace's liveness lock while ``want(True)``; pings while held.

    ``on_change(news)`` is called from this thread with each ``LockNews`` (core/decisions.py:
    granted, lost, a good ping, a standby slot taken, a failing wait, unsupported); it
    must be quick and only post (it runs on this thread).

    With ``standbys`` > 0 it waits on the lock only while it holds one of that many
    standby slots (a hot standby); without one it is cold: it holds no connection and
    tries for a slot again every ``cold_wait`` seconds (jittered).
    ``regrant=False`` keeps a lock whose proof lapsed (a key holder's keys end with its
    session, never with a silence); a ping holds ``session_lock`` (a holder's probes too).
    """

    def __init__(
        self,
        session: LivenessSession,
        delta: float,
        max_wait: float,
        clock: Clock,
        on_change: Callable[[LockNews], None],
        name: str,
        *,
        standbys: int = 0,
        cold_wait: float = 10.0,
        regrant: bool = True,
    ) -> None:
        self.session = session
        self.session_lock = threading.Lock()
        self.regrant = regrant
        self.standbys = standbys
        self.cold_wait = cold_wait
        #: wanted, but no standby slot was free at the last try: no connection held
        self.cold = False
        self.delta = delta
        self.ping_interval = delta / 4
        self.max_wait = max_wait
        self._clock = clock
        self._on_change = on_change
        self._cond = threading.Condition()  # guards _wanted, _closed, _acquiring
        self._sleeper = clock.sleeper()
        self._wanted = False
        self._closed = False
        self._acquiring = False
        #: what the lock proves now; replaced whole, by this thread only
        self.proof = Proof()
        self.failures = 0
        #: the server cannot hold a liveness session: this thread stays idle
        self.unsupported = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    @property
    def sleeper(self) -> Sleeper:
        """The lock thread's timed wait (a fake-clock test waits for a cold one to sleep)."""
        return self._sleeper

    @property
    def has_lock(self) -> bool:
        """Whether the lock is held and has been pinged since the grant."""
        return self.proof.has_lock

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
            acquiring = self._acquiring
        self._sleeper.wake()
        if not wanted and acquiring:
            self.session.interrupt()  # a blocked acquire gives up now

    def close(self) -> None:
        """Release the lock, disconnect and end the thread."""
        with self._cond:
            self._closed = True
            self._wanted = False
            acquiring = self._acquiring
        self._sleeper.wake()
        if acquiring:
            self.session.interrupt()
        self._thread.join(self.max_wait + 5)
        self.session.close()

    def _run(self) -> None:
        while not self._closed:
            wanted = self._wanted
            try:
                if self.proof.has_lock:
                    if not wanted:
                        self._release()
                    elif self.regrant and not self.proof.proven(self._clock.monotonic()):
                        # A lapsed proof (pings slower than it lasts) binds and frees
                        # nobody, and a follower may not take over on it: let the lock
                        # go and ask for a fresh grant (at once, if nobody else has it).
                        log.info("liveness proof lapsed; asking for the lock again")
                        self._release()
                    elif not self._sleeper.wait(self.ping_interval) and self._wanted:
                        self._ping()
                elif wanted and not self.unsupported:
                    self._acquire()
                else:
                    self.cold = False
                    self.session.release()  # a standby slot goes to another candidate
                    self._sleeper.wait(None)
            except Exception:  # never kill the thread; the lease still protects
                log.exception("liveness thread error; retrying")
                self._failed()
                self._lose()
                self._sleeper.wait(1.0)
        if self.proof.has_lock:
            self._release()

    def _acquire(self) -> None:
        with self._cond:
            if self._closed or not self._wanted:
                return
            self._acquiring = True
        try:
            if self.standbys:
                if not self.session.claim_slot(self.standbys):
                    self._go_cold()
                    return
                if self.cold:
                    self.cold = False
                    self._on_change(LockNews.HOT)
            got = self.session.acquire(self.max_wait)
        except InterruptedError:
            return
        except LivenessUnsupported as exc:
            log.warning("liveness is off: %s; the lease alone decides", exc)
            self.unsupported = True
            self._on_change(LockNews.UNSUPPORTED)
            return
        except BackendUnavailableError as exc:
            self._failed()
            log.debug("liveness lock wait failed: %s", exc)
            self._sleeper.wait(min(5.0, 0.1 * 2 ** min(self.failures, 6)))
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
        at = started = self._clock.monotonic()
        try:
            self.session.ping()
        except BackendUnavailableError as exc:
            log.warning("liveness session lost at its grant (%s)", exc)
            return
        self.proof = granted(self.proof, at, started, self.delta)
        self._on_change(LockNews.GRANTED)

    @property
    def waits_well(self) -> bool:
        """Whether the last wait on the lock went well (a grant will then wake us)."""
        return self.failures == 0

    def _failed(self) -> None:
        self.failures += 1
        if self.failures == 1:
            self._on_change(LockNews.FAILING)

    def _go_cold(self) -> None:
        """Every standby slot is taken: hold no connection until the next try."""
        self.session.release()
        self.cold = True
        self._sleeper.wait(self.cold_wait * random.uniform(0.9, 1.1))

    def _ping(self) -> None:
        started = self._clock.monotonic()
        try:
            # a session reconnects after a loss (a holder's probe failed) without the lock
            with self.session_lock:
                self.session.ping()
                if not self.session.has_lock:
                    raise BackendUnavailableError("the liveness lock's session ended")
        except BackendUnavailableError as exc:
            log.warning("liveness session lost (%s); the lease alone bounds trust now", exc)
            self._lose()
            return
        self.proof = extend(self.proof, started, self._clock.monotonic(), self.delta)
        self._on_change(LockNews.PINGED)

    def _lose(self) -> None:
        proof = self.proof
        if proof.has_lock:
            self.proof = Proof(proof.grant, None, proof.good_until, proof.previous)
            self._on_change(LockNews.LOST)

    def _release(self) -> None:
        self._lose()
        try:
            self.session.release()
        except Exception:
            log.debug("liveness release failed; the session ends it", exc_info=True)


def start_lock_thread(
    backend: Backend,
    namespace: str,
    config: ElectionConfig,
    clock: Clock,
    on_change: Callable[[LockNews], None],
) -> LockThread | None:
    """The lock thread, if liveness is on and the backend can hold a session."""
    delta, max_wait = config.liveness, config.fallback_interval
    if delta is None:
        return None
    try:
        session = backend.liveness_session(namespace, delta, max_wait)
    except Exception as exc:
        log.warning("liveness is off for namespace %r: %s", namespace, exc)
        return None
    if session is None:
        return None
    return LockThread(
        session,
        delta,
        max_wait,
        clock,
        on_change,
        f"celery-election-liveness-{namespace}",
        standbys=config.standbys,
        # A slot frees only when a hot standby is promoted or leaves, and the other hot
        # standbys cover the next failover meanwhile: a cold one need not connect often.
        cold_wait=config.fallback_interval,
    )


def lock_proof(live: LockThread | None) -> Proof:
    """What ``live``'s lock proves now (nothing without a lock thread)."""
    return _NO_PROOF if live is None else live.proof


def lock_status(live: LockThread | None) -> str:
    """``Elector.liveness`` (see there); "off" also when the server cannot hold a lock."""
    if live is None or live.unsupported:
        return "off"
    if live.has_lock:
        return "holding"
    if not live.wanted:
        return "idle"
    return "standby" if live.cold else "waiting"
