"""The election thread: follow until elected, lead until belief ends, resign once.

An ``ElectionLoop`` is made by ``Elector.start()`` with its collaborators, and run by
the thread it starts. Its state is its control flow (``run``): it follows until it holds
a term, leads (renews) until belief ends or a resign is due, resigns once, and follows
again. Each phase keeps its timers in a value it is handed (election/steps.py); the
fields (the term held, the row as read) are written only by that thread; other threads
reach it only through ``post`` (the lock thread's news, the backend's wakeups, resign
and stop requests). What it does next is decided by the pure functions of
core/decisions.py; belief itself is ``Belief``'s (election/belief.py), which this thread
begins, extends and ends like any other.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import random
import threading

from ..backends.base import Backend, Wakeup, WakeupHandle
from ..core import decisions as rules
from ..core.clock import Clock, Sleeper, boottime
from ..core.config import ElectionConfig
from ..core.decisions import Call, LockNews, Next, Proof
from ..core.lease import Bid, ElectResult, Lease, trusted_until, vacancy
from ..core.stats import ElectorStats
from ..core.transfer import Transfer
from ..core.transitions import Backoff, Lead, RevokeReason
from . import steps
from .announce import Announcer
from .belief import Belief
from .lock_thread import LockThread, lock_proof
from .steps import BackendCalls, Candidate, Following, Leading, Reading, Request

__all__ = ["Candidate", "ElectionLoop", "Request"]

log = logging.getLogger("celery_election.election.elector")


#: what other threads post to the election thread
Posted = Request | LockNews | Wakeup | Transfer
#: what the phase in progress hears of it: hints about when to act next
Hint = LockNews | Wakeup


class ElectionLoop:
    """One run of an election thread (from ``Elector.start()`` to ``stop()``).

    ``before``: the previous run's loop, whose ``Reading`` carries over (see there).
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
        self._clock, self._belief, self.stats = clock, belief, stats
        self._calls = BackendCalls(config, candidate.namespace, stats, announcer, backoff)
        self._live = live  # the lock thread of this run (None: no lock)
        self._inbox: collections.deque[Posted] = collections.deque()
        self._sleeper = clock.sleeper()
        self._wakeup: WakeupHandle | None = None
        #: set while no resign is pending (``Elector.resign(wait=True)`` waits on it)
        self.resigned = threading.Event()
        self.resigned.set()
        self._stopping = False
        #: a resign is due: the back-off it ends with (0.0: none); None: none due
        self._resign_due: float | None = None
        self._reading: Reading = Reading(None if before is None else before._reading)
        self._term: int | None = None  # the term the row holds for our token
        self._transfer_due: Transfer | None = None  # a hand-over asked for, to make next
        self._back = steps.HoldingBack()  # leaving a vacancy to a newer release
        # The heartbeat's timers, kept across the phases: both the follower and the
        # leader heartbeat, and the leader prunes dead candidates.
        self._next_heartbeat = clock.monotonic()
        self._next_prune = 0.0

    # -- read by other threads (lock-free: each a single reference) -------------------------

    @property
    def namespace(self) -> str:
        return self.candidate.namespace

    @property
    def term(self) -> int | None:
        """The term the row holds for this elector (believed or not)."""
        return self._term

    @property
    def last_lease(self) -> Lease | None:
        return self._reading.last_lease

    @property
    def failures(self) -> int:
        return self._calls.failures

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
        following = Following()
        while (renew_at := self._follow(following)) is not None:
            following = self._lead(Leading(renew_at))
            if self._stopping:
                break
            if self._resign_due is not None:
                self._resign(following)
            elif self._transfer_due is not None:
                self._transfer(self._transfer_due)
        self.stats.busy_since = None
        self._shutdown()

    def _follow(self, f: Following) -> float | None:
        """Follow until a term is held (its first renewal time), or until stopped (None)."""
        while (hints := self._tend()) is not None:
            for hint in hints:
                self._hint_follower(f, hint)
            if self._resign_due is not None:  # nothing held: only the back-off and the lock
                self._resign(f)
                continue
            now = self._clock.monotonic()
            self._heartbeat_if_due(now, f)
            wait = self._look(now, f)
            if self._term is not None:
                return f.renew_at
            self._idle(wait)
        return None

    def _lead(self, lead: Leading) -> Following:
        """Renew the term held until it is lost, a resign is due, or the loop stops.

        Returns the timers following starts with (planned, if the term was lost).
        """
        while (hints := self._tend()) is not None and self._holding():
            if any(isinstance(h, LockNews) and rules.renew_now_after(h) for h in hints):
                lead.renew_at = 0.0
            now = self._clock.monotonic()
            self._heartbeat_if_due(now, None)
            wait = self._renew(now, lead) if now >= lead.renew_at else lead.renew_at - now
            if not self._holding():
                break
            self._idle(wait)
        return lead.after

    def _holding(self) -> bool:
        """A term is held and no resign of it is due: the leader's phase goes on."""
        return self._term is not None and self._resign_due is None and self._transfer_due is None

    def _tend(self) -> list[Hint] | None:
        """Act on what other threads posted; the hints for the phase (None: stopping)."""
        hints = self._drain()
        if self._stopping:
            return None
        self.stats.busy_since = boottime()  # the health probe's "wedged" clock
        return hints

    def _idle(self, wait: float) -> None:
        """Wait ``wait`` seconds (less if a heartbeat is due or something is posted)."""
        if self.candidate.register:
            wait = min(wait, self._next_heartbeat - self._clock.monotonic())
        following = self._term is None
        if rules.release_while_waiting(following=following, wait=wait, ttl=self.config.ttl):
            with contextlib.suppress(Exception):  # an economy: a failure must not end the thread
                self.backend.release_idle()  # a standby holds no lease connection while it waits
        self.stats.busy_since = None
        if wait > 0 and not self._inbox and not self._stopping:
            self._sleeper.wait(wait)

    def _drain(self) -> list[Hint]:
        """Act on requests posted; the lock's news and the wakeups go to the phase."""
        hints: list[Hint] = []
        while self._inbox:
            item = self._inbox.popleft()
            if item is Request.STOP:
                self._stopping = True
            elif item is Request.RESIGN:
                self._request_resign(self._clock.monotonic() + self.config.resign_backoff)
            elif isinstance(item, Transfer):
                if self._term is None or self._transfer_due is not None:
                    item.finish(None)  # nothing held to hand over, or one under way
                else:
                    self._transfer_due = item
            elif isinstance(item, LockNews | Wakeup):
                if item is LockNews.UNSUPPORTED and self._wakeup is None:
                    self._subscribe()  # no lock to wake us: wakeups (LISTEN) instead
                hints.append(item)
        return hints

    def _request_resign(self, backoff_until: float) -> None:
        """Resign at the next turn, and stay out until ``backoff_until`` (the later one)."""
        self._resign_due = max(self._resign_due or 0.0, backoff_until)

    def _hint_follower(self, f: Following, hint: Hint) -> None:
        """A hint only ever changes *when* a follower looks next."""
        if isinstance(hint, LockNews):
            if rules.look_now_after(hint):
                f.look_at = 0.0
            return
        f.look_at = rules.look_after_wakeup(
            hint.kind,
            hint.term,
            self._reading.last_lease,
            held=self._term,
            lock_on=self._live is not None,
            now=self._clock.monotonic(),
            look_at=f.look_at,
            look_by=f.look_by,
            spread=random.random(),
        )

    def _subscribe(self) -> None:
        self._wakeup = self.backend.subscribe_wakeups(self.namespace, self.post)

    def _seen(
        self, now: float, proof: Proof | None = None, *, held_back: bool = False
    ) -> rules.Seen:
        """What a decision sees; ``proof``: the lock's, as read once for the whole step."""
        live, reading, token = self._live, self._reading, self.candidate.token
        eligible = self.candidate.eligible and not held_back
        if live is None or live.unsupported:
            lease, since = reading.last_lease, reading.vacant_since
            return rules.Seen(now, lease, token, None, since, eligible=eligible)
        proof = live.proof if proof is None else proof
        cold = live.cold and not proof.has_lock
        return rules.Seen(
            now,
            reading.last_lease,
            token,
            proof,
            reading.vacant_since,
            cold,
            live.session.silent_holders_lose and live.waits_well,
            eligible,
        )

    def _tag(self, proof: Proof) -> float | None:
        """The delta a step tags its term with: only while the lock is held."""
        return self._live.delta if self._live is not None and proof.has_lock else None

    def _lead_of(self, term: int, started: float, proof: Proof, tag: float | None) -> Lead:
        """What a step started at ``started`` won: a tagged one is bound by the grant it sent."""
        until = trusted_until(started, self.config.ttl, self.config.safety_margin)
        return Lead(term, until, proof.grant if tag is not None else None)

    def _want_lock(self, wanted: bool) -> None:
        """Ask the lock thread for the lock, or to give it back."""
        if self._live is not None:
            self._live.want(wanted)

    # -- following ------------------------------------------------------------------------------

    def _look(self, now: float, f: Following) -> float:
        """A follower's turn: look if it is time, then decide how long to wait."""
        if now < f.backoff_until:
            self._want_lock(False)
            return f.backoff_until - now
        if now < f.look_at:
            return f.look_at - now
        # One reading of the lock's proof decides the call and tags it: read twice, a
        # grant lost in between chose a take-over and then sent it untagged (a chaos run).
        proof = lock_proof(self._live)
        # how long a vacancy waits for the lock's holder to elect before anyone may
        grace = self.config.liveness or 0.0
        call, waited = rules.follower_call(self._seen(now, proof), grace)
        if call is not Call.LOOK and self._hold_back(now):
            call, waited = Call.LOOK, 0.0
        tag = self._tag(proof)
        c, reading = self.candidate, self._reading
        # never below a term seen before, nor this host's clock (a promoted standby's
        # clock may be behind the primary that issued a term it never received)
        floor = max(reading.greatest_term + 1, self._clock.wall_us())
        bid = Bid(self.namespace, c.token, c.candidate_id, self.config.ttl, "", tag, floor)
        try:
            if call is Call.TAKE_OVER:
                result = self._calls(self.backend.take_over, bid, reading.last_lease, waited)
            elif call is Call.ELECT:
                result = self._calls(self.backend.elect, bid)
            else:
                result = ElectResult(False, self._calls(self.backend.current, self.namespace))
        except Exception:
            return self._calls.retry_delay()
        lease, before = result.lease, reading.last_lease
        reading.read(lease, now, looked=call is Call.LOOK)
        if lease is not None and lease.held:  # a leader again: the vacancy is over
            self._back = steps.HoldingBack()
        lead = None if lease is None else self._lead_of(lease.term, now, proof, tag)
        in_time = lead is not None and self._clock.monotonic() < rules.trust_end(lead, proof)
        step = rules.after_elect(result, c.token, in_time=in_time, had=reading.had)
        if step is Next.ACCEPT:  # handed to us: believed only once renewed
            assert lease is not None
            return self._accept(lease.term, proof, tag, f)
        if step is Next.LEAD or step is Next.GIVE_UP:
            assert lead is not None
            self._term = reading.had = lead.term
            self._want_lock(True)  # a leader holds the lock: its grant tags the term
            if step is Next.GIVE_UP:
                return self._late(lead.term)
            return self._won(lead, now, f, None if lease is None else vacancy(before, lease))
        if step is Next.RENEW:  # still ours from a term we had given up on
            assert lease is not None
            self._term, f.renew_at = lease.term, 0.0
            return 0.0
        return self._plan_follow(self._clock.monotonic(), f)

    def _accept(self, term: int, proof: Proof, tag: float | None, f: Following) -> float:
        """A transferred term (the giver's belief ended first): renewed, then believed."""
        c, started = self.candidate, self._clock.monotonic()
        try:
            result = self._calls(
                self.backend.renew, self.namespace, c.token, term, self.config.ttl, liveness=tag
            )
        except Exception:
            return self._calls.retry_delay()
        self._reading.read(result.lease, started)
        self._reading.had = max(self._reading.had, term)
        lead = self._lead_of(term, started, proof, tag)
        in_time = self._clock.monotonic() < rules.trust_end(lead, proof)
        step = rules.after_renew(result, term, c.token, in_time=in_time)
        if step is Next.LEAD or step is Next.GIVE_UP:
            self._term = term
            self._want_lock(True)  # a leader holds the lock: its grant tags the term
            return self._won(lead, started, f, None) if step is Next.LEAD else self._late(term)
        return self._plan_follow(self._clock.monotonic(), f)

    def _hold_back(self, now: float) -> bool:
        """Whether to leave this vacancy to a newer release (decisions.defer_take).

        Read before each elect or take-over (a wakeup may say the row is vacant); a failed
        read is not counted (the step's own call reports the database) and never stops an
        election. Holding back, it is as an ineligible one: no lock.
        """
        c = self.candidate
        try:
            live = self.backend.candidates(self.namespace, timeout=self.config.call_timeout)
        except Exception:
            return False
        newer = rules.newer_release_lives(c.release, live, c.token)
        back = self._back
        back.active = rules.defer_take(newer, back.since, now, self.config.ttl)
        back.since = (back.since or now) if newer else None
        return back.active

    def _won(self, lead: Lead, started: float, f: Following, vacancy: float | None) -> float:
        if not self._belief.begin(lead, vacancy):
            return 0.0  # resigned or stopping meanwhile: the loop resigns this term
        f.renew_at = started + self._jittered(self.config.renew_interval, up=False)
        return f.renew_at - self._clock.monotonic()

    def _late(self, term: int) -> float:
        log.warning(
            "election in namespace %r won term %s after its trust window ended (slow "
            "database?); resigning it",
            self.namespace,
            term,
        )
        self._request_resign(0.0)
        return 0.0

    def _plan_follow(self, now: float, f: Following) -> float:
        healthy, grace = self._wakeup is not None and self._wakeup.healthy, self.config.liveness
        seen = self._seen(now, held_back=self._back.active)
        plan = rules.follower_wait(
            seen, self.config, healthy=healthy, grace=grace or 0.0, spread=random.random()
        )
        self._want_lock(plan.want_lock)
        f.look_at = now + plan.wait
        f.look_by = now + plan.look_by
        return plan.wait

    # -- leading ---------------------------------------------------------------------------------

    def _renew(self, started: float, lead: Leading) -> float:
        """Renew the term held; the wait until the next step."""
        term = self._term
        assert term is not None
        belief = self._belief
        trusted = belief.trusted()
        if self._live is not None and trusted is not None:
            self._want_lock(True)  # a leader holds the lock (if it can: tagged from then on)
        proof = lock_proof(self._live)
        tag = self._tag(proof)
        if tag is not None and trusted is not None and not trusted.tagged:
            # Belief tightens before the row says so, and loosens only after.
            belief.extend(Lead(term, trusted.lease_until, proof.grant))
        token = self.candidate.token
        try:
            result = self._calls(
                self.backend.renew, self.namespace, token, term, self.config.ttl,
                liveness=tag,
            )  # fmt: skip
        except Exception:
            return self._retry(self._calls.retry_delay(), lead)
        self._reading.read(result.lease, started)
        step = rules.after_renew(result, term, token, in_time=belief.trusted() is not None)
        if step is Next.LEAD:
            belief.extend(self._lead_of(term, started, proof, tag))
            lead.renew_at = started + self._jittered(self.config.renew_interval, up=False)
            asked = rules.transfer_asked(result.lease, token, term)
            if asked is not None:
                self._transfer_asked(asked)
            return lead.renew_at - self._clock.monotonic()
        if step is Next.RETRY:  # lost to contention, nothing known: retry while trusted
            return self._retry(self.config.poll_interval, lead)
        if step is Next.GIVE_UP:
            return self._give_up(RevokeReason.EXPIRED)
        self._term = None
        self._drop(RevokeReason.LOST)
        return self._plan_follow(self._clock.monotonic(), lead.after)

    def _retry(self, delay: float, lead: Leading) -> float:
        """Renew again soon, while trusted (else give up)."""
        trusted = self._belief.trusted()
        if trusted is None:
            return self._give_up(RevokeReason.EXPIRED)
        lead.renew_at = 0.0
        left = self._belief.trust_end(trusted) - self._clock.monotonic()
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
        self._request_resign(0.0)
        return 0.0

    # -- resigning and the end ----------------------------------------------------------------

    def _resign(self, f: Following | None = None) -> None:
        """Resign the term held (if any), once; the lock goes after it.

        ``f``: the timers following goes on with, which take the resign's back-off.
        """
        term = self._term
        self._belief.end(RevokeReason.RESIGNED)  # already ended by whoever asked, if any
        if term is not None:
            try:
                self._calls(self.backend.resign, self.namespace, self.candidate.token, term)
            except Exception:
                log.debug("resign of term %s failed; it will expire", term, exc_info=True)
        self._want_lock(False)  # after the resign: a granted follower finds it vacant
        self._term = None
        if f is not None:
            f.backoff_until = max(f.backoff_until, self._resign_due or 0.0)
        self._resign_due = None
        self.resigned.set()

    def _transfer_asked(self, target_token: str) -> None:
        """An operator asked for a hand-over on the row: to the candidate with that token."""
        try:
            live = self._calls(self.backend.candidates, self.namespace)
        except Exception:
            return  # asked again at the next renewal
        target = next((x for x in live if x.token == target_token), None)
        if target is not None and self._transfer_due is None:
            self._transfer_due = Transfer(target)

    def _transfer(self, ask: Transfer) -> None:
        """Hand the term held to ``ask.target``: belief ends first, then one write names it.

        Refused (the target stopped, or the term was lost meanwhile): the term is resigned,
        and the election decides, as after a resign.
        """
        self._transfer_due, term, c = None, self._term, self.candidate
        self._belief.end(RevokeReason.TRANSFERRED, veto=term or 0)
        result = None
        if term is not None:
            floor = max(self._reading.greatest_term + 1, self._clock.wall_us())
            try:
                result = self._calls(
                    self.backend.transfer, self.namespace, c.token, term, ask.target,
                    self.config.ttl, floor=floor,
                )  # fmt: skip
                self._reading.read(result.lease, self._clock.monotonic())
            except Exception:
                result = None
        if result is not None and result.won:
            self._term = None
            self._want_lock(False)  # after the write: the target may be granted the lock
        else:
            self._request_resign(0.0)
        ask.finish(result)

    def _heartbeat_if_due(self, now: float, f: Following | None) -> None:
        """Heartbeat when due; ``f``: a follower's timers (None: leading)."""
        if not self.candidate.register:
            return
        following = f is not None and now >= f.backoff_until
        beat, look = rules.heartbeat_now(
            now,
            self._next_heartbeat,
            following=following,
            look_at=0.0 if f is None else f.look_at,
            interval=self.config.heartbeat_interval,
        )
        if beat:
            if look and f is not None:
                f.look_at = now  # the look goes with it, on one connection
            ok, config = self._heartbeat(), self.config  # failed: again within a poll
            every = config.heartbeat_interval if ok else config.poll_interval
            self._next_heartbeat = now + self._jittered(every)

    def _heartbeat(self) -> bool:
        """Register (refresh the row); the leader prunes dead candidates. False: it failed."""
        c = self.candidate
        try:
            self._calls(
                self.backend.register,
                self.namespace,
                c.token,
                c.candidate_id,
                c.hostname,
                os.getpid(),
                self.config.candidate_ttl,
                eligible=c.eligible,
                release=c.release,
            )
            now = self._clock.monotonic()
            if self._belief.trusted() is not None and now >= self._next_prune:
                # Dead candidates' rows: the leader clears them, once per candidate_ttl.
                self._next_prune = now + self.config.candidate_ttl
                self._calls(self.backend.prune, self.namespace)
        except Exception:
            return False  # reported; the election goes on without it
        return True

    def _shutdown(self) -> None:
        if self._transfer_due is not None:
            self._transfer_due.finish(None)
        self._resign()
        if self._live is not None:
            try:
                self._live.close()
            except Exception:  # the session ends with this process anyway
                log.exception("closing the liveness session failed")
        if self.candidate.register:
            with contextlib.suppress(Exception):  # reported by the call
                self._calls(self.backend.unregister, self.namespace, self.candidate.token)
        with self._belief.changed:
            self._belief.changed.notify_all()
        self._calls.announcer.sleeper.wake()

    def _jittered(self, seconds: float, *, up: bool = True) -> float:
        """``seconds`` stretched or shrunk by up to the jitter fraction (only shrunk if not up)."""
        j = self.config.jitter
        return seconds * (1 + random.uniform(-j, j if up else 0))
