"""One process's key holds: one token, one liveness session, one thread for all its keys.

Leadership per key, held the way the elector holds the lease (docs/design.md, "Liveness"):

* The holder draws a token and locks it on one connection of its own (the backend's
  ``KeySession``), before it writes any row with that token; a thread pings the lock every
  ``delta / 4`` and renews every hold of the token in one statement every
  ``renew_interval``. A session that is lost is never used again: the next hold draws a
  new token (a token's lock, once free, stays free, so a probe's answer is final).
* Trust of a hold: ``min(start of the last write that set its expiry + ttl - margin,
  last good ping + delta x 11/12)`` when tagged (``decisions.trust_end``); a success that
  returns after that counts as a failure (the hold is given back).
* A key held by another token, tagged with delta d: the holder asks its own session
  whether that token's lock is free (``KeySession.ended``). Free means that session ended
  before the answer, so that holder's trust ends at most d later: after waiting d from
  the answer, ``take_over`` takes exactly that (token, term). A crashed holder's keys
  free in about d, a paused or cut-off one's d after the server ended its silent session.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from ..backends.base import Backend
from ..backends.sessions import KeySession
from ..core.clock import Clock, RealClock, Sleeper
from ..core.config import validate_namespace
from ..core.decisions import Proof, extend, granted, trust_end
from ..core.lease import Bid, Lease, trusted_until
from ..core.transitions import Lead
from ..errors import BackendUnavailableError, ConfigurationError

__all__ = ["Held", "KeyHolder"]

log = logging.getLogger(__name__)


@dataclass
class _Session:
    """One incarnation of the holder: its token, its lock, what the lock proves."""

    token: str
    session: KeySession | None
    proof: Proof = field(default_factory=Proof)
    lost: bool = False


@dataclass
class Held:
    """A key this process holds: its term (the fencing token) and its trust bound."""

    key: str
    term: int
    lease_until: float
    tagged: bool
    incarnation: _Session = field(repr=False)
    #: Seconds waited out for a dead holder's session before this hold (0: the key was free).
    waited: float = 0.0


class KeyHolder:
    """Holds keys for this process in ``namespace`` of ``backend`` (see the module).

    ``liveness``: the session's delta in seconds (None: untagged holds, the lease alone).
    """

    def __init__(
        self,
        backend: Backend,
        namespace: str = "default",
        *,
        ttl: float = 30.0,
        safety_margin: float | None = None,
        liveness: float | None = 1.0,
        holder_id: str | None = None,
        clock: Clock | None = None,
    ) -> None:
        margin = max(ttl / 5, min(1.0, ttl / 4)) if safety_margin is None else safety_margin
        if not (ttl > 0 and 0 <= margin < ttl) or (liveness is not None and liveness <= 0):
            raise ConfigurationError(
                f"key holds need ttl > safety_margin >= 0 and liveness > 0: got ttl={ttl}, "
                f"safety_margin={margin}, liveness={liveness}"
            )
        self.backend, self.namespace = backend, validate_namespace(namespace)
        self.ttl, self.margin, self.delta = ttl, margin, liveness
        self.renew_interval = (ttl - margin) / 3
        self.holder_id = holder_id or f"{socket.gethostname()}:{os.getpid()}"
        self._clock: Clock = clock or RealClock()
        self._sleeper = self._clock.sleeper()  # the ping thread's
        self._renew_sleeper = self._clock.sleeper()
        self._lock = threading.Lock()  # guards _held and _current
        # One connection is the session: a ping (this holder's thread) and a probe (a task's
        # acquire, in any thread or greenlet) interleaved on it broke PyMySQL's protocol.
        self._session_lock = threading.Lock()
        self._current: _Session | None = None
        self._held: dict[str, Held] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None  # pings the session
        # renews the holds: a renewal that waits on the database (row locks on MariaDB)
        # must not hold up the pings, or the server ends the silent session (wait_timeout)
        self._renewer: threading.Thread | None = None

    # -- trust --------------------------------------------------------------------------------

    def trust_end(self, held: Held) -> float:
        """Until when ``held`` may be believed (boot-time clock): the lease's own rule.

        A holder's lock is granted once (a lost session is never used again): a tagged
        hold is bound by that grant's proof, as a tagged term is (``decisions.trust_end``).
        """
        proof = held.incarnation.proof
        return trust_end(
            Lead(held.term, held.lease_until, proof.grant if held.tagged else None), proof
        )

    def trusted(self, held: Held) -> bool:
        """Whether this process may still believe it holds ``held`` now."""
        return self._clock.monotonic() < self.trust_end(held)

    # -- holds --------------------------------------------------------------------------------

    def acquire(self, key: str, *, wait: bool = True) -> Held | None:
        """Hold ``key`` now, or None if another holder has it.

        ``wait``: when the holder's session has ended, wait its delta and take the key
        over (about a second) instead of answering None.
        """
        with self._lock:
            inc = self._incarnation()
        started = self._clock.monotonic()
        tagged = inc.proof.proven(started)
        result = self.backend.keys.hold(self._claim(inc, tagged, key))
        if result.won and result.lease is not None:
            return self._adopt(inc, key, result.lease, started, tagged)
        if wait and result.lease is not None:
            taken = self._take_over(inc, key, result.lease, tagged)
            if taken is not None:
                held = self._adopt(inc, key, taken[0], taken[1], tagged)
                if held is not None:
                    held.waited = taken[1] - started
                return held
        return None

    def _take_over(
        self, inc: _Session, key: str, seen: Lease, tagged: bool
    ) -> tuple[Lease, float] | None:
        """Take ``seen`` once its holder's session is known ended and its delta waited.

        The hold won and when the winning step started; None if not taken.
        """
        keys = self.backend.keys
        if not seen.held or seen.liveness_us is None or inc.session is None or seen.token is None:
            return None
        if seen.token == inc.token or inc.lost:
            return None
        try:
            with self._session_lock:
                ended = inc.session.ended(keys.holder_key(seen.token))
        except BackendUnavailableError as exc:  # ours is lost too: busy, the next try redraws
            log.warning("key holder session lost while probing another holder (%s)", exc)
            inc.lost = True
            return None
        if not ended:
            return None
        answered = self._clock.monotonic()  # that session ended before this instant
        need = seen.liveness_us / 1_000_000
        sleeper = self._clock.sleeper()
        while (waited := self._clock.monotonic() - answered) < need:
            sleeper.wait(need - waited)
        started = self._clock.monotonic()
        result = keys.take_over(self._claim(inc, tagged, key), seen, started - answered)
        return (result.lease, started) if result.won and result.lease is not None else None

    def _claim(self, inc: _Session, tagged: bool, key: str = "") -> Bid:
        """What a take or a renewal of ``inc``'s holds writes (tagged: session-bound)."""
        tag = self.delta if tagged else None
        return Bid(self.namespace, inc.token, self.holder_id, self.ttl, key, tag)

    def _adopt(
        self, inc: _Session, key: str, hold: Lease, started: float, tagged: bool
    ) -> Held | None:
        held = Held(key, hold.term, trusted_until(started, self.ttl, self.margin), tagged, inc)
        if not self.trusted(held):  # won, but too late to believe it: give it back
            self.backend.keys.release(self.namespace, key, inc.token, hold.term)
            return None
        with self._lock:
            self._held[key] = held
        self._ensure_thread()
        return held

    def release(self, held: Held) -> bool:
        """Give ``held`` back (only that term of it); True if it was still ours."""
        with self._lock:
            if self._held.get(held.key) is held:
                del self._held[held.key]
        token = held.incarnation.token
        try:
            return self.backend.keys.release(self.namespace, held.key, token, held.term)
        except BackendUnavailableError:
            log.warning("could not release key %r; it frees when its hold ends", held.key)
            return False

    def holds(self) -> list[Held]:
        """The keys this process holds and still trusts."""
        with self._lock:
            return [h for h in self._held.values() if self.trusted(h)]

    # -- this process's liveness, for the run rows ---------------------------------------------

    def identity(self) -> str | None:
        """The liveness token of this process, which others ask :meth:`alive` about.

        Opens the session on first use; None when no session could be had: nothing to ask.
        """
        with self._lock:
            inc = self._incarnation()
        return inc.token if inc.session is not None else None

    def alive(self, token: str) -> bool:
        """Whether the process of liveness token ``token`` still lives (its session is on).

        True when this process cannot ask (no session of its own, or it failed): a caller
        that waits is late; one that takes over a live process's run runs it twice.
        """
        inc = self._current
        if inc is None or inc.session is None or inc.lost or token == inc.token:
            return True
        try:
            with self._session_lock:
                return not inc.session.ended(self.backend.keys.holder_key(token))
        except BackendUnavailableError as exc:
            log.warning("key holder session lost while probing another process (%s)", exc)
            inc.lost = True
            return True

    # -- the session ---------------------------------------------------------------------------

    def _incarnation(self) -> _Session:
        """The live incarnation, or a new one (new token, its lock taken first)."""
        inc = self._current
        if inc is not None and not inc.lost:
            return inc
        token = uuid.uuid4().hex
        session = None
        if self.delta is not None:
            try:
                session = self.backend.keys.holder_session(token, self.delta)
            except Exception as exc:
                log.warning("key holds are not bound by a session (%s): the lease alone", exc)
        inc = _Session(token, session)
        if session is not None:
            self._grant(inc, session)
        self._current = inc
        self._ensure_thread()  # pings from the grant on: a hold's proof starts fresh
        return inc

    def _grant(self, inc: _Session, session: KeySession) -> None:
        assert self.delta is not None
        try:
            if session.acquire(1.0):  # our own random token: nobody else asks for it
                started = self._clock.monotonic()
                session.ping()
                inc.proof = granted(inc.proof, started, started, self.delta)
                return
        except BackendUnavailableError as exc:
            log.warning("key holder session failed (%s): untagged holds", exc)
        inc.session = None
        session.close()

    def _ensure_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._stop.clear()
            ping = self.renew_interval if self.delta is None else min(self.delta / 4, 1.0)
            self._thread = self._start("celery-election-keys", self._sleeper, ping, self._ping)
        if self._renewer is None or not self._renewer.is_alive():
            self._renewer = self._start(
                "celery-election-keys-renew", self._renew_sleeper, self.renew_interval, self._renew
            )

    def _start(
        self, name: str, sleeper: Sleeper, interval: float, step: Callable[[], None]
    ) -> threading.Thread:
        thread = threading.Thread(
            target=self._loop, args=(sleeper, interval, step), name=name, daemon=True
        )
        thread.start()
        return thread

    def _loop(self, sleeper: Sleeper, interval: float, step: Callable[[], None]) -> None:
        while not self._stop.is_set():
            sleeper.wait(interval)
            if self._stop.is_set():
                return
            try:
                step()
            except Exception:  # never kill the thread; the lease still bounds trust
                log.exception("key holder thread error; retrying")

    def _join(self) -> None:
        self._stop.set()
        self._sleeper.wake()
        self._renew_sleeper.wake()
        for thread in (self._thread, self._renewer):
            if thread is not None and thread is not threading.current_thread():
                thread.join(5)

    def _ping(self) -> None:
        inc = self._current
        if inc is None or inc.session is None or inc.lost or self.delta is None:
            return
        started = self._clock.monotonic()
        try:
            # A session whose connection went reconnects on its next call, without the
            # lock: only a ping of the session that still has it proves anything.
            with self._session_lock:
                inc.session.ping()
                if not inc.session.has_lock:
                    raise BackendUnavailableError("the holder lock's session ended")
        except BackendUnavailableError as exc:
            log.warning("key holder session lost (%s): its holds are no longer trusted", exc)
            inc.lost = True  # never used again: the next hold draws a new token
            with self._session_lock:
                inc.session.close()
            return
        inc.proof = extend(inc.proof, started, self._clock.monotonic(), self.delta)

    def _renew(self) -> None:
        """One statement per incarnation renews all its holds; each renewed one is trusted on."""
        with self._lock:
            incs = {id(h.incarnation): h.incarnation for h in self._held.values()}
        for inc in incs.values():
            started = self._clock.monotonic()
            renewed = self.backend.keys.renew(self._claim(inc, inc.proof.proven(started)))
            terms = {(h.key, h.term) for h in renewed}
            with self._lock:
                for key, held in list(self._held.items()):
                    if held.incarnation is not inc:
                        continue
                    if (held.key, held.term) in terms:
                        held.lease_until = trusted_until(started, self.ttl, self.margin)
                    elif not self.trusted(held):  # freed by someone else (a waiting slot)
                        del self._held[key]

    def abandon(self) -> None:
        """Stop as a killed process stops: nothing released, the session's connection closed.

        Its holds stay in the database until another holder finds the session ended and
        waits out its delta (the test kit's ``crash``). Not for production use: ``close``.
        """
        self._join()
        with self._lock:
            self._held.clear()
            inc, self._current = self._current, None
        if inc is not None and inc.session is not None:
            with self._session_lock:
                inc.session.close()

    def close(self) -> None:
        """Release every hold and the session (idempotent)."""
        self._stop.set()
        self._sleeper.wake()
        self._renew_sleeper.wake()
        with self._lock:
            holds = list(self._held.values())
            inc, self._current = self._current, None
        for held in holds:
            self.release(held)
        if inc is not None and inc.session is not None:
            with self._session_lock:
                inc.session.close()
        self._join()
