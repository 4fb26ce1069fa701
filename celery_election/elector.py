"""The Elector: one background thread running the election protocol against a backend.

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
       ^  |  elect lost: sleep until      |  renew won: trusted again
       |  |  the lease ends (or a         |  until start + ttl - margin
       +--+  wakeup, or poll_interval)    +--+

Leadership is believed only inside the trust window: an attempt that started at ``t`` (on
the boot-time clock, read *before* the statement is sent) and won is trusted until
``t + ttl - safety_margin``. The database cannot expire the lease before ``t + ttl``
(it computed the expiry after ``t``), so the elector stops believing it leads before
anyone else can take over, by at least the margin. ``is_leader`` compares the deadline
with the clock on every read: it turns False at the deadline even while the thread is
stuck in a database call, and the dispatcher thread announces the revocation then. A
success that returns after its own deadline counts as a failure: the term is resigned and
a fresh one is sought, so every ``elected`` event has its own term.

With a liveness session (``config.liveness``, ``liveness.py``) the leader also holds a lock
on a connection of its own and pings it every delta / 4, and its trust ends at the
earlier of the lease's bound and its last good ping + delta; the row says so
(``lease.liveness_us``). Followers then wait on that lock instead of a timer: the
database releases it when the leader dies (at once) or goes silent (after delta), and the
follower it is granted to takes the term over delta later, before the lease ends. A term
the row does not mark as bound by the lock is only ever taken when its lease ends. Belief
tightens before the row says so and loosens only after.

Failures never kill the thread. A follower retries with back-off; a leader keeps renewing
until its trust window ends, then steps down. ``stop()`` drops the belief first, then
resigns the term so a follower takes over at once, then unregisters the candidate.

Events (``elected``, ``revoked`` with a reason, ``error``) are delivered in order by a
dispatcher thread, to callbacks and to subscriptions; a slow consumer delays only later
events, never the protocol.
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
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .backends.base import Backend, Wakeup, WakeupHandle
from .clock import Clock, RealClock, boottime
from .config import ElectionConfig, Seconds, validate_candidate_id, validate_namespace
from .errors import ConfigurationError, ElectionError
from .liveness import Liveness, LivenessRules
from .metrics.stats import ElectorStats, track
from .term import Lease, trusted_until
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

_ERROR_REPEAT = 60.0  # seconds between two ERROR lines for one persisting failure


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


class Elector(LivenessRules):
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
        # The timing arguments are ElectionConfig's fields (one definition, checked there).
        timings = {k: v for k, v in timings.items() if v is not None}
        if config is not None and timings:
            raise ConfigurationError(
                f"pass either config= or timing arguments, not both: got {sorted(timings)}"
            )
        self.config = config or ElectionConfig.create(**timings)
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
        self._backoff = backoff or exponential_backoff(
            base=min(0.1, self.config.poll_interval), cap=max(self.config.poll_interval, 2.0)
        )
        self._register = register
        self._callbacks = (on_elected, on_revoked, on_error)

        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._lead: Lead | None = None
        self._held_term: int | None = None  # the term the row holds for our token
        self._last_lease: Lease | None = None
        self._greatest_term = 0  # the greatest term this elector has seen: a floor
        self._started = False
        self._stopping = False
        self._resign_requested = False
        self._resign_done = threading.Event()
        self._backoff_until = 0.0
        self._failures = 0
        self._next_renew = 0.0
        # Follower schedule (boot-time clock): no attempt before _follow_until unless
        # poked by a wakeup; with working wakeups, a look at the row at least by _look_by.
        self._follow_until = 0.0
        self._look_by = 0.0
        self._poke = False
        self._next_prune = 0.0
        #: (kind, when last logged, first failure) of the error being reported
        self._error_logged: tuple[type[BaseException], float, float] | None = None
        # Each event goes to the subscriptions that existed when it was posted.
        self._events: collections.deque[tuple[Transition | BaseException, list[Subscription]]]
        self._events = collections.deque()
        self._subscriptions: list[Subscription] = []
        self._trust_watchers: list[Callable[[int | None, float | None], Any]] = []
        self._wakeup: WakeupHandle | None = None
        self._live: Liveness | None = None
        self._sleeper = self._clock.sleeper()
        self._dispatch_sleeper = self._clock.sleeper()
        self._thread: threading.Thread | None = None
        self._dispatcher: threading.Thread | None = None
        #: counters for metrics and the health probe (celery_election.metrics)
        self.stats = ElectorStats()
        track(self)

    def __repr__(self) -> str:
        return (
            f"<Elector {self.candidate_id!r} namespace={self.namespace!r} "
            f"state={self.state.value} term={self.term}>"
        )

    # -- public view ------------------------------------------------------------------------

    @property
    def is_leader(self) -> bool:
        """True only while leading inside the trust window; no I/O, safe from any thread."""
        lead = self._lead
        return lead is not None and self._clock.monotonic() < lead.trusted_until

    @property
    def term(self) -> int | None:
        """The term this elector leads under (its fencing token), None when not leading."""
        lead = self._lead
        if lead is not None and self._clock.monotonic() < lead.trusted_until:
            return lead.term
        return None

    @property
    def trusted_for(self) -> float:
        """Seconds of trust left (0 when not leading)."""
        lead = self._lead
        return 0.0 if lead is None else max(0.0, lead.trusted_until - self._clock.monotonic())

    @property
    def trusted_until(self) -> float | None:
        """The boot-time clock reading at which leadership stops being trusted."""
        lead = self._lead
        return None if lead is None else lead.trusted_until

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
        if self._resign_requested:
            return State.RESIGNING
        return State.LEADER if self.is_leader else State.FOLLOWER

    def snapshot(self) -> ElectorSnapshot:
        """A look at the elector for probes and exporters; no I/O, never takes the lock.

        Lock-free so that a probe answers even while the election thread is wedged.
        """
        lead = self._lead
        thread = self._thread
        seen = self._last_lease
        term = lead.term if lead is not None else seen.term if seen is not None else 0
        return ElectorSnapshot(
            started=self._started,
            running=thread is not None and thread.is_alive(),
            leading=lead is not None and self._clock.monotonic() < lead.trusted_until,
            term=term,
            trusted_until=None if lead is None else lead.trusted_until,
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
            lead = self._lead
        if lead is not None:
            watcher(lead.term, lead.trusted_until)

    def subscribe(self) -> Subscription:
        """An ordered stream of this elector's transitions from now on."""
        sub = Subscription(self)
        with self._lock:
            self._subscriptions.append(sub)
        return sub

    def _unsubscribe(self, sub: Subscription) -> None:
        with self._lock:
            if sub in self._subscriptions:
                self._subscriptions.remove(sub)

    # -- life cycle -------------------------------------------------------------------------

    def start(self) -> Elector:
        """Start the election threads; returns at once (see wait_for_leadership)."""
        with self._lock:
            if self._started:
                raise ElectionError(f"{self!r} is already started")
            self._started = True
            self._stopping = False
            self._token = self._token if self._thread is None else uuid.uuid4().hex
        self._follow_until = self._look_by = 0.0
        self._wakeup = self.backend.subscribe_wakeups(self.namespace, self._on_wakeup)
        self._live = self._start_liveness()
        self._dispatcher = threading.Thread(
            target=self._dispatch, name=f"celery-election-events-{self.namespace}", daemon=True
        )
        self._thread = threading.Thread(
            target=self._run, name=f"celery-election-{self.namespace}", daemon=True
        )
        self._dispatcher.start()
        self._thread.start()
        return self

    def stop(self, timeout: float | None = None) -> None:
        """Step down at once, resign the term, unregister, and join the threads."""
        with self._lock:
            if not self._started:
                return
            self._stopping = True
            self._drop_lead(RevokeReason.STOPPED)
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
            self._live = None
        self._dispatch_sleeper.wake()
        if self._dispatcher is not None and self._dispatcher is not threading.current_thread():
            self._dispatcher.join(timeout)
        with self._lock:
            self._started = False
            subs = list(self._subscriptions)
        for sub in subs:
            with sub._cond:
                sub.closed = True
                sub._cond.notify_all()

    def resign(self, wait: bool = True, timeout: float | None = None) -> bool:
        """Step down now and stay out for ``resign_backoff``; False if not leading.

        Belief ends before the database is told, so nothing runs as leader during the
        handoff. With ``wait``, returns after the term has been resigned in the database.
        """
        with self._lock:
            if self._lead is None and self._held_term is None:
                return False
            self._resign_done.clear()
            self._resign_requested = True
            self._backoff_until = self._clock.monotonic() + self.config.resign_backoff
            self._drop_lead(RevokeReason.RESIGNED)
        self._sleeper.wake()
        if wait:
            self._resign_done.wait(timeout if timeout is not None else self.config.call_timeout + 1)
        return True

    def __enter__(self) -> Elector:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- belief (call with self._lock held) --------------------------------------------------

    def _post(self, item: Transition | BaseException) -> None:
        self._events.append((item, list(self._subscriptions)))
        self._dispatch_sleeper.wake()

    def _transition(self, kind: str, term: int, reason: RevokeReason | None = None) -> Transition:
        self.stats.transition(kind, reason.value if reason is not None else "won")
        return Transition(
            kind, self.namespace, term, self.candidate_id, reason, self._clock.monotonic()
        )

    def _set_lead(self, lead: Lead | None) -> None:
        self._lead = lead
        for watcher in self._trust_watchers:
            try:
                watcher(None, None) if lead is None else watcher(lead.term, lead.trusted_until)
            except Exception:
                log.exception("a trust watcher raised; the election goes on")

    def _drop_lead(self, reason: RevokeReason) -> None:
        lead = self._lead
        if lead is not None:
            self._set_lead(None)
            self._post(self._transition("revoked", lead.term, reason))
            self._changed.notify_all()
            if self._live is not None and reason in (RevokeReason.EXPIRED, RevokeReason.LOST):
                # Let a follower have the lock now, even if this thread is stuck in a call
                # (the dispatcher drops an expired lead): our belief has ended. A resign
                # or stop releases it after the resign instead, so the row is vacant then.
                self._live.want(False)

    # -- the election thread ----------------------------------------------------------------

    def _run(self) -> None:
        next_heartbeat = self._clock.monotonic()
        stats = self.stats
        warnings = getattr(self.backend, "topology_warnings", None)
        if warnings is not None:  # what the database's set-up means for this election
            for line in warnings(liveness=self.config.liveness is not None):
                log.warning("election in namespace %r: %s", self.namespace, line)
        while not self._stopping:
            stats.busy_since = boottime()  # the health probe's "wedged" clock
            now = self._clock.monotonic()
            if self._resign_requested:
                self._do_resign()
                continue
            if self._register and now >= next_heartbeat:
                self._heartbeat()
                next_heartbeat = now + self._jittered(self.config.heartbeat_interval)
            if self._held_term is None:
                if now < self._backoff_until:
                    wait = self._backoff_until - now
                elif now < self._follow_until and not self._poke:
                    wait = self._follow_until - now
                else:
                    self._poke = False
                    wait = self._follower_step()
            elif now >= self._next_renew:
                wait = self._leader_step()
            else:
                wait = self._next_renew - now
            if self._register:
                wait = min(wait, next_heartbeat - self._clock.monotonic())
            stats.busy_since = None
            if wait > 0 and not self._stopping:
                self._sleeper.wait(wait)
        stats.busy_since = None
        self._shutdown()

    def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """One backend call with the attempt deadline; errors are reported, then raised."""
        op = getattr(fn, "__name__", "call")
        began = time.perf_counter()
        try:
            result = fn(*args, timeout=self.config.call_timeout, **kwargs)
        except Exception as exc:
            self.stats.call(op, time.perf_counter() - began, False)
            self._failures += 1
            with self._lock:
                self._post(exc)
            raise
        self.stats.call(op, time.perf_counter() - began, True)
        if self._failures:
            log.info("election database reachable again (namespace %r)", self.namespace)
            self._error_logged = None
        self._failures = 0
        return result

    def _retry_delay(self) -> float:
        return self._backoff(max(1, self._failures))

    def _follower_step(self) -> float:
        started = self._clock.monotonic()
        tag = self._tag()
        args = (self.namespace, self._token, self.candidate_id, self.config.ttl)
        # never below a term seen before, nor this host's clock (a promoted standby's
        # clock may be behind the primary that issued a term it never received)
        floor = max(self._greatest_term + 1, self._clock.wall_us())
        try:
            seen, waited = self._takeover_due(started)
            if seen is not None:
                # Holding the liveness lock for longer than the leader's delta: its
                # session ended before our grant, so its trust has ended (liveness.py).
                result = self._call(
                    self.backend.take_over, *args, seen, waited, liveness=tag, floor=floor
                )
            else:
                result = self._call(self.backend.elect, *args, liveness=tag, floor=floor)
        except Exception:
            return self._retry_delay()
        lease = result.lease
        if lease is not None:
            self._last_lease = lease
            self._greatest_term = max(self._greatest_term, lease.term)
        if result.won and lease is not None:
            self._held_term = lease.term
            lease_until = trusted_until(started, self.config.ttl, self.config.safety_margin)
            lead = self._new_lead(lease.term, lease_until, tag is not None)
            deadline = lead.trusted_until
            if self._live is not None:
                self._live.want(True)  # a leader holds the lock: its grant tags the term
            with self._lock:
                if self._stopping or self._resign_requested:
                    return 0.0  # the loop resigns this term
                if self._clock.monotonic() >= deadline:
                    # Won, but too late to trust: give the term back and seek a fresh one.
                    log.warning(
                        "election in namespace %r won term %s after its trust window "
                        "ended (slow database?); resigning it",
                        self.namespace,
                        lease.term,
                    )
                    self._resign_requested = True
                    return 0.0
                self._set_lead(lead)
                self._post(self._transition("elected", lease.term))
                self._changed.notify_all()
            self._next_renew = started + self._jittered(self.config.renew_interval, up=False)
            return self._next_renew - self._clock.monotonic()
        if lease is not None and lease.held_by(self._token):
            # Still ours from a term we had given up on: renew it before trusting it.
            self._held_term = lease.term
            self._next_renew = 0.0
            return 0.0
        return self._follower_wait(lease)

    def _follower_wait(self, lease: Lease | None) -> float:
        """Sleep until the lease ends on the database's clock, capped by the poll interval.

        ``lease.remaining`` was computed by the database, so no host clock is compared
        with the lease. With working wakeups a resign wakes us early and a renewal pushes
        the next look back, so the cap is the slow ``fallback_interval``; without them,
        ``poll_interval`` bounds how long a clean handoff can take.
        """
        now = self._clock.monotonic()
        live = self._live
        if live is not None:
            if lease is not None and lease.held and lease.liveness_us is not None:
                return self._liveness_wait(live, lease, now)
            # Vacant, or a leader not bound by the lock (yet): let it have the lock.
            live.want(False)
        healthy = self._wakeup is not None and self._wakeup.healthy
        if lease is None or not lease.held:
            wait = self._jittered(self.config.poll_interval)
        else:
            wait = lease.remaining + random.uniform(0, min(0.05, lease.remaining * 0.01))
            wait = min(
                wait, self.config.fallback_interval if healthy else self.config.poll_interval
            )
        with self._lock:
            self._follow_until = now + wait
            self._look_by = now + max(wait, self.config.fallback_interval if healthy else 0.0)
        return wait

    def _on_wakeup(self, wakeup: Wakeup) -> None:
        """A hint from the backend (listener thread). Only ever changes *when* we look."""
        with self._lock:
            lease = self._last_lease
            if wakeup.kind == "renewed":
                if (
                    self._held_term is not None
                    or lease is None
                    or not lease.held
                    or wakeup.term != lease.term
                ):
                    return
                if self._live is None or lease.liveness_us is not None:
                    # The leader we last read renewed just now, so its lease ends about
                    # one lease length from now: nothing to look at before then (and a
                    # forged stream of these can delay us at most until _look_by).
                    start = lease.renewed_at_us or lease.acquired_at_us or lease.expires_at_us
                    length = (lease.expires_at_us - start) / 1_000_000
                    later = self._clock.monotonic() + length + random.uniform(0, 0.02)
                    self._follow_until = min(max(self._follow_until, later), self._look_by)
                    return
                # The term we read was not bound by the lock yet (every term starts so):
                # this renewal may be the one that tags it. Look now, to wait on the lock
                # for it rather than on its lease (8.5 s instead of 1 s after a crash
                # soon after a change of leader).
            if wakeup.kind == "elected" and wakeup.term == self._held_term:
                return  # our own
            self._poke = True
        self._sleeper.wake()

    def _leader_step(self) -> float:
        term = self._held_term
        assert term is not None
        started = self._clock.monotonic()
        if self._live is not None and self._lead is not None:
            self._live.want(True)  # a leader holds the lock (if it can: tagged from then on)
        tag = self._tag()
        with self._lock:
            lead = self._lead
            if tag is not None and lead is not None and not lead.tagged:
                # Belief tightens before the row says so, and loosens only after.
                self._set_lead(self._new_lead(term, lead.lease_until, True))
        try:
            result = self._call(
                self.backend.renew,
                self.namespace,
                self._token,
                term,
                self.config.ttl,
                liveness=tag,
            )
        except Exception:
            with self._lock:
                lead = self._lead
                if lead is None or self._clock.monotonic() >= lead.trusted_until:
                    return self._give_up(term, RevokeReason.EXPIRED)
                left = lead.trusted_until - self._clock.monotonic()
            self._next_renew = 0.0
            return min(self._retry_delay(), max(0.01, left / 3))
        lease = result.lease
        if lease is not None:
            self._last_lease = lease
            self._greatest_term = max(self._greatest_term, lease.term)
        with self._lock:
            lead = self._lead
            in_time = lead is not None and self._clock.monotonic() < lead.trusted_until
            if result.won and in_time:
                lease_until = trusted_until(started, self.config.ttl, self.config.safety_margin)
                self._set_lead(self._new_lead(term, lease_until, tag is not None))
                self._next_renew = started + self._jittered(self.config.renew_interval, up=False)
                return self._next_renew - self._clock.monotonic()
            if result.won:
                return self._give_up(term, RevokeReason.EXPIRED)
            if lease is None and in_time:
                # Lost to contention, nothing known: retry soon while still trusted.
                self._next_renew = 0.0
                return min(self.config.poll_interval, self.trusted_for / 3)
            if lease is not None and lease.term == term and lease.token == self._token:
                return self._give_up(term, RevokeReason.EXPIRED)
            self._held_term = None
            self._drop_lead(RevokeReason.LOST)
        return self._follower_wait(lease)

    def _give_up(self, term: int, reason: RevokeReason) -> float:
        """Stop believing (lock held) and resign the term so the next one is fresh."""
        self._drop_lead(reason)
        self._resign_requested = True
        return 0.0

    def _do_resign(self) -> None:
        term = self._held_term
        if term is not None:
            try:
                self._call(self.backend.resign, self.namespace, self._token, term)
            except Exception:
                log.debug("resign of term %s failed; it will expire", term, exc_info=True)
        if self._live is not None:
            self._live.want(False)  # after the resign: a granted follower finds it vacant
        with self._lock:
            self._held_term = None
            self._resign_requested = False
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
            self._live = None
        if self._register:
            with contextlib.suppress(Exception):  # reported by _call
                self._call(self.backend.unregister, self.namespace, self._token)
        with self._lock:
            self._changed.notify_all()
        self._dispatch_sleeper.wake()

    def _jittered(self, seconds: float, *, up: bool = True) -> float:
        """``seconds`` stretched or shrunk by up to the jitter fraction (only shrunk if not up)."""
        j = self.config.jitter
        return seconds * (1 + random.uniform(-j, j if up else 0))

    # -- the dispatcher thread --------------------------------------------------------------

    def _dispatch(self) -> None:
        while True:
            with self._lock:
                items = list(self._events)
                self._events.clear()
                lead = self._lead
                done = (
                    not items
                    and self._stopping
                    and not (self._thread is not None and self._thread.is_alive())
                )
            for item, subs in items:
                self._deliver(item, subs)
            if done:
                return
            if items:
                continue
            timeout = None
            if lead is not None:
                timeout = lead.trusted_until - self._clock.monotonic()
                if timeout <= 0:
                    with self._lock:
                        # The trust window ended and no renewal came: announce it now,
                        # even if the election thread is stuck in a database call.
                        if self._lead is lead:
                            self._drop_lead(RevokeReason.EXPIRED)
                    continue
            if self._stopping:
                timeout = 0.05 if timeout is None else min(timeout, 0.05)
            self._dispatch_sleeper.wait(timeout)

    def _deliver(self, item: Transition | BaseException, subs: list[Subscription]) -> None:
        on_elected, on_revoked, on_error = self._callbacks
        try:
            if isinstance(item, BaseException):
                self._log_error(item)
                if on_error is not None:
                    on_error(item)
                return
            # One line per change, every field in it, for a log search
            # ("election leader elected namespace=jobs").
            reason = item.reason.value if item.reason is not None else "won"
            log.info(
                "election leader %s namespace=%s term=%s candidate=%s reason=%s",
                item.kind,
                self.namespace,
                item.term,
                self.candidate_id,
                reason,
            )
            if item.kind == "elected":
                if on_elected is not None:
                    on_elected(item.term)
            else:
                assert item.reason is not None
                if on_revoked is not None:
                    on_revoked(item.term, item.reason)
        except Exception:
            log.exception("an election callback raised; the election goes on")
        if isinstance(item, Transition):
            for sub in subs:
                sub._put(item)

    def _log_error(self, exc: BaseException) -> None:
        """ERROR at the first failure of a kind, then again every ``_ERROR_REPEAT`` s.

        A worker that could not reach its election database at start said "ready" and
        logged one line, then ran with nobody leading: the repeat keeps it visible until
        the database answers (then one INFO line says so).
        """
        now = self._clock.monotonic()
        logged = self._error_logged
        if logged is not None and logged[0] is type(exc) and now - logged[1] < _ERROR_REPEAT:
            log.debug("election error (namespace %r): %s", self.namespace, exc)
            return
        first = logged[2] if logged is not None and logged[0] is type(exc) else now
        self._error_logged = (type(exc), now, first)
        log.error(
            "election error (namespace %r, %s): %s; this process cannot lead until it "
            "answers (failing for %.0fs; retrying)",
            self.namespace,
            self.backend.description,
            exc,
            now - first,
        )
