"""One process's key holds: one token, one liveness session, two threads for all its keys.

Leadership per key, held the way the elector holds the lease (docs/design.md, "Liveness"):

* The holder draws a token and locks it on one connection of its own (the backend's
  ``KeySession``), before it writes any row with that token. The elector's ``LockThread``
  holds that lock and pings it every ``delta / 4``: its proof is the token's (a lapsed
  one keeps the lock: keys are lost to a session's end, never to a silence); a thread of
  the holder's renews every hold of the token in one statement every ``renew_interval``.
  A session that is lost is never used again: the next hold draws a new token (a token's
  lock, once free, stays free, so a probe's answer is final).
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
from dataclasses import dataclass, field
from typing import cast

from ..backends.base import Backend
from ..backends.sessions import KeySession
from ..core.clock import Clock, RealClock
from ..core.config import validate_namespace
from ..core.decisions import LockNews, Proof, trust_end
from ..core.lease import Bid, Lease, trusted_until
from ..core.transitions import Lead
from ..errors import BackendUnavailableError, ConfigurationError
from .lock_thread import LockThread, lock_proof

__all__ = ["Held", "KeyHolder"]

log = logging.getLogger(__name__)


@dataclass
class _Session:
    """One incarnation of the holder: its token, and the lock thread that holds its lock."""

    token: str
    live: LockThread | None = None  # None: no lock (liveness off, or no grant)
    lost: bool = False
    granted: threading.Event = field(default_factory=threading.Event)  # or failed

    @property
    def proof(self) -> Proof:
        """What the lock proves (the lock thread's: a tagged hold's trust is bound by it)."""
        return lock_proof(self.live)


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
        self._sleeper = self._clock.sleeper()  # the renewer's
        self._lock = threading.Lock()  # guards _held and _current
        self._current: _Session | None = None
        self._held: dict[str, Held] = {}
        self._stop = threading.Event()
        # renews the holds, apart from the lock thread: a renewal that waits on the database
        # (row locks on MariaDB) must not hold up the pings, or the server ends the session
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
        result = self.backend.keys.hold(self._bid(inc, tagged, key))
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
        if not (seen.held and seen.liveness_us is not None and self._ended(inc, seen.token)):
            return None
        answered = self._clock.monotonic()  # that session ended before this instant
        need = seen.liveness_us / 1_000_000
        sleeper = self._clock.sleeper()
        while (waited := self._clock.monotonic() - answered) < need:
            sleeper.wait(need - waited)
        started = self._clock.monotonic()
        result = keys.take_over(self._bid(inc, tagged, key), seen, started - answered)
        return (result.lease, started) if result.won and result.lease is not None else None

    def _bid(self, inc: _Session, tagged: bool, key: str = "") -> Bid:
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
        if self._renewer is None or not self._renewer.is_alive():
            self._stop.clear()
            self._renewer = threading.Thread(
                target=self._renew_loop, name="celery-election-keys-renew", daemon=True
            )
            self._renewer.start()
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
        return inc.token if inc.live is not None else None

    def alive(self, token: str) -> bool:
        """Whether the process of liveness token ``token`` still lives (its session is on).

        True when this process cannot ask (no session of its own, or it failed): a caller
        that waits is late; one that takes over a live process's run runs it twice.
        """
        inc = self._current
        return inc is None or self._ended(inc, token) is not True

    def _ended(self, inc: _Session, token: str | None) -> bool | None:
        """Whether holder ``token``'s session ended, asked on ``inc``'s (None: it can't ask).

        Probes (a task's, from any thread or greenlet) and the lock thread's pings take
        turns: interleaved on one connection, they broke PyMySQL's protocol.
        """
        live = inc.live
        if live is None or inc.lost or token is None or token == inc.token:
            return None
        try:
            with live.session_lock:
                return cast("KeySession", live.session).ended(self.backend.keys.holder_key(token))
        except BackendUnavailableError as exc:  # ours is lost too: the next hold redraws
            log.warning("key holder session lost while probing another holder (%s)", exc)
            self._news(inc, LockNews.LOST)
            return None

    # -- the session ---------------------------------------------------------------------------

    def _incarnation(self) -> _Session:
        """The live incarnation, or a new one (new token, its lock granted first)."""
        old = self._current
        if old is not None and not old.lost:
            return old
        if old is not None and old.live is not None:
            old.live.close()  # lost: it asks for its lock no more (its proof stays)
        inc = self._current = _Session(uuid.uuid4().hex)
        if self.delta is None:
            return inc
        try:
            session = self.backend.keys.holder_session(inc.token, self.delta)
        except Exception as exc:
            log.warning("key holds are not bound by a session (%s): the lease alone", exc)
            return inc
        if session is not None:
            inc.live = LockThread(
                session, self.delta, 1.0, self._clock, lambda news: self._news(inc, news),
                "celery-election-keys", regrant=False,
            )  # fmt: skip
            inc.live.want(True)  # our own random token: nobody else asks for it, no wait
            inc.granted.wait(10.0)
            if not inc.proof.has_lock:
                log.warning("key holder session failed: untagged holds, the lease alone")
                inc.live.close()
                inc.live, inc.lost = None, False
        return inc

    def _news(self, inc: _Session, news: LockNews) -> None:
        """Anything but a grant or a good ping ends ``inc``'s lock: never asked for again."""
        if news not in (LockNews.GRANTED, LockNews.PINGED) and inc.live is not None:
            inc.lost = True  # the next hold draws a new token
            inc.live.want(False)
        inc.granted.set()

    def _renew_loop(self) -> None:
        """Every renew interval until stopped (``abandon`` stops it and wakes it at once)."""
        while not self._stop.is_set():
            if self._sleeper.wait(self.renew_interval) and self._stop.is_set():
                return
            try:
                self._renew()
            except Exception:  # never kill the thread; the lease still bounds trust
                log.exception("key holder renewal error; retrying")

    def _renew(self) -> None:
        """One statement per incarnation renews all its holds; each renewed one is trusted on."""
        with self._lock:
            incs = {id(h.incarnation): h.incarnation for h in self._held.values()}
        for inc in incs.values():
            started = self._clock.monotonic()
            renewed = self.backend.keys.renew(self._bid(inc, inc.proof.proven(started)))
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
        self._stop.set()
        self._sleeper.wake()
        with self._lock:
            self._held.clear()
            inc, self._current = self._current, None
        if inc is not None and inc.live is not None:
            inc.live.close()
        if self._renewer is not None and self._renewer is not threading.current_thread():
            self._renewer.join(5)

    def close(self) -> None:
        """Release every hold and the session (idempotent)."""
        with self._lock:
            holds = list(self._held.values())
        for held in holds:
            self.release(held)
        self.abandon()
