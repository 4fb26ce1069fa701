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
(election/lock_thread.py) trust also ends with the lock's proof; core/decisions.py has the rules.

Threads
=======

This module only composes; each part is a module of its own and none of them knows the
Elector:

- ``Belief`` (election/belief.py), the one owner of belief: begun, extended and ended there
  alone, from whichever thread (the election thread, ``resign()``, ``stop()``, the
  dispatcher when trust runs out, the lock thread's pings), and announced once.
- ``ElectionLoop`` (election/loop.py), the election thread: the one writer of the lease
  last read, the term held and the timers; the others only post to it (the lock thread's
  news, the backend's wakeups, resign and stop requests). What it does with what it knows
  is decided by the pure functions of core/decisions.py.
- ``LockThread`` (election/lock_thread.py), the lock thread: holds the liveness lock, publishes its
  ``Proof``.
- ``Announcer`` (election/announce.py), the dispatcher: events (``elected``, ``revoked`` with a
  reason, ``error``) reach callbacks and subscriptions there, in order, and a slow
  consumer delays only later events, never the protocol.

Failures never kill the thread. A follower retries with back-off; a leader keeps renewing
until its trust window ends, then steps down. ``stop()`` drops the belief first, then
resigns the term so a follower takes over at once, then unregisters the candidate.
"""

from __future__ import annotations

import socket
import threading
import uuid
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypedDict

from ..backends.base import Backend, backend_problem
from ..core.clock import Clock, RealClock, Sleeper
from ..core.config import ElectionConfig, Seconds, validate_candidate_id, validate_namespace
from ..core.decisions import LockNews, Proof
from ..core.identity import new_candidate_id
from ..core.lease import Lease
from ..core.stats import ElectorStats
from ..core.transfer import Transfer, TransferRefusedError, pick_target
from ..core.transitions import (
    Backoff,
    RevokeReason,
    State,
    Subscription,
    Transition,
    exponential_backoff,
)
from ..errors import ConfigurationError, ElectionError, NotLeaderError
from ..release import RELEASE
from .announce import Announcer
from .belief import Belief
from .lock_thread import LockThread, lock_proof, lock_status, start_lock_thread
from .loop import Candidate, ElectionLoop, Request

__all__ = [
    "Backoff",
    "Elector",
    "ElectorOptions",
    "ElectorSnapshot",
    "RevokeReason",
    "State",
    "Subscription",
    "Transition",
    "electors",
    "exponential_backoff",
]

#: every Elector made in this process (``electors()`` lists the started ones)
_electors: weakref.WeakSet[Elector] = weakref.WeakSet()


def electors() -> list[Elector]:
    """The electors of this process that have been started and not stopped.

    The metrics exporter and the health probes read them.
    """
    return [e for e in list(_electors) if e.snapshot().started]


class ElectorOptions(TypedDict, total=False):
    """The keyword arguments of ``Elector(backend, namespace, candidate_id, **options)``.

    AsyncElector takes and forwards the same (``**options: Unpack[ElectorOptions]``);
    tests/unit/test_elector.py holds this to Elector's own signature.
    """

    # ElectionConfig's fields (the timings, seconds), then Elector's keyword-only arguments
    ttl: Seconds
    renew_interval: Seconds
    poll_interval: Seconds
    jitter: Seconds
    safety_margin: Seconds
    call_timeout: Seconds
    resign_backoff: Seconds
    candidate_ttl: Seconds
    fallback_interval: Seconds
    liveness: Seconds
    standbys: Seconds
    config: ElectionConfig | None
    on_elected: Callable[[int], Any] | None
    on_revoked: Callable[[int, RevokeReason], Any] | None
    on_error: Callable[[BaseException], Any] | None
    backoff: Backoff | None
    clock: Clock | None
    register: bool
    eligible: bool
    release: str | None


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
    combination raises ConfigurationError here, before anything starts. ``eligible=False``
    (``election_eligible``): a candidate that takes part, registered and listed as
    ineligible, and never takes a term (it holds no liveness lock either). ``release``
    (``election_release``; default: this package's version): while a candidate of a newer
    release lives, this one leaves a vacancy to it for up to ``ttl`` (core/decisions.py).
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
        eligible: bool = True,
        release: str | None = None,
        **timings: Seconds,
    ) -> None:
        self.config = _config(config, timings)
        problem = backend_problem(backend)
        if problem is not None:
            raise ConfigurationError(
                f"backend must be a celery_election backend (see backend_from_url): got "
                f"{backend!r}: {problem}"
            )
        self.backend = backend
        self.namespace = validate_namespace(namespace)
        self.hostname = socket.gethostname()
        self._token = uuid.uuid4().hex
        if candidate_id is None:
            candidate_id = new_candidate_id(self.hostname)
        self.candidate_id = validate_candidate_id(candidate_id)
        self._clock: Clock = clock or RealClock()
        poll = self.config.poll_interval
        self._backoff = backoff or exponential_backoff(base=min(0.1, poll), cap=max(poll, 2.0))
        self._register = register
        #: it may take a term (else it follows only), and the release it registers
        self.eligible, self.release = _eligible(eligible), RELEASE if release is None else release
        #: counters for metrics and the health probe (celery_election.metrics)
        self.stats = ElectorStats()
        # The caller's side (start, stop, resign): one at a time.
        self._lock = threading.Lock()
        self._started = False
        self._thread: threading.Thread | None = None
        self._live: LockThread | None = None
        self._announcer = Announcer(
            self.namespace,
            backend.description,
            self._clock,
            self.stats,
            (on_elected, on_revoked, on_error),
            self._expire,
        )
        self._belief = Belief(
            self.namespace, self.candidate_id, self._clock, self._proof, self._announcer.post
        )
        #: the election thread's state: a new one per start()
        self._loop = self._new_loop(None)
        _electors.add(self)

    def __repr__(self) -> str:
        return (
            f"<Elector {self.candidate_id!r} namespace={self.namespace!r} "
            f"state={self.state.value} term={self.term}>"
        )

    # -- public view (no I/O, safe from any thread) -------------------------------------------

    def _proof(self) -> Proof:
        return lock_proof(self._live)

    @property
    def is_leader(self) -> bool:
        """True only while leading inside the trust window."""
        return self._belief.trusted() is not None

    @property
    def term(self) -> int | None:
        """The term this elector leads under (its fencing token), None when not leading."""
        lead = self._belief.trusted()
        return None if lead is None else lead.term

    @property
    def trusted_for(self) -> float:
        """Seconds of trust left (0 when not leading)."""
        lead = self._belief.trusted()
        if lead is None:
            return 0.0
        return max(0.0, self._belief.trust_end(lead) - self._clock.monotonic())

    @property
    def trusted_until(self) -> float | None:
        """The boot-time clock reading at which leadership stops being trusted."""
        lead = self._belief.trusted()
        return None if lead is None else self._belief.trust_end(lead)

    @property
    def token(self) -> str:
        """Return the instance token, a secret that renew, resign and beat claims need."""
        return self._token

    @property
    def leader_id(self) -> str | None:
        """The candidate id of the leader as last seen (this one's when leading)."""
        if self.is_leader:
            return self.candidate_id
        lease = self._loop.last_lease
        return lease.leader_id if lease is not None and lease.held else None

    @property
    def last_lease(self) -> Lease | None:
        """The lease row as the last step saw it."""
        return self._loop.last_lease

    @property
    def state(self) -> State:
        """What the elector is doing now."""
        if not self._started:
            return State.STOPPED
        if self._belief.closed:
            return State.STOPPING
        if not self._loop.resigned.is_set():
            return State.RESIGNING
        return State.LEADER if self.is_leader else State.FOLLOWER

    @property
    def liveness(self) -> str:
        """The liveness lock: "off", "holding" it, "waiting" for it, "standby", or "idle".

        Standby: it would wait, but the standby slots are taken (``standbys``): it holds
        no connection and tries again once per ``fallback_interval``. Idle: on, but
        nobody's trust is bound by the lock now (no leader, or one not bound by it), so
        it does not wait.
        """
        return lock_status(self._live)

    def sleepers(self) -> list[Sleeper]:
        """The waits of its election thread and dispatcher (for ``FakeClock.settled``)."""
        return [self._loop.sleeper, self._announcer.sleeper]

    def snapshot(self) -> ElectorSnapshot:
        """A look at the elector for probes and exporters; never takes the lock.

        Lock-free so that a probe answers even while the election thread is wedged.
        """
        lead, seen, thread = self._belief.trusted(), self._loop.last_lease, self._thread
        term = lead.term if lead is not None else seen.term if seen is not None else 0
        return ElectorSnapshot(
            started=self._started,
            running=thread is not None and thread.is_alive(),
            leading=lead is not None,
            term=term,
            trusted_until=None if lead is None else self._belief.trust_end(lead),
            failures=self._loop.failures,
        )

    def wait_for_leadership(self, timeout: float | None = None) -> bool:
        """Block until this elector leads (True) or ``timeout`` seconds pass (False)."""
        changed = self._belief.changed
        with changed:
            changed.wait_for(lambda: self.is_leader or self._belief.closed, timeout)
        return self.is_leader

    def watch_trust(self, watcher: Callable[[int | None, float | None], Any]) -> None:
        """Call ``watcher(term, trusted_until)`` on every change of trust, renewals included.

        ``(None, None)`` when leadership ends. Called synchronously by whichever thread
        changed the trust (the election thread; ``resign()`` or ``stop()``'s caller; the
        dispatcher when trust runs out; the lock thread when a ping lengthens it), under
        the lock of belief: it must be quick and must not call back into the elector.
        This is how a process publishes its trust window to others (the Celery worker's
        shared record does).
        """
        self._belief.watch(watcher)

    def subscribe(self) -> Subscription:
        """An ordered stream of this elector's transitions from now on."""
        return self._announcer.subscribe()

    # -- life cycle ----------------------------------------------------------------------------

    def start(self) -> Elector:
        """Start the election threads; returns at once (see wait_for_leadership)."""
        with self._lock:
            if self._started:
                raise ElectionError(f"{self!r} is already started")
            self._started = True
            self._token = self._token if self._thread is None else uuid.uuid4().hex
            self._live = None
            if self.eligible:  # the lock is for those who may lead
                self._live = start_lock_thread(
                    self.backend, self.namespace, self.config, self._clock, self._on_lock
                )
            self._loop = self._new_loop(self._loop)
            self._belief.open()
            self._thread = threading.Thread(
                target=self._loop.run, name=f"celery-election-{self.namespace}", daemon=True
            )
            self._announcer.start(f"celery-election-events-{self.namespace}", self._thread)
            self._thread.start()
        return self

    def stop(self, timeout: float | None = None) -> None:
        """Step down at once, resign the term, unregister, and join the threads."""
        with self._lock:
            if not self._started:
                return
            self._belief.end(RevokeReason.STOPPED, close=True)
            loop, thread, live = self._loop, self._thread, self._live
        loop.post(Request.STOP)
        if timeout is None:
            timeout = 3 * self.config.call_timeout + 1
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        if loop.wakeup is not None:
            loop.wakeup.close()
        if live is not None and (thread is None or not thread.is_alive()):
            live.close()  # normally closed by the loop, after the resign
        self._announcer.stop(timeout)
        with self._lock:
            self._started = False

    def resign(self, wait: bool = True, timeout: float | None = None) -> bool:
        """Step down now and stay out for ``resign_backoff``; False if not leading.

        Belief ends before the database is told, so nothing runs as leader during the
        handoff. With ``wait``, returns after the term has been resigned in the database.
        """
        loop = self._loop
        lead, held = self._belief.lead, loop.term
        if lead is None and held is None:
            return False
        self._belief.end(RevokeReason.RESIGNED, veto=max(held or 0, lead.term if lead else 0))
        loop.post(Request.RESIGN)
        if wait:
            loop.resigned.wait(timeout if timeout is not None else self.config.call_timeout + 1)
        return True

    def transfer(self, to: str, timeout: float | None = None) -> Lease:
        """Hand leadership to the live, eligible candidate ``to``; the lease it now holds.

        ``to``: its candidate id, or its node (``w2@host``). Belief here ends first; then
        one conditional write moves the term to the target with a new term, and the target
        believes it once it has renewed it (``celery election transfer`` asks the same
        through the database). Refused with ``TransferRefusedError`` (one line) if the
        target is unknown or not live, not eligible, or this elector; ``NotLeaderError``
        if this elector does not lead.
        """
        lead = self._belief.trusted()
        if lead is None:
            raise NotLeaderError(f"{self.candidate_id!r} does not lead {self.namespace!r}")
        target = pick_target(
            self.backend.candidates(self.namespace), to, self.namespace, self._token
        )
        ask = Transfer(target)
        self._loop.post(ask)
        ask.done.wait(timeout if timeout is not None else 2 * self.config.call_timeout + 1)
        result = ask.result
        if result is None or not result.won or result.lease is None:
            raise TransferRefusedError(
                f"the transfer to {target.candidate_id!r} did not happen (it stopped, or "
                f"this term ended meanwhile): the term was resigned; see election status"
            )
        return result.lease

    def __enter__(self) -> Elector:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- wiring (any thread) ----------------------------------------------------------------------

    def _new_loop(self, before: ElectionLoop | None) -> ElectionLoop:
        candidate = Candidate(
            self.namespace,
            self.candidate_id,
            self.hostname,
            self._token,
            self._register,
            self.eligible,
            self.release,
        )
        return ElectionLoop(
            self.config,
            self.backend,
            candidate,
            clock=self._clock,
            belief=self._belief,
            announcer=self._announcer,
            stats=self.stats,
            backoff=self._backoff,
            live=self._live,
            before=before,
        )

    def _on_lock(self, news: LockNews) -> None:
        """From the lock thread.

        A good ping lengthens a tagged leader's trust at once (``is_leader`` reads the
        proof), so the watchers hear of it here, on the lock thread, not when the
        election thread gets to it: stuck in a stalled call, it would publish a shorter
        window than the one the leader acts in (the history checker saw it on SQLite,
        whose lock pings need no database).
        """
        if news is LockNews.PINGED:
            self._belief.republish()
            return
        self._loop.post(news)
        self._announcer.sleeper.wake()  # trust may end earlier now: announce it on time

    def _expire(self) -> float | None:
        """For the dispatcher: end belief whose trust ran out, and let the lock go."""
        left, ended = self._belief.expire()
        live = self._live
        if ended is not None and live is not None:
            live.want(False)  # a follower may have the lock now: our belief has ended
        return left


def _eligible(eligible: object) -> bool:
    if not isinstance(eligible, bool):
        raise ConfigurationError(f"eligible must be True or False: got {eligible!r}")
    return eligible


def _config(config: ElectionConfig | None, timings: Mapping[str, Seconds | None]) -> ElectionConfig:
    """The timings from ``config`` or keyword arguments (ElectionConfig's fields), not both."""
    given = {k: v for k, v in timings.items() if v is not None}
    if config is not None and given:
        raise ConfigurationError(
            f"pass either config= or timing arguments, not both: got {sorted(given)}"
        )
    return config or ElectionConfig.create(**given)
