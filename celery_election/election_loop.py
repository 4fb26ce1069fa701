"""The election thread: follow until elected, lead until belief ends, resign once.

An ``ElectionLoop`` is made by ``Elector.start()`` with its collaborators, and run by
the thread it starts. Its state is its control flow (``run``): it follows until it holds
a term, leads (renews) until belief ends or a resign is due, resigns once, and follows
again. Its fields (the term held, the lease last read, the timers) are written only by
that thread; other threads reach it only through ``post`` (the lock thread's news, the
backend's wakeups, resign and stop requests). What it does next is decided by the pure
functions of decisions.py; belief itself is ``Belief``'s (belief.py), which this thread
begins, extends and ends like any other.
"""

from __future__ import annotations

import collections
import contextlib
import enum
import logging
import os
import random
import threading
import time
from collections.abc import Callable
from typing import Any

from . import decisions as rules
from .announce import Announcer
from .backends.base import Backend, Wakeup, WakeupHandle
from .belief import Belief
from .clock import Clock, Sleeper, boottime
from .config import ElectionConfig
from .decisions import Call, LockNews, Next, Proof
from .lease import ElectResult, Lease, trusted_until
from .lock_thread import LockThread
from .stats import ElectorStats
from .transitions import Backoff, Lead, RevokeReason

__all__ = ["Candidate", "ElectionLoop", "Request"]

log = logging.getLogger("celery_election.elector")

_NO_PROOF = Proof()


class Request(enum.Enum):
    """What a caller asks of the election thread."""

    RESIGN = "resign"
    STOP = "stop"


#: what other threads post to the election thread
Posted = Request | LockNews | Wakeup


class Candidate:
    """Who runs for the namespace: the names and the secret token of one elector run."""

    __slots__ = ("candidate_id", "hostname", "namespace", "register", "token")

    def __init__(
        self, namespace: str, candidate_id: str, hostname: str, token: str, register: bool
    ) -> None:
        self.namespace, self.candidate_id, self.hostname = namespace, candidate_id, hostname
        self.token, self.register = token, register


class ElectionLoop:
    """One run of an election thread (from ``Elector.start()`` to ``stop()``).

    ``before``: the previous run's loop, whose last lease and greatest term carry over
    (a term is never reused after a restart).
    """

    def __init__(
        self,
        config: ElectionConfig,
        backend: Backend,
        candidate: Candidate,
        *,
        clock: Clock,
        belief: Belief,
        announcer: Announcer,
        stats: ElectorStats,
        backoff: Backoff,
        live: LockThread | None = None,
        before: ElectionLoop | None = None,
    ) -> None:
        self.config, self.backend, self.candidate = config, backend, candidate
        self.namespace, self._token = candidate.namespace, candidate.token
        self._clock, self._belief, self._announcer = clock, belief, announcer
        self.stats, self._backoff = stats, backoff
        self._live = live  # the lock thread of this run (None: no lock)
        #: how long a vacancy waits for the lock's holder to elect before anyone may
        self._grace = config.liveness or 0.0
        self._inbox: collections.deque[Posted] = collections.deque()
        self._sleeper = clock.sleeper()
        self._wakeup: WakeupHandle | None = None
        #: set while no resign is pending (``Elector.resign(wait=True)`` waits on it)
        self.resigned = threading.Event()
        self.resigned.set()
        self._stopping = self._resign_requested = False
        # What was read; the greatest term and the last row outlive a restart.
        self._last_lease: Lease | None = None if before is None else before._last_lease
        self._greatest_term: int = 0 if before is None else before.greatest_term
        self._failures = 0
        self._term: int | None = None  # the term the row holds for our token
        # Timers (clock readings): a leader's next renewal; a follower's next look, the
        # latest a wakeup may push it to, since when the row is vacant, its back-off
        # after a resign; the heartbeat and the leader's pruning of dead candidates.
        self._next_renew = 0.0
        self._follow_until = 0.0
        self._look_by = 0.0
        self._vacant_since: float | None = None
        self._backoff_until = 0.0
        self._next_heartbeat = clock.monotonic()
        self._next_prune = 0.0

    # -- read by other threads (lock-free: each a single reference) -------------------------

    @property
    def term(self) -> int | None:
        """The term the row holds for this elector (believed or not)."""
        return self._term

    @property
    def last_lease(self) -> Lease | None:
        return self._last_lease

    @property
    def failures(self) -> int:
        return self._failures

    @property
    def greatest_term(self) -> int:
        """The greatest term seen: a floor for the next (kept across a restart)."""
        return self._greatest_term

    @property
    def wakeup(self) -> WakeupHandle | None:
        return self._wakeup

    @property
    def sleeper(self) -> Sleeper:
        """The election thread's wait (a test with a fake clock waits for it to be asleep)."""
        return self._sleeper

    def post(self, item: Posted) -> None:
        """Hand something to this thread; the only way other threads reach it."""
        if item is Request.RESIGN:
            self.resigned.clear()
        self._inbox.append(item)
        self._sleeper.wake()

    # -- the thread: its phases ---------------------------------------------------------------

    def run(self) -> None:
        if self._live is None:  # else the lock is the wake-up: no LISTEN connection
            self._subscribe()
        # what the database's set-up means for this election
        for line in self.backend.topology_warnings(lock_on=self.config.liveness is not None):
            log.warning("election in namespace %r: %s", self.namespace, line)
        while self._follow():
            self._lead()
            if self._stopping:
                break
            if self._resign_requested:
                self._resign()
        self.stats.busy_since = None
        self._shutdown()

    def _follow(self) -> bool:
        """Follow until a term is held (True), or until stopped (False)."""
        while self._tend():
            if self._resign_requested:  # nothing held: only the back-off and the lock
                self._resign()
                continue
            now = self._clock.monotonic()
            self._heartbeat_if_due(now)
            wait = self._look(now)
            if self._term is not None:
                return True
            self._idle(wait)
        return False

    def _lead(self) -> None:
        """Renew the term held until it is lost, a resign is due, or the loop stops."""
        while self._tend() and self._holding():
            now = self._clock.monotonic()
            self._heartbeat_if_due(now)
            wait = self._renew(now) if now >= self._next_renew else self._next_renew - now
            if not self._holding():
                return
            self._idle(wait)

    def _holding(self) -> bool:
        """A term is held and no resign of it is due: the leader's phase goes on."""
        return self._term is not None and not self._resign_requested

    def _tend(self) -> bool:
        """Act on what other threads posted; False once stopping."""
        self._drain()
        if self._stopping:
            return False
        self.stats.busy_since = boottime()  # the health probe's "wedged" clock
        return True

    def _idle(self, wait: float) -> None:
        """Wait ``wait`` seconds (less if a heartbeat is due or something is posted)."""
        if self.candidate.register:
            wait = min(wait, self._next_heartbeat - self._clock.monotonic())
        if rules.release_while_waiting(
            following=self._term is None, wait=wait, ttl=self.config.ttl
        ):
            self.backend.release_idle()  # a standby holds no lease connection while it waits
        self.stats.busy_since = None
        if wait > 0 and not self._inbox and not self._stopping:
            self._sleeper.wait(wait)

    def _drain(self) -> None:
        """Act on what other threads posted; each only changes what to do next."""
        while self._inbox:
            item = self._inbox.popleft()
            if item is Request.STOP:
                self._stopping = True
            elif item is Request.RESIGN:
                self._resign_requested = True
                self._backoff_until = self._clock.monotonic() + self.config.resign_backoff
            elif isinstance(item, LockNews):
                self._on_lock_news(item)
            elif isinstance(item, Wakeup):
                self._on_wakeup(item)

    def _on_lock_news(self, news: LockNews) -> None:
        if news is LockNews.UNSUPPORTED and self._wakeup is None:
            self._subscribe()  # no lock to wake us: wakeups (LISTEN) instead
        if self._term is not None:
            if rules.renew_now_after(news):
                self._next_renew = 0.0
        elif rules.look_now_after(news):
            self._follow_until = 0.0

    def _subscribe(self) -> None:
        self._wakeup = self.backend.subscribe_wakeups(self.namespace, self.post)

    def _on_wakeup(self, wakeup: Wakeup) -> None:
        """A hint from the backend. Only ever changes *when* we look."""
        self._follow_until = rules.look_after_wakeup(
            wakeup.kind,
            wakeup.term,
            self._last_lease,
            held=self._term,
            lock_on=self._live is not None,
            now=self._clock.monotonic(),
            look_at=self._follow_until,
            look_by=self._look_by,
            spread=random.random(),
        )

    def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """One backend call with the attempt deadline; errors are reported, then raised."""
        op = getattr(fn, "__name__", "call")
        began = time.perf_counter()
        try:
            result = fn(*args, timeout=self.config.call_timeout, **kwargs)
        except Exception as exc:
            self.stats.call(op, time.perf_counter() - began, False)
            self._failures += 1
            self._announcer.post(exc)
            raise
        self.stats.call(op, time.perf_counter() - began, True)
        if self._failures:
            log.info("election database reachable again (namespace %r)", self.namespace)
            self._announcer.recovered()
        self._failures = 0
        return result

    def _retry_delay(self) -> float:
        return self._backoff(max(1, self._failures))

    def _proof(self) -> Proof:
        live = self._live
        return _NO_PROOF if live is None else live.proof

    def _seen(self, now: float, proof: Proof | None = None) -> rules.Seen:
        """What a decision sees; ``proof``: the lock's, as read once for the whole step."""
        live = self._live
        if live is None or live.unsupported:
            return rules.Seen(now, self._last_lease, self._token, None, self._vacant_since)
        proof = live.proof if proof is None else proof
        cold = live.cold and not proof.has_lock
        return rules.Seen(
            now,
            self._last_lease,
            self._token,
            proof,
            self._vacant_since,
            cold,
            live.session.silent_holders_lose and live.waits_well,
        )

    def _read(self, lease: Lease | None, now: float, *, looked: bool = False) -> None:
        """Remember the row a step returned (a look's None: the namespace has no row)."""
        if lease is None:
            if looked and self._vacant_since is None:
                self._vacant_since = now
            return
        self._last_lease = lease
        self._greatest_term = max(self._greatest_term, lease.term)
        if lease.held:
            self._vacant_since = None
        elif self._vacant_since is None:
            self._vacant_since = now

    def _tag(self, proof: Proof) -> float | None:
        """The delta a step tags its term with: only while the lock is held."""
        return self._live.delta if self._live is not None and proof.has_lock else None

    def _want_lock(self, wanted: bool) -> None:
        """Ask the lock thread for the lock, or to give it back."""
        if self._live is not None:
            self._live.want(wanted)

    # -- following ------------------------------------------------------------------------------

    def _look(self, now: float) -> float:
        """A follower's turn: look if it is time, then decide how long to wait."""
        if now < self._backoff_until:
            self._want_lock(False)
            return self._backoff_until - now
        if now < self._follow_until:
            return self._follow_until - now
        # One reading of the lock's proof decides the call and tags it: read twice, a
        # grant lost in between chose a take-over and then sent it untagged (a chaos run).
        proof = self._proof()
        call, waited = rules.follower_call(self._seen(now, proof), self._grace)
        tag = self._tag(proof)
        c = self.candidate
        args = (self.namespace, self._token, c.candidate_id, self.config.ttl)
        # never below a term seen before, nor this host's clock (a promoted standby's
        # clock may be behind the primary that issued a term it never received)
        floor = max(self._greatest_term + 1, self._clock.wall_us())
        try:
            if call is Call.TAKE_OVER:
                seen = self._last_lease
                result = self._call(
                    self.backend.take_over, *args, seen, waited, liveness=tag, floor=floor
                )
            elif call is Call.ELECT:
                result = self._call(self.backend.elect, *args, liveness=tag, floor=floor)
            else:
                result = ElectResult(False, self._call(self.backend.current, self.namespace))
        except Exception:
            return self._retry_delay()
        lease = result.lease
        self._read(lease, now, looked=call is Call.LOOK)
        lead = None
        if lease is not None:
            lease_until = trusted_until(now, self.config.ttl, self.config.safety_margin)
            lead = Lead(lease.term, lease_until, proof.grant if tag is not None else None)
        in_time = lead is not None and self._clock.monotonic() < rules.trust_end(lead, proof)
        step = rules.after_elect(result, self._token, in_time=in_time)
        if step is Next.LEAD or step is Next.GIVE_UP:
            assert lead is not None
            self._term = lead.term
            self._want_lock(True)  # a leader holds the lock: its grant tags the term
            return self._won(lead, now) if step is Next.LEAD else self._late(lead.term)
        if step is Next.RENEW:  # still ours from a term we had given up on
            assert lease is not None
            self._term, self._next_renew = lease.term, 0.0
            return 0.0
        return self._plan_follow(self._clock.monotonic())

    def _won(self, lead: Lead, started: float) -> float:
        if not self._belief.begin(lead):
            return 0.0  # resigned or stopping meanwhile: the loop resigns this term
        self._next_renew = started + self._jittered(self.config.renew_interval, up=False)
        return self._next_renew - self._clock.monotonic()

    def _late(self, term: int) -> float:
        log.warning(
            "election in namespace %r won term %s after its trust window ended (slow "
            "database?); resigning it",
            self.namespace,
            term,
        )
        self._resign_requested = True
        return 0.0

    def _plan_follow(self, now: float) -> float:
        healthy = self._wakeup is not None and self._wakeup.healthy
        plan = rules.follower_wait(
            self._seen(now), self.config, healthy=healthy, grace=self._grace, spread=random.random()
        )
        self._want_lock(plan.want_lock)
        self._follow_until = now + plan.wait
        self._look_by = now + plan.look_by
        return plan.wait

    # -- leading ---------------------------------------------------------------------------------

    def _renew(self, started: float) -> float:
        """Renew the term held; the wait until the next step."""
        term = self._term
        assert term is not None
        belief = self._belief
        lead = belief.trusted()
        if self._live is not None and lead is not None:
            self._want_lock(True)  # a leader holds the lock (if it can: tagged from then on)
        proof = self._proof()
        tag = self._tag(proof)
        if tag is not None and lead is not None and not lead.tagged:
            # Belief tightens before the row says so, and loosens only after.
            belief.extend(Lead(term, lead.lease_until, proof.grant))
        try:
            result = self._call(
                self.backend.renew, self.namespace, self._token, term, self.config.ttl,
                liveness=tag,
            )  # fmt: skip
        except Exception:
            return self._retry(self._retry_delay())
        self._read(result.lease, started)
        step = rules.after_renew(result, term, self._token, in_time=belief.trusted() is not None)
        if step is Next.LEAD:
            lease_until = trusted_until(started, self.config.ttl, self.config.safety_margin)
            belief.extend(Lead(term, lease_until, proof.grant if tag is not None else None))
            self._next_renew = started + self._jittered(self.config.renew_interval, up=False)
            return self._next_renew - self._clock.monotonic()
        if step is Next.RETRY:  # lost to contention, nothing known: retry while trusted
            return self._retry(self.config.poll_interval)
        if step is Next.GIVE_UP:
            return self._give_up(RevokeReason.EXPIRED)
        self._term = None
        self._drop(RevokeReason.LOST)
        return self._plan_follow(self._clock.monotonic())

    def _retry(self, delay: float) -> float:
        """Renew again soon, while trusted (else give up)."""
        lead = self._belief.trusted()
        if lead is None:
            return self._give_up(RevokeReason.EXPIRED)
        self._next_renew = 0.0
        left = self._belief.trust_end(lead) - self._clock.monotonic()
        return rules.renew_retry_wait(left, delay)

    def _drop(self, reason: RevokeReason) -> None:
        """Stop believing (if it still does) and let the lock go to a follower now."""
        self._belief.end(reason)
        if reason in (RevokeReason.EXPIRED, RevokeReason.LOST):
            # A resign or stop releases the lock after the resign instead, so the row is
            # vacant when a follower is granted it.
            self._want_lock(False)

    def _give_up(self, reason: RevokeReason) -> float:
        """Stop believing and resign the term so the next one is fresh."""
        self._drop(reason)
        self._resign_requested = True
        return 0.0

    # -- resigning and the end ----------------------------------------------------------------

    def _resign(self) -> None:
        """Resign the term held (if any), once; the lock goes after it."""
        term = self._term
        self._belief.end(RevokeReason.RESIGNED)  # already ended by whoever asked, if any
        if term is not None:
            try:
                self._call(self.backend.resign, self.namespace, self._token, term)
            except Exception:
                log.debug("resign of term %s failed; it will expire", term, exc_info=True)
        self._want_lock(False)  # after the resign: a granted follower finds it vacant
        self._term = None
        self._resign_requested = False
        self.resigned.set()

    def _heartbeat_if_due(self, now: float) -> None:
        if not self.candidate.register:
            return
        following = self._term is None and now >= self._backoff_until
        beat, look = rules.heartbeat_now(
            now,
            self._next_heartbeat,
            following=following,
            look_at=self._follow_until,
            interval=self.config.heartbeat_interval,
        )
        if beat:
            if look:
                self._follow_until = now  # the look goes with it, on one connection
            self._heartbeat()
            self._next_heartbeat = now + self._jittered(self.config.heartbeat_interval)

    def _heartbeat(self) -> None:
        c = self.candidate
        try:
            self._call(
                self.backend.register,
                self.namespace,
                self._token,
                c.candidate_id,
                c.hostname,
                os.getpid(),
                self.config.candidate_ttl,
            )
            now = self._clock.monotonic()
            if self._belief.trusted() is not None and now >= self._next_prune:
                # Dead candidates' rows: the leader clears them, once per candidate_ttl.
                self._next_prune = now + self.config.candidate_ttl
                self._call(self.backend.prune, self.namespace)
        except Exception:
            pass  # reported; the election goes on without it

    def _shutdown(self) -> None:
        self._resign()
        if self._live is not None:
            try:
                self._live.close()
            except Exception:  # the session ends with this process anyway
                log.exception("closing the liveness session failed")
        if self.candidate.register:
            with contextlib.suppress(Exception):  # reported by _call
                self._call(self.backend.unregister, self.namespace, self._token)
        with self._belief.changed:
            self._belief.changed.notify_all()
        self._announcer.wake()

    def _jittered(self, seconds: float, *, up: bool = True) -> float:
        """``seconds`` stretched or shrunk by up to the jitter fraction (only shrunk if not up)."""
        j = self.config.jitter
        return seconds * (1 + random.uniform(-j, j if up else 0))
