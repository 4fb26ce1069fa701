"""The election thread: the one writer of every field of the protocol.

An ``ElectionLoop`` is made by ``Elector.start()`` and run by the thread it starts. Its
fields (the belief, the lease last read, the schedule, the failure count) are written
only by that thread; other threads reach it only through ``post`` (the lock thread,
the backend's wakeup listener, ``resign()``), and read its belief lock-free. What it does
next is decided by the pure functions of decisions.py; it makes the calls they choose.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import random
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from . import decisions as rules
from .backends.base import Wakeup, WakeupHandle
from .clock import Sleeper, boottime
from .decisions import Call, Next, Proof
from .lease import ElectResult, Lease, trusted_until
from .transitions import Lead, RevokeReason

if TYPE_CHECKING:
    from .elector import Elector

__all__ = ["ElectionLoop"]

log = logging.getLogger("celery_election.elector")


class ElectionLoop:
    """One run of an Elector's election thread (from ``start()`` to ``stop()``)."""

    def __init__(self, elector: Elector, before: ElectionLoop | None) -> None:
        self.e = elector
        self.config, self.backend, self.namespace = (
            elector.config,
            elector.backend,
            elector.namespace,
        )
        self.candidate_id, self.hostname = elector.candidate_id, elector.hostname
        self._clock, self.stats = elector._clock, elector.stats
        self._live = elector._live  # the lock thread of this run (None: no lock)
        #: how long a vacancy waits for the lock's holder to elect before anyone may
        self._grace = self.config.liveness or 0.0
        # What other threads post to this thread: (kind, detail).
        self._inbox: collections.deque[tuple[str, Any]] = collections.deque()
        self._sleeper = self._clock.sleeper()
        self._release: Callable[[], None] | None = getattr(self.backend, "release_idle", None)
        self._wakeup: WakeupHandle | None = None
        # The belief and what was read; the floor and the last row outlive a restart.
        self._lead: Lead | None = None
        self._last_lease: Lease | None = None if before is None else before._last_lease
        self._greatest_term: int = 0 if before is None else before.greatest_term
        self._failures = 0
        # The schedule.
        self._held: int | None = None  # the term the row holds for our token
        self._next_renew = 0.0
        self._follow_until = 0.0  # no look before this unless woken
        self._look_by = 0.0  # wakeups may push the next look back, never past this
        self._vacant_since: float | None = None
        self._backoff_until = 0.0
        self._resign_pending = False
        self._next_prune = 0.0

    # -- read by other threads (lock-free: each a single reference) -------------------------

    @property
    def lead(self) -> Lead | None:
        """The lead this thread believes (the Elector adds the veto and the clock)."""
        return self._lead

    @property
    def held(self) -> int | None:
        return self._held

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

    def post(self, kind: str, detail: Any) -> None:
        """Hand something to this thread; the only way other threads reach it."""
        self._inbox.append((kind, detail))
        self._sleeper.wake()

    # -- the thread -----------------------------------------------------------------------------

    def run(self) -> None:
        if self._live is None:  # else the lock is the wake-up: no LISTEN connection
            self._subscribe()
        next_heartbeat = self._clock.monotonic()
        stats = self.stats
        warnings = getattr(self.backend, "topology_warnings", None)
        if warnings is not None:  # what the database's set-up means for this election
            for line in warnings(liveness=self.config.liveness is not None):
                log.warning("election in namespace %r: %s", self.namespace, line)
        while True:
            self._drain()
            if self.e._stopping:
                break
            stats.busy_since = boottime()  # the health probe's "wedged" clock
            now = self._clock.monotonic()
            if self._resign_pending:
                self._do_resign()
                continue
            if self.e._register:
                following = self._held is None and now >= self._backoff_until
                beat, look = rules.heartbeat_now(
                    now,
                    next_heartbeat,
                    following=following,
                    look_at=self._follow_until,
                    interval=self.config.heartbeat_interval,
                )
                if beat:
                    if look:
                        self._follow_until = now  # the look goes with it, on one connection
                    self._heartbeat()
                    next_heartbeat = now + self._jittered(self.config.heartbeat_interval)
            if self._held is None:
                wait = self._follow(now)
            elif now >= self._next_renew:
                wait = self._leader_step()
            else:
                wait = self._next_renew - now
            if self.e._register:
                wait = min(wait, next_heartbeat - self._clock.monotonic())
            if self._held is None and wait >= self.config.ttl and self._release is not None:
                self._release()  # a standby holds no lease connection while it waits
            stats.busy_since = None
            if wait > 0 and not self._inbox and not self.e._stopping:
                self._sleeper.wait(wait)
        stats.busy_since = None
        self._shutdown()

    def _drain(self) -> None:
        """Act on what other threads posted; each only changes what to do next."""
        while self._inbox:
            kind, detail = self._inbox.popleft()
            if kind == "resign":
                self._resign_pending = True
                self._backoff_until = self._clock.monotonic() + self.config.resign_backoff
            elif kind == "wakeup":
                self._on_wakeup(detail)
            elif kind == "lock":
                self._on_lock_news(detail)
            # "stop": only wakes the loop, which reads the Elector's stopping flag

    def _on_lock_news(self, kind: str) -> None:
        if kind == "unsupported" and self._wakeup is None:
            self._subscribe()  # no lock to wake us: wakeups (LISTEN) instead
        if self._held is not None:
            if kind != "failing":
                # granted: renew now to tag the term; lost: renew untagged now, before
                # the ping trust runs out; unsupported: the lease alone from now on.
                self._next_renew = 0.0
        elif kind in ("granted", "unsupported", "hot", "failing"):
            # look now (elect, take over, or plan the wait anew: a failing lock is no
            # wake-up, so the lease is read again whenever it would end)
            self._follow_until = 0.0

    def _subscribe(self) -> None:
        self._wakeup = self.backend.subscribe_wakeups(
            self.namespace, lambda w: self.post("wakeup", w)
        )

    def _on_wakeup(self, wakeup: Wakeup) -> None:
        """A hint from the backend. Only ever changes *when* we look."""
        lease = self._last_lease
        if wakeup.kind == "renewed":
            if self._held is not None or lease is None or not lease.held:
                return
            if wakeup.term != lease.term:
                return
            if self._live is None or lease.liveness_us is not None:
                # The leader we last read renewed just now, so its lease ends about one
                # lease length from now: nothing to look at before then (and a forged
                # stream of these can delay us at most until _look_by).
                start = lease.renewed_at_us or lease.acquired_at_us or lease.expires_at_us
                length = (lease.expires_at_us - start) / 1_000_000
                later = self._clock.monotonic() + length + random.uniform(0, 0.02)
                self._follow_until = min(max(self._follow_until, later), self._look_by)
                return
            # The term we read was not bound by the lock yet: this renewal may be the one
            # that tags it. Look now, to wait on the lock for it rather than on its lease.
        if wakeup.kind == "elected" and wakeup.term == self._held:
            return  # our own
        self._follow_until = 0.0

    def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """One backend call with the attempt deadline; errors are reported, then raised."""
        op = getattr(fn, "__name__", "call")
        began = time.perf_counter()
        try:
            result = fn(*args, timeout=self.config.call_timeout, **kwargs)
        except Exception as exc:
            self.stats.call(op, time.perf_counter() - began, False)
            self._failures += 1
            self.e._announcer.post(exc)
            raise
        self.stats.call(op, time.perf_counter() - began, True)
        if self._failures:
            log.info("election database reachable again (namespace %r)", self.namespace)
            self.e._announcer.recovered()
        self._failures = 0
        return result

    def _retry_delay(self) -> float:
        return self.e._backoff(max(1, self._failures))

    def _seen(self, now: float, proof: Proof | None = None) -> rules.Seen:
        """What a decision sees; ``proof``: the lock's, as read once for the whole step."""
        live = self._live
        if live is None or live.unsupported:
            return rules.Seen(now, self._last_lease, self.e._token, None, self._vacant_since)
        proof = live.proof if proof is None else proof
        cold = live.cold and not proof.held
        return rules.Seen(
            now,
            self._last_lease,
            self.e._token,
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
        return self._live.delta if self._live is not None and proof.held else None

    def _want_lock(self, wanted: bool) -> None:
        self.e._want_lock(wanted)

    def _follow(self, now: float) -> float:
        """A follower's turn: look if it is time, then decide how long to wait."""
        if now < self._backoff_until:
            self._want_lock(False)
            return self._backoff_until - now
        if now < self._follow_until:
            return self._follow_until - now
        # One reading of the lock's proof decides the call and tags it: read twice, a
        # grant lost in between chose a take-over and then sent it untagged (a chaos run).
        proof = self.e._proof()
        call, waited = rules.follower_call(self._seen(now, proof), self._grace)
        tag = self._tag(proof)
        args = (self.namespace, self.e._token, self.candidate_id, self.config.ttl)
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
        step = rules.after_elect(result, self.e._token, in_time=in_time)
        if step is Next.LEAD or step is Next.GIVE_UP:
            assert lead is not None
            self._held = lead.term
            self._want_lock(True)  # a leader holds the lock: its grant tags the term
            return self._won(lead, now) if step is Next.LEAD else self._late(lead.term)
        if step is Next.RENEW:  # still ours from a term we had given up on
            assert lease is not None
            self._held, self._next_renew = lease.term, 0.0
            return 0.0
        return self._plan_follow(self._clock.monotonic())

    def _won(self, lead: Lead, started: float) -> float:
        with self.e._lock:
            if self.e._stopping or lead.term <= self.e._vetoed:
                return 0.0  # the loop resigns this term
            self._lead = lead
            # The watchers publish the trust window (the history, the worker's shared
            # record) before anyone hears of the term: a process killed as soon as it
            # says it leads has its window on record.
            self.e._watchers(lead)
            self.e._announcer.post(self.e._transition("elected", lead.term))
            self.e._changed.notify_all()
        self._next_renew = started + self._jittered(self.config.renew_interval, up=False)
        return self._next_renew - self._clock.monotonic()

    def _late(self, term: int) -> float:
        log.warning(
            "election in namespace %r won term %s after its trust window ended (slow "
            "database?); resigning it",
            self.namespace,
            term,
        )
        self._resign_pending = True
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

    def _leader_step(self) -> float:
        term = self._held
        assert term is not None
        started = self._clock.monotonic()
        lead = self.e._trusted()
        if self._live is not None and lead is not None:
            self._want_lock(True)  # a leader holds the lock (if it can: tagged from then on)
        proof = self.e._proof()
        tag = self._tag(proof)
        if tag is not None and lead is not None and not lead.tagged:
            # Belief tightens before the row says so, and loosens only after.
            self._set_lead(Lead(term, lead.lease_until, proof.grant))
        try:
            result = self._call(
                self.backend.renew, self.namespace, self.e._token, term, self.config.ttl,
                liveness=tag,
            )  # fmt: skip
        except Exception:
            lead = self.e._trusted()
            if lead is None:
                return self._give_up(term, RevokeReason.EXPIRED)
            self._next_renew = 0.0
            left = self.e._trust_end(lead) - self._clock.monotonic()
            return min(self._retry_delay(), max(0.01, left / 3))
        self._read(result.lease, started)
        in_time = self.e._trusted() is not None
        step = rules.after_renew(result, term, self.e._token, in_time=in_time)
        if step is Next.LEAD:
            lease_until = trusted_until(started, self.config.ttl, self.config.safety_margin)
            self._set_lead(Lead(term, lease_until, proof.grant if tag is not None else None))
            self._next_renew = started + self._jittered(self.config.renew_interval, up=False)
            return self._next_renew - self._clock.monotonic()
        if step is Next.RETRY:  # lost to contention, nothing known: retry while trusted
            self._next_renew = 0.0
            return min(self.config.poll_interval, self.e.trusted_for / 3)
        if step is Next.GIVE_UP:
            return self._give_up(term, RevokeReason.EXPIRED)
        self._held = None
        self._drop(RevokeReason.LOST)
        return self._plan_follow(self._clock.monotonic())

    def _set_lead(self, lead: Lead) -> None:
        """A renewed (or tightened) belief in the term held; the watchers see it."""
        with self.e._lock:
            if self._lead is not None and self.e._trusted() is not None:
                self._lead = lead
                self.e._watchers(lead)

    def _drop(self, reason: RevokeReason) -> None:
        """Stop believing the lead (if any) and let the lock go to a follower now."""
        with self.e._lock:
            lead, self._lead = self._lead, None
            if lead is not None:
                self.e._end_belief(lead, reason)
        if reason in (RevokeReason.EXPIRED, RevokeReason.LOST):
            # A resign or stop releases the lock after the resign instead, so the row is
            # vacant when a follower is granted it.
            self._want_lock(False)

    def _give_up(self, term: int, reason: RevokeReason) -> float:
        """Stop believing and resign the term so the next one is fresh."""
        self._drop(reason)
        self._resign_pending = True
        return 0.0

    def _do_resign(self) -> None:
        term = self._held
        with self.e._lock:
            lead, self._lead = self._lead, None
            if lead is not None and lead.term > self.e._vetoed and not self.e._stopping:
                self.e._end_belief(lead, RevokeReason.RESIGNED)
        if term is not None:
            try:
                self._call(self.backend.resign, self.namespace, self.e._token, term)
            except Exception:
                log.debug("resign of term %s failed; it will expire", term, exc_info=True)
        self._want_lock(False)  # after the resign: a granted follower finds it vacant
        self._held = None
        self._resign_pending = False
        self.e._resign_done.set()

    def _heartbeat(self) -> None:
        try:
            self._call(
                self.backend.register,
                self.namespace,
                self.e._token,
                self.candidate_id,
                self.hostname,
                os.getpid(),
                self.config.candidate_ttl,
            )
            now = self._clock.monotonic()
            if self.e.is_leader and now >= self._next_prune:
                # Dead candidates' rows: the leader clears them, once per candidate_ttl.
                self._next_prune = now + self.config.candidate_ttl
                self._call(self.backend.prune, self.namespace)
        except Exception:
            pass  # reported; the election goes on without it

    def _shutdown(self) -> None:
        self._do_resign()
        if self._live is not None:
            try:
                self._live.close()
            except Exception:  # the session ends with this process anyway
                log.exception("closing the liveness session failed")
        if self.e._register:
            with contextlib.suppress(Exception):  # reported by _call
                self._call(self.backend.unregister, self.namespace, self.e._token)
        with self.e._lock:
            self.e._changed.notify_all()
        self.e._announcer.wake()

    def _jittered(self, seconds: float, *, up: bool = True) -> float:
        """``seconds`` stretched or shrunk by up to the jitter fraction (only shrunk if not up)."""
        j = self.config.jitter
        return seconds * (1 + random.uniform(-j, j if up else 0))
