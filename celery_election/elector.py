"""The Elector: one thread running the election protocol against a backend.

The protocol
============

Every candidate of a namespace runs an Elector. The backend holds one lease row per
namespace (leader token, term, expiry on the database's clock) and answers three atomic,
term-scoped steps: ``elect`` (take the lease if vacant or expired, with a strictly greater
term), ``renew`` (extend it, only for the exact token and term), ``resign`` (vacate it,
only for the exact token and term).

::

              elect won, in time                     renew lost / trust ran out /
    FOLLOWER ------------------------> LEADER ------ resign() / stop() ------> FOLLOWER
       ^  |  elect lost: wait on the      |  renew won: trusted again
       |  |  lock, the lease's end or     |  until start + ttl - margin
       +--+  a wakeup                     +--+

Leadership is believed only inside the trust window: an attempt that started at ``t`` (on
the boot-time clock, read *before* the statement is sent) and won is trusted until
``t + ttl - safety_margin``. The database cannot expire the lease before ``t + ttl``, so
the elector stops believing it leads before anyone else can take over, by at least the
margin. ``is_leader`` compares the deadline with the clock on every read: it turns False
at the deadline even while the thread is stuck in a database call, and the dispatcher
thread announces the revocation then. A success that returns after its own deadline
counts as a failure: the term is resigned and a fresh one is sought. With a liveness lock
(liveness.py) trust also ends with the lock's proof; decisions.py has the rules.

Threads
=======

One thread, the election thread, owns every field of the protocol (the belief, the lease
last read, the schedule). The others only post to it: the lock thread (grants, pings,
losses), the backend's wakeup listener, ``resign()`` and ``stop()``. What it does with
what it knows is decided by the pure functions of decisions.py. ``resign()`` and
``stop()`` end belief at once through one field of their own (a veto) that ``is_leader``
reads; the dispatcher owns the announcements, in order and each once: events
(``elected``, ``revoked`` with a reason, ``error``) reach callbacks and subscriptions
there, and a slow consumer delays only later events, never the protocol.

Failures never kill the thread. A follower retries with back-off; a leader keeps renewing
until its trust window ends, then steps down. ``stop()`` drops the belief first, then
resigns the term so a follower takes over at once, then unregisters the candidate.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import random
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from . import decisions as rules
from .announce import Announcer
from .backends.base import Backend, Wakeup, WakeupHandle
from .clock import Clock, RealClock, boottime
from .config import ElectionConfig, Seconds, validate_candidate_id, validate_namespace
from .decisions import Call, Next, Proof
from .errors import ConfigurationError, ElectionError
from .liveness import Liveness, start_liveness
from .metrics.stats import ElectorStats, track
from .term import ElectResult, Lease, trusted_until
from .transitions import (
    Backoff,
    Lead,
    RevokeReason,
    State,
    Subscription,
    Transition,
    exponential_backoff,
)

__all__ = [
    "Backoff",
    "Elector",
    "ElectorSnapshot",
    "RevokeReason",
    "State",
    "Subscription",
    "Transition",
    "exponential_backoff",
]

log = logging.getLogger(__name__)

_NO_PROOF = Proof()


@dataclass(frozen=True)
class ElectorSnapshot:
    """What the health probes and the exporter read of an Elector, in one look."""

    #: start() was called and stop() has not finished
    started: bool
    #: the election thread is alive
    running: bool
    #: ``is_leader`` at the time of the look
    leading: bool
    #: the term this elector holds belief in, else the last term it saw, else 0
    term: int
    #: when belief in that term ends (boot-time clock), None when not leading
    trusted_until: float | None
    #: database calls failed in a row (0 once one answers)
    failures: int


class Elector:
    """Runs the election for one candidate in one namespace.

    Timings come from ``config`` or the keyword arguments (see ElectionConfig); a bad
    combination raises ConfigurationError here, before anything starts.
    """

    def __init__(
        self,
        backend: Backend,
        namespace: str = "default",
        candidate_id: str | None = None,
        *,
        config: ElectionConfig | None = None,
        on_elected: Callable[[int], Any] | None = None,
        on_revoked: Callable[[int, RevokeReason], Any] | None = None,
        on_error: Callable[[BaseException], Any] | None = None,
        backoff: Backoff | None = None,
        clock: Clock | None = None,
        register: bool = True,
        **timings: Seconds,
    ) -> None:
        self.config = _config(config, timings)
        if isinstance(backend, type) or not isinstance(backend, Backend):
            raise ConfigurationError(
                f"backend must be a celery_election backend (see backend_from_url): got {backend!r}"
            )
        self.backend = backend
        self.namespace = validate_namespace(namespace)
        self.hostname = socket.gethostname()
        self._token = uuid.uuid4().hex
        if candidate_id is None:
            candidate_id = f"{self.hostname}:{os.getpid()}:{self._token[:8]}"
        self.candidate_id = validate_candidate_id(candidate_id)
        self._clock: Clock = clock or RealClock()
        poll = self.config.poll_interval
        self._backoff = backoff or exponential_backoff(base=min(0.1, poll), cap=max(poll, 2.0))
        self._register = register
        #: counters for metrics and the health probe (celery_election.metrics)
        self.stats = ElectorStats()
        # The caller's side (start, stop, resign, subscribe): guarded by _lock.
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._started = self._stopping = False
        self._vetoed = 0  # belief in terms up to this one ended by resign()
        self._resign_done = threading.Event()
        self._resign_done.set()
        self._trust_watchers: list[Callable[[int | None, float | None], Any]] = []
        self._thread: threading.Thread | None = None
        self._wakeup: WakeupHandle | None = None
        self._live: Liveness | None = None
        self._announcer = Announcer(self, (on_elected, on_revoked, on_error))
        # What other threads post to the election thread: (kind, detail).
        self._inbox: collections.deque[tuple[str, Any]] = collections.deque()
        self._sleeper = self._clock.sleeper()
        # The election thread's own fields (see _reset).
        self._lead: Lead | None = None
        self._last_lease: Lease | None = None
        self._greatest_term = 0  # the greatest term this elector has seen: a floor
        self._failures = 0
        self._reset()
        track(self)

    def _reset(self) -> None:
        """The election thread's schedule, as at start."""
        self._held: int | None = None  # the term the row holds for our token
        self._next_renew = 0.0
        self._follow_until = 0.0  # no look before this unless woken
        self._look_by = 0.0  # wakeups may push the next look back, never past this
        self._vacant_since: float | None = None
        self._backoff_until = 0.0
        self._resign_pending = False
        self._next_prune = 0.0

    def __repr__(self) -> str:
        return (
            f"<Elector {self.candidate_id!r} namespace={self.namespace!r} "
            f"state={self.state.value} term={self.term}>"
        )

    # -- public view (no I/O, safe from any thread) -------------------------------------------

    def _proof(self) -> Proof:
        live = self._live
        return _NO_PROOF if live is None else live.proof

    def _trusted(self) -> Lead | None:
        """The lead believed now: set, not vetoed, its trust not ended."""
        lead = self._lead
        if lead is None or self._stopping or lead.term <= self._vetoed:
            return None
        if self._clock.monotonic() >= rules.trust_end(lead, self._proof()):
            return None
        return lead

    def _trust_end(self, lead: Lead) -> float:
        return rules.trust_end(lead, self._proof())

    @property
    def is_leader(self) -> bool:
        """True only while leading inside the trust window."""
        return self._trusted() is not None

    @property
    def term(self) -> int | None:
        """The term this elector leads under (its fencing token), None when not leading."""
        lead = self._trusted()
        return None if lead is None else lead.term

    @property
    def trusted_for(self) -> float:
        """Seconds of trust left (0 when not leading)."""
        lead = self._trusted()
        return 0.0 if lead is None else max(0.0, self._trust_end(lead) - self._clock.monotonic())

    @property
    def trusted_until(self) -> float | None:
        """The boot-time clock reading at which leadership stops being trusted."""
        lead = self._trusted()
        return None if lead is None else self._trust_end(lead)

    @property
    def token(self) -> str:
        """Return the instance token, a secret that renew, resign and beat claims need."""
        return self._token

    @property
    def leader_id(self) -> str | None:
        """The candidate id of the leader as last seen (this one's when leading)."""
        if self.is_leader:
            return self.candidate_id
        lease = self._last_lease
        return lease.leader_id if lease is not None and lease.held else None

    @property
    def last_lease(self) -> Lease | None:
        """The lease row as the last step saw it."""
        return self._last_lease

    @property
    def state(self) -> State:
        """What the elector is doing now."""
        if not self._started:
            return State.STOPPED
        if self._stopping:
            return State.STOPPING
        if not self._resign_done.is_set():
            return State.RESIGNING
        return State.LEADER if self.is_leader else State.FOLLOWER

    @property
    def liveness(self) -> str:
        """The liveness lock: "off", "holding" it, "waiting" for it, "standby", or "idle".

        Standby: it would wait, but the standby slots are taken (``standbys``): it holds
        no connection and tries again about once per ttl. Idle: on, but nobody's trust is
        bound by the lock now (no leader, or one not bound by it), so it does not wait.
        """
        live = self._live
        if live is None or live.unsupported:
            return "off"
        if live.held:
            return "holding"
        if not live.wanted:
            return "idle"
        return "standby" if live.cold else "waiting"

    def snapshot(self) -> ElectorSnapshot:
        """A look at the elector for probes and exporters; never takes the lock.

        Lock-free so that a probe answers even while the election thread is wedged.
        """
        lead, seen, thread = self._trusted(), self._last_lease, self._thread
        term = lead.term if lead is not None else seen.term if seen is not None else 0
        return ElectorSnapshot(
            started=self._started,
            running=thread is not None and thread.is_alive(),
            leading=lead is not None,
            term=term,
            trusted_until=None if lead is None else self._trust_end(lead),
            failures=self._failures,
        )

    def wait_for_leadership(self, timeout: float | None = None) -> bool:
        """Block until this elector leads (True) or ``timeout`` seconds pass (False)."""
        with self._changed:
            self._changed.wait_for(lambda: self.is_leader or self._stopping, timeout)
        return self.is_leader

    def watch_trust(self, watcher: Callable[[int | None, float | None], Any]) -> None:
        """Call ``watcher(term, trusted_until)`` on every change of trust, renewals included.

        ``(None, None)`` when leadership ends. Called synchronously by the election thread
        (or the dispatcher, when trust runs out) with the elector's lock held: it must be
        quick and must not call back into the elector. This is how a process publishes
        its trust window to others (the Celery worker's shared record does).
        """
        with self._lock:
            self._trust_watchers.append(watcher)
            lead = self._trusted()
            if lead is not None:
                watcher(lead.term, self._trust_end(lead))

    def subscribe(self) -> Subscription:
        """An ordered stream of this elector's transitions from now on."""
        return self._announcer.subscribe()

    def _unsubscribe(self, sub: Subscription) -> None:
        self._announcer.unsubscribe(sub)

    # -- life cycle ----------------------------------------------------------------------------

    def start(self) -> Elector:
        """Start the election threads; returns at once (see wait_for_leadership)."""
        with self._lock:
            if self._started:
                raise ElectionError(f"{self!r} is already started")
            self._started = True
            self._stopping = False
            self._token = self._token if self._thread is None else uuid.uuid4().hex
        self._reset()
        self._inbox.clear()
        self._live = start_liveness(
            self.backend, self.namespace, self.config, self._clock, self._on_lock
        )
        if self._live is None:  # else the lock is the wake-up: no LISTEN connection
            self._subscribe()
        self._thread = threading.Thread(
            target=self._run, name=f"celery-election-{self.namespace}", daemon=True
        )
        self._announcer.start(f"celery-election-events-{self.namespace}")
        self._thread.start()
        return self

    def stop(self, timeout: float | None = None) -> None:
        """Step down at once, resign the term, unregister, and join the threads."""
        with self._lock:
            if not self._started:
                return
            lead = self._trusted()
            self._stopping = True
            if lead is not None:
                self._end_belief(lead, RevokeReason.STOPPED)
            self._changed.notify_all()
        self._sleeper.wake()
        if timeout is None:
            timeout = 3 * self.config.call_timeout + 1
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        if self._wakeup is not None:
            self._wakeup.close()
            self._wakeup = None
        if self._live is not None and (self._thread is None or not self._thread.is_alive()):
            self._live.close()  # normally closed by _shutdown, after the resign
        self._announcer.stop(timeout, self._thread)
        with self._lock:
            self._started = False

    def resign(self, wait: bool = True, timeout: float | None = None) -> bool:
        """Step down now and stay out for ``resign_backoff``; False if not leading.

        Belief ends before the database is told, so nothing runs as leader during the
        handoff. With ``wait``, returns after the term has been resigned in the database.
        """
        with self._lock:
            lead, held = self._lead, self._held
            if lead is None and held is None:
                return False
            self._resign_done.clear()
            self._vetoed = max(self._vetoed, held or 0, lead.term if lead else 0)
            if lead is not None:
                self._end_belief(lead, RevokeReason.RESIGNED)
        self._post_in("resign", None)
        if wait:
            self._resign_done.wait(timeout if timeout is not None else self.config.call_timeout + 1)
        return True

    def __enter__(self) -> Elector:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- posting (any thread) --------------------------------------------------------------------

    def _post_in(self, kind: str, detail: Any) -> None:
        """Hand something to the election thread; the only way other threads reach it."""
        self._inbox.append((kind, detail))
        self._sleeper.wake()

    def _on_lock(self, kind: str) -> None:
        """From the lock thread: "granted", "renewed", "lost" or "unsupported"."""
        self._post_in("lock", kind)
        self._announcer.wake()  # trust may end earlier now: announce it on time

    def _end_belief(self, lead: Lead, reason: RevokeReason) -> None:
        """Announce the end of ``lead`` and tell the watchers (call with _lock held)."""
        self._announcer.post(self._transition("revoked", lead.term, reason))
        self._watchers(None)
        self._changed.notify_all()

    def _transition(self, kind: str, term: int, reason: RevokeReason | None = None) -> Transition:
        return Transition(
            kind, self.namespace, term, self.candidate_id, reason, self._clock.monotonic()
        )

    def _watchers(self, lead: Lead | None) -> None:
        for watcher in self._trust_watchers:
            try:
                if lead is None:
                    watcher(None, None)
                else:
                    watcher(lead.term, self._trust_end(lead))
            except Exception:
                log.exception("a trust watcher raised; the election goes on")

    # -- the election thread -------------------------------------------------------------------

    def _run(self) -> None:
        next_heartbeat = self._clock.monotonic()
        stats = self.stats
        warnings = getattr(self.backend, "topology_warnings", None)
        if warnings is not None:  # what the database's set-up means for this election
            for line in warnings(liveness=self.config.liveness is not None):
                log.warning("election in namespace %r: %s", self.namespace, line)
        while True:
            self._drain()
            if self._stopping:
                break
            stats.busy_since = boottime()  # the health probe's "wedged" clock
            now = self._clock.monotonic()
            if self._resign_pending:
                self._do_resign()
                continue
            if self._register and now >= next_heartbeat:
                self._heartbeat()
                next_heartbeat = now + self._jittered(self.config.heartbeat_interval)
            if self._held is None:
                wait = self._follow(now)
            elif now >= self._next_renew:
                wait = self._leader_step()
            else:
                wait = self._next_renew - now
            if self._register:
                wait = min(wait, next_heartbeat - self._clock.monotonic())
            stats.busy_since = None
            if wait > 0 and not self._inbox and not self._stopping:
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
            else:
                self._on_lock_news(detail)

    def _on_lock_news(self, kind: str) -> None:
        if kind == "renewed":  # a good ping: the watchers see the longer trust
            with self._lock:
                lead = self._trusted()
                if lead is not None and lead.tagged:
                    self._watchers(lead)
            return
        if kind == "unsupported" and self._wakeup is None:
            self._subscribe()  # no lock to wake us: wakeups (LISTEN) instead
        if self._held is not None:
            # granted: renew now to tag the term; lost: renew untagged now, before the
            # ping trust runs out; unsupported: the lease alone from now on.
            self._next_renew = 0.0
        elif kind in ("granted", "unsupported", "hot"):
            self._follow_until = 0.0  # look now (elect, take over, or plan the wait anew)

    def _subscribe(self) -> None:
        self._wakeup = self.backend.subscribe_wakeups(
            self.namespace, lambda w: self._post_in("wakeup", w)
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

    def _seen(self, now: float) -> rules.Seen:
        live = self._live
        if live is None or live.unsupported:
            return rules.Seen(now, self._last_lease, self._token, None, self._vacant_since)
        cold = live.cold and not live.proof.held
        return rules.Seen(now, self._last_lease, self._token, live.proof, self._vacant_since, cold)

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

    def _want_lock(self, wanted: bool) -> None:
        if self._live is not None:
            self._live.want(wanted)

    def _follow(self, now: float) -> float:
        """A follower's turn: look if it is time, then decide how long to wait."""
        if now < self._backoff_until:
            self._want_lock(False)
            return self._backoff_until - now
        if now < self._follow_until:
            return self._follow_until - now
        grace = self.config.liveness or 0.0
        call, waited = rules.follower_call(self._seen(now), grace)
        proof = self._proof()
        tag = self._live.delta if self._live is not None and proof.held else None
        args = (self.namespace, self._token, self.candidate_id, self.config.ttl)
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
            self._held = lead.term
            self._want_lock(True)  # a leader holds the lock: its grant tags the term
            return self._won(lead, now) if step is Next.LEAD else self._late(lead.term)
        if step is Next.RENEW:  # still ours from a term we had given up on
            assert lease is not None
            self._held, self._next_renew = lease.term, 0.0
            return 0.0
        return self._plan_follow(self._clock.monotonic())

    def _won(self, lead: Lead, started: float) -> float:
        with self._lock:
            if self._stopping or lead.term <= self._vetoed:
                return 0.0  # the loop resigns this term
            self._lead = lead
            self._announcer.post(self._transition("elected", lead.term))
            self._watchers(lead)
            self._changed.notify_all()
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
        grace = self.config.liveness or 0.0
        plan = rules.follower_wait(
            self._seen(now), self.config, healthy=healthy, grace=grace, spread=random.random()
        )
        self._want_lock(plan.want_lock)
        self._follow_until = now + plan.wait
        self._look_by = now + plan.look_by
        release = getattr(self.backend, "release_idle", None)
        if release is not None and plan.wait >= self.config.ttl:
            release()  # a standby holds no lease connection while it waits
        return plan.wait

    def _leader_step(self) -> float:
        term = self._held
        assert term is not None
        started = self._clock.monotonic()
        lead = self._trusted()
        if self._live is not None and lead is not None:
            self._want_lock(True)  # a leader holds the lock (if it can: tagged from then on)
        proof = self._proof()
        tag = self._live.delta if self._live is not None and proof.held else None
        if tag is not None and lead is not None and not lead.tagged:
            # Belief tightens before the row says so, and loosens only after.
            self._set_lead(Lead(term, lead.lease_until, proof.grant))
        try:
            result = self._call(
                self.backend.renew, self.namespace, self._token, term, self.config.ttl,
                liveness=tag,
            )  # fmt: skip
        except Exception:
            lead = self._trusted()
            if lead is None:
                return self._give_up(term, RevokeReason.EXPIRED)
            self._next_renew = 0.0
            left = self._trust_end(lead) - self._clock.monotonic()
            return min(self._retry_delay(), max(0.01, left / 3))
        self._read(result.lease, started)
        in_time = self._trusted() is not None
        step = rules.after_renew(result, term, self._token, in_time=in_time)
        if step is Next.LEAD:
            lease_until = trusted_until(started, self.config.ttl, self.config.safety_margin)
            self._set_lead(Lead(term, lease_until, proof.grant if tag is not None else None))
            self._next_renew = started + self._jittered(self.config.renew_interval, up=False)
            return self._next_renew - self._clock.monotonic()
        if step is Next.RETRY:  # lost to contention, nothing known: retry while trusted
            self._next_renew = 0.0
            return min(self.config.poll_interval, self.trusted_for / 3)
        if step is Next.GIVE_UP:
            return self._give_up(term, RevokeReason.EXPIRED)
        self._held = None
        self._drop(RevokeReason.LOST)
        return self._plan_follow(self._clock.monotonic())

    def _set_lead(self, lead: Lead) -> None:
        """A renewed (or tightened) belief in the term held; the watchers see it."""
        with self._lock:
            if self._lead is not None and self._trusted() is not None:
                self._lead = lead
                self._watchers(lead)

    def _drop(self, reason: RevokeReason) -> None:
        """Stop believing the lead (if any) and let the lock go to a follower now."""
        with self._lock:
            lead, self._lead = self._lead, None
            if lead is not None:
                self._end_belief(lead, reason)
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
        with self._lock:
            lead, self._lead = self._lead, None
            if lead is not None and lead.term > self._vetoed and not self._stopping:
                self._end_belief(lead, RevokeReason.RESIGNED)
        if term is not None:
            try:
                self._call(self.backend.resign, self.namespace, self._token, term)
            except Exception:
                log.debug("resign of term %s failed; it will expire", term, exc_info=True)
        self._want_lock(False)  # after the resign: a granted follower finds it vacant
        self._held = None
        self._resign_pending = False
        self._resign_done.set()

    def _heartbeat(self) -> None:
        try:
            self._call(
                self.backend.register,
                self.namespace,
                self._token,
                self.candidate_id,
                self.hostname,
                os.getpid(),
                self.config.candidate_ttl,
            )
            now = self._clock.monotonic()
            if self.is_leader and now >= self._next_prune:
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
        if self._register:
            with contextlib.suppress(Exception):  # reported by _call
                self._call(self.backend.unregister, self.namespace, self._token)
        with self._lock:
            self._changed.notify_all()
        self._announcer.wake()

    def _jittered(self, seconds: float, *, up: bool = True) -> float:
        """``seconds`` stretched or shrunk by up to the jitter fraction (only shrunk if not up)."""
        j = self.config.jitter
        return seconds * (1 + random.uniform(-j, j if up else 0))


def _config(config: ElectionConfig | None, timings: Mapping[str, Seconds | None]) -> ElectionConfig:
    """The timings from ``config`` or keyword arguments (ElectionConfig's fields), not both."""
    given = {k: v for k, v in timings.items() if v is not None}
    if config is not None and given:
        raise ConfigurationError(
            f"pass either config= or timing arguments, not both: got {sorted(given)}"
        )
    return config or ElectionConfig.create(**given)
