"""The election thread: follow until elected, lead until belief ends, resign once.

An ``ElectionLoop`` is made by ``Elector.start()`` with its collaborators, and run by
the thread it starts. Its state is its control flow (``run``), two phases that hand each
other a small value, as riverqueue's elector does: ``_follow`` looks until it holds a
term and hands the leader's phase when to renew first; ``_lead`` renews until belief
ends or a resign is due, resigns once, and hands the follower's phase its timers
(``Following``). Each phase's timers are its own: a follower's next look and back-off
travel in ``Following``, a leader's next renewal is a local of ``_lead``. The fields
other threads read (the term held, the lease last read, the failures) are written only
by this thread; other threads reach it only through ``post`` (the lock thread's news,
the backend's wakeups, resign and stop requests), and only ``_tend`` reads what they
posted. What it does next is decided by the pure functions of decisions.py; belief
itself is ``Belief``'s (belief.py), which this thread begins, extends and ends like any
other.
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
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

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

__all__ = ["Candidate", "ElectionLoop", "Following", "Request"]

log = logging.getLogger("celery_election.elector")

_NO_PROOF = Proof()


class Request(enum.Enum):
    """What a caller asks of the election thread."""

    RESIGN = "resign"
    STOP = "stop"


#: what other threads post to the election thread
Posted = Request | LockNews | Wakeup
#: what the phases act on (a stop ends them before they see anything)
News = Request | LockNews | Wakeup


class Candidate:
    """Who runs for the namespace: the names and the secret token of one elector run."""

    __slots__ = ("candidate_id", "hostname", "namespace", "register", "token")

    def __init__(
        self, namespace: str, candidate_id: str, hostname: str, token: str, register: bool
    ) -> None:
        self.namespace, self.candidate_id, self.hostname = namespace, candidate_id, hostname
        self.token, self.register = token, register


@dataclass(frozen=True)
class Following:
    """A follower's timers (clock readings), handed from one turn to the next.

    ``look_at``: its next look (0: now); ``look_by``: the latest a wakeup may push that
    look back to; ``vacant_since``: since when every read of the row found it vacant
    (None: not vacant); ``backoff_until``: after a resign, no look before this.
    """

    look_at: float = 0.0
    look_by: float = 0.0
    vacant_since: float | None = None
    backoff_until: float = 0.0


class Turn(NamedTuple):
    """What a follower's look leads to: its timers and its wait, or a term to lead."""

    following: Following
    wait: float
    #: a term is held: the leader's phase renews it first at this clock reading
    renew_at: float | None = None


class Renewed(NamedTuple):
    """A leader's renewal that kept the term: when to renew next, and the wait until then."""

    renew_at: float
    wait: float


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
        self._clock, self._belief, self._announcer = clock, belief, announcer
        self.stats, self._backoff = stats, backoff
        self._live = live  # the lock thread of this run (None: no lock)
        self._inbox: collections.deque[Posted] = collections.deque()
        self._sleeper = clock.sleeper()
        self._wakeup: WakeupHandle | None = None
        #: set while no resign is pending (``Elector.resign(wait=True)`` waits on it)
        self.resigned = threading.Event()
        self.resigned.set()
        # What was read; the greatest term and the last row outlive a restart.
        self._last_lease: Lease | None = None if before is None else before._last_lease
        self._greatest_term: int = 0 if before is None else before.greatest_term
        self._failures = 0
        self._term: int | None = None  # the term the row holds for our token
        # The candidate's own timers, in both phases: the heartbeat, and the leader's
        # pruning of dead candidates.
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
            log.warning("election in namespace %r: %s", self.candidate.namespace, line)
        following: Following | None = Following()
        while following is not None:
            renew_at = self._follow(following)
            following = None if renew_at is None else self._lead(renew_at)
        self.stats.busy_since = None
        self._shutdown()

    def _follow(self, following: Following) -> float | None:
        """Follow until a term is held: when to renew it first (None: stopping)."""
        while (news := self._tend()) is not None:
            for item in news:
                following = self._follower_news(item, following)
            now = self._clock.monotonic()
            backing_off = now < following.backoff_until
            if self._heartbeat_if_due(now, None if backing_off else following.look_at):
                following = replace(following, look_at=now)  # the look goes with it
            if backing_off:
                self._want_lock(False)
                wait = following.backoff_until - now
            elif now < following.look_at:
                wait = following.look_at - now
            else:
                turn = self._look(now, following)
                if turn.renew_at is not None:
                    return turn.renew_at
                following, wait = turn.following, turn.wait
            self._idle(wait)
        return None

    def _lead(self, renew_at: float) -> Following | None:
        """Renew the term held until it is lost or resigned: the follower's timers then.

        None once stopping (the shutdown resigns the term).
        """
        while (news := self._tend()) is not None:
            for item in news:
                if item is Request.RESIGN:
                    return self._resign(backoff=True)
                if isinstance(item, LockNews):
                    self._on_lock_news(item)
                    if rules.renew_now_after(item):
                        renew_at = 0.0
                # a wakeup changes nothing for a leader: it renews on its own clock
            now = self._clock.monotonic()
            self._heartbeat_if_due(now, None)
            if now < renew_at:
                self._idle(renew_at - now)
                continue
            renewed = self._renew(now)
            if isinstance(renewed, Following):
                return renewed
            renew_at = renewed.renew_at
            self._idle(renewed.wait)
        return None

    def _tend(self) -> list[News] | None:
        """What other threads posted since the last look, in order; None once stopping.

        The one reader of the inbox: a stop ends the phase at once, the rest is the
        phase's to act on (a resign, the lock's news, the backend's wakeups).
        """
        news: list[News] = []
        while self._inbox:
            item = self._inbox.popleft()
            if item is Request.STOP:
                return None
            news.append(item)
        self.stats.busy_since = boottime()  # the health probe's "wedged" clock
        return news

    def _idle(self, wait: float) -> None:
        """Wait ``wait`` seconds (less if a heartbeat is due or something is posted)."""
        if self.candidate.register:
            wait = min(wait, self._next_heartbeat - self._clock.monotonic())
        if rules.release_while_waiting(
            following=self._term is None, wait=wait, ttl=self.config.ttl
        ):
            self.backend.release_idle()  # a standby holds no lease connection while it waits
        self.stats.busy_since = None
        if wait > 0 and not self._inbox:
            self._sleeper.wait(wait)

    def _follower_news(self, item: News, following: Following) -> Following:
        """A follower's timers after ``item``; each only changes what to do next."""
        if item is Request.RESIGN:
            # nothing held: only the back-off, the belief and the lock
            return replace(following, backoff_until=self._resign(backoff=True).backoff_until)
        if isinstance(item, LockNews):
            self._on_lock_news(item)
            if rules.look_now_after(item):
                return replace(following, look_at=0.0)
        elif isinstance(item, Wakeup):
            return self._on_wakeup(item, following)
        return following

    def _on_lock_news(self, news: LockNews) -> None:
        if news is LockNews.UNSUPPORTED and self._wakeup is None:
            self._subscribe()  # no lock to wake us: wakeups (LISTEN) instead

    def _subscribe(self) -> None:
        self._wakeup = self.backend.subscribe_wakeups(self.candidate.namespace, self.post)

    def _on_wakeup(self, wakeup: Wakeup, following: Following) -> Following:
        """A hint from the backend. Only ever changes *when* we look."""
        look_at = rules.look_after_wakeup(
            wakeup.kind,
            wakeup.term,
            self._last_lease,
            held=self._term,
            lock_on=self._live is not None,
            now=self._clock.monotonic(),
            look_at=following.look_at,
            look_by=following.look_by,
            spread=random.random(),
        )
        return replace(following, look_at=look_at)

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
            log.info("election database reachable again (namespace %r)", self.candidate.namespace)
            self._announcer.recovered()
        self._failures = 0
        return result

    def _retry_delay(self) -> float:
        return self._backoff(max(1, self._failures))

    @property
    def _grace(self) -> float:
        """How long a vacancy waits for the lock's holder to elect before anyone may."""
        return self.config.liveness or 0.0

    def _proof(self) -> Proof:
        live = self._live
        return _NO_PROOF if live is None else live.proof

    def _seen(
        self, now: float, vacant_since: float | None, proof: Proof | None = None
    ) -> rules.Seen:
        """What a decision sees; ``proof``: the lock's, as read once for the whole step."""
        live, token = self._live, self.candidate.token
        if live is None or live.unsupported:
            return rules.Seen(now, self._last_lease, token, None, vacant_since)
        proof = live.proof if proof is None else proof
        cold = live.cold and not proof.has_lock
        return rules.Seen(
            now,
            self._last_lease,
            token,
            proof,
            vacant_since,
            cold,
            live.session.silent_holders_lose and live.waits_well,
        )

    def _read(self, lease: Lease | None) -> None:
        """Remember the row a step returned (None: nothing read)."""
        if lease is not None:
            self._last_lease = lease
            self._greatest_term = max(self._greatest_term, lease.term)

    def _tag(self, proof: Proof) -> float | None:
        """The delta a step tags its term with: only while the lock is held."""
        return self._live.delta if self._live is not None and proof.has_lock else None

    def _want_lock(self, wanted: bool) -> None:
        """Ask the lock thread for the lock, or to give it back."""
        if self._live is not None:
            self._live.want(wanted)

    # -- following ------------------------------------------------------------------------------

    def _look(self, now: float, following: Following) -> Turn:
        """A follower's look: elect, take over or read the row, then plan the next turn."""
        # One reading of the lock's proof decides the call and tags it: read twice, a
        # grant lost in between chose a take-over and then sent it untagged (a chaos run).
        proof = self._proof()
        call, waited = rules.follower_call(
            self._seen(now, following.vacant_since, proof), self._grace
        )
        tag = self._tag(proof)
        c = self.candidate
        args = (c.namespace, c.token, c.candidate_id, self.config.ttl)
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
                result = ElectResult(False, self._call(self.backend.current, c.namespace))
        except Exception:
            return Turn(following, self._retry_delay())
        lease = result.lease
        self._read(lease)
        vacant_since = rules.vacancy(following.vacant_since, lease, now, looked=call is Call.LOOK)
        lead = None
        if lease is not None:
            lease_until = trusted_until(now, self.config.ttl, self.config.safety_margin)
            lead = Lead(lease.term, lease_until, proof.grant if tag is not None else None)
        in_time = lead is not None and self._clock.monotonic() < rules.trust_end(lead, proof)
        step = rules.after_elect(result, c.token, in_time=in_time)
        if step is Next.LEAD or step is Next.GIVE_UP:
            assert lead is not None
            self._term = lead.term
            self._want_lock(True)  # a leader holds the lock: its grant tags the term
            if step is Next.GIVE_UP:
                return Turn(self._late(lead.term), 0.0)
            return Turn(following, 0.0, self._won(lead, now))
        if step is Next.RENEW:  # still ours from a term we had given up on
            assert lease is not None
            self._term = lease.term
            return Turn(following, 0.0, 0.0)
        planned = self._plan_follow(self._clock.monotonic(), vacant_since)
        return Turn(planned, planned.look_at - self._clock.monotonic())

    def _won(self, lead: Lead, started: float) -> float:
        """Believe the term won: when to renew it first (at once if belief was refused)."""
        if not self._belief.begin(lead):
            return 0.0  # resigned or stopping meanwhile: the posted request resigns it
        return started + self._jittered(self.config.renew_interval, up=False)

    def _late(self, term: int) -> Following:
        log.warning(
            "election in namespace %r won term %s after its trust window ended (slow "
            "database?); resigning it",
            self.candidate.namespace,
            term,
        )
        return self._resign()

    def _plan_follow(self, now: float, vacant_since: float | None) -> Following:
        """The follower's next turn after a look (or a lost term), from ``now``."""
        healthy = self._wakeup is not None and self._wakeup.healthy
        plan = rules.follower_wait(
            self._seen(now, vacant_since),
            self.config,
            healthy=healthy,
            grace=self._grace,
            spread=random.random(),
        )
        self._want_lock(plan.want_lock)
        return Following(now + plan.wait, now + plan.look_by, vacant_since)

    # -- leading ---------------------------------------------------------------------------------

    def _renew(self, started: float) -> Renewed | Following:
        """Renew the term held: when to renew next, or the follower's timers once it ended."""
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
        c = self.candidate
        try:
            result = self._call(
                self.backend.renew, c.namespace, c.token, term, self.config.ttl, liveness=tag
            )
        except Exception:
            return self._retry(self._retry_delay())
        self._read(result.lease)
        step = rules.after_renew(result, term, c.token, in_time=belief.trusted() is not None)
        if step is Next.LEAD:
            lease_until = trusted_until(started, self.config.ttl, self.config.safety_margin)
            belief.extend(Lead(term, lease_until, proof.grant if tag is not None else None))
            renew_at = started + self._jittered(self.config.renew_interval, up=False)
            return Renewed(renew_at, renew_at - self._clock.monotonic())
        if step is Next.RETRY:  # lost to contention, nothing known: retry while trusted
            return self._retry(self.config.poll_interval)
        if step is Next.GIVE_UP:
            return self._give_up(RevokeReason.EXPIRED)
        self._term = None
        self._drop(RevokeReason.LOST)
        vacant_since = rules.vacancy(None, result.lease, started)
        return self._plan_follow(self._clock.monotonic(), vacant_since)

    def _retry(self, delay: float) -> Renewed | Following:
        """Renew again soon, while trusted (else give up)."""
        lead = self._belief.trusted()
        if lead is None:
            return self._give_up(RevokeReason.EXPIRED)
        left = self._belief.trust_end(lead) - self._clock.monotonic()
        return Renewed(0.0, rules.renew_retry_wait(left, delay))

    def _drop(self, reason: RevokeReason) -> None:
        """Stop believing (if it still does) and let the lock go to a follower now."""
        self._belief.end(reason)
        if reason in (RevokeReason.EXPIRED, RevokeReason.LOST):
            # A resign or stop releases the lock after the resign instead, so the row is
            # vacant when a follower is granted it.
            self._want_lock(False)

    def _give_up(self, reason: RevokeReason) -> Following:
        """Stop believing and resign the term so the next one is fresh."""
        self._drop(reason)
        return self._resign()

    # -- resigning and the end ----------------------------------------------------------------

    def _resign(self, *, backoff: bool = False) -> Following:
        """Resign the term held (if any), once; the lock goes after it.

        The follower's timers after it: it looks at once, or (``backoff``: asked to
        resign) after ``resign_backoff``.
        """
        term = self._term
        self._belief.end(RevokeReason.RESIGNED)  # already ended by whoever asked, if any
        until = self._clock.monotonic() + self.config.resign_backoff if backoff else 0.0
        if term is not None:
            try:
                c = self.candidate
                self._call(self.backend.resign, c.namespace, c.token, term)
            except Exception:
                log.debug("resign of term %s failed; it will expire", term, exc_info=True)
        self._want_lock(False)  # after the resign: a granted follower finds it vacant
        self._term = None
        self.resigned.set()
        return Following(backoff_until=until)

    def _heartbeat_if_due(self, now: float, look_at: float | None) -> bool:
        """Heartbeat if due; whether a follower's look (``look_at``) comes forward with it.

        ``look_at`` None: not looking (a leader, or a follower backing off).
        """
        if not self.candidate.register:
            return False
        beat, look = rules.heartbeat_now(
            now,
            self._next_heartbeat,
            following=look_at is not None,
            look_at=0.0 if look_at is None else look_at,
            interval=self.config.heartbeat_interval,
        )
        if beat:
            self._heartbeat()
            self._next_heartbeat = now + self._jittered(self.config.heartbeat_interval)
        return beat and look

    def _heartbeat(self) -> None:
        c = self.candidate
        try:
            self._call(
                self.backend.register,
                c.namespace,
                c.token,
                c.candidate_id,
                c.hostname,
                os.getpid(),
                self.config.candidate_ttl,
            )
            now = self._clock.monotonic()
            if self._belief.trusted() is not None and now >= self._next_prune:
                # Dead candidates' rows: the leader clears them, once per candidate_ttl.
                self._next_prune = now + self.config.candidate_ttl
                self._call(self.backend.prune, c.namespace)
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
                c = self.candidate
                self._call(self.backend.unregister, c.namespace, c.token)
        with self._belief.changed:
            self._belief.changed.notify_all()
        self._announcer.wake()

    def _jittered(self, seconds: float, *, up: bool = True) -> float:
        """``seconds`` stretched or shrunk by up to the jitter fraction (only shrunk if not up)."""
        j = self.config.jitter
        return seconds * (1 + random.uniform(-j, j if up else 0))
