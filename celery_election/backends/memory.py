"""An in-process backend with the SQL backend's semantics, for tests.

Its "database clock" is the clock it is given (a FakeClock in tests), so a test moves time
and watches leases expire without sleeping. ``hold()`` and ``fail()`` inject the faults an
elector must survive: a call that hangs and a database that errors.
"""

from __future__ import annotations

import functools
import random
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace

from ..core.clock import Clock, RealClock
from ..core.config import validate_candidate_id, validate_namespace
from ..core.lease import Bid, CandidateInfo, ElectResult, Lease
from ..errors import BackendUnavailableError, SchemaMissingError
from .base import RunState, Wakeup, WakeupHandle
from .memory_beat import MemoryBeatStore
from .memory_hold import HoldRow, as_lease, extend, seen_waited, take, vacant, vacate
from .memory_keys import MemoryKeyStore
from .memory_runs import MemoryRuns

__all__ = ["MemoryBackend", "MemoryBeatStore"]


class _Wakeup:
    healthy = True

    def __init__(
        self, owner: MemoryBackend, namespace: str, callback: Callable[[Wakeup], None]
    ) -> None:
        self._owner, self.namespace, self.callback = owner, namespace, callback

    def close(self) -> None:
        with self._owner._lock:
            if self in self._owner._wakeups:
                self._owner._wakeups.remove(self)


class MemoryBackend:
    """Leases and candidates in a dict. Shared by electors of one process only."""

    description = "memory://"

    def __init__(
        self,
        clock: Clock | None = None,
        *,
        notify: bool = True,
        liveness: bool = False,
        silent_holders_lose: bool = True,
    ) -> None:
        """A memory database; with ``liveness``, in-process liveness locks.

        ``silent_holders_lose``: a holder silent for its delta loses its lock, as on the
        servers (``idle_session_timeout``, ``wait_timeout``); False keeps it until the
        holder's session closes, as a file lock does.
        """
        self.clock: Clock = clock or RealClock()
        self.notify = notify
        self.liveness = liveness
        self._locks = _Locks(self.clock, silent_holders_lose)
        self._lock = threading.RLock()  # re-entered: a beat claim writes its run rows
        self._leases: dict[str, HoldRow] = {}
        self._candidates: dict[tuple[str, str], CandidateInfo] = {}
        #: beat: (namespace, entry) -> the entry's run state (its runs: ``runs``)
        self._runs: dict[tuple[str, str], RunState] = {}
        self._installed = True
        self._fault: BaseException | None = None
        self._gate = threading.Event()
        self._gate.set()
        self._held = threading.Condition()
        self._blocked = 0
        self._wakeups: list[_Wakeup] = []
        #: Count of calls per method name, for tests that check how busy an elector is.
        self.calls: dict[str, int] = {}

    # -- fault injection --------------------------------------------------------------------

    def fail(self, exc: BaseException | None) -> None:
        """Make every call raise ``exc`` (None: stop failing)."""
        self._fault = exc

    @contextmanager
    def hold(self) -> Iterator[None]:
        """Make calls block until the block exits, like a stalled database."""
        self._gate.clear()
        try:
            yield
        finally:
            self._gate.set()

    def wait_for_blocked(self, count: int = 1, timeout: float = 5.0) -> bool:
        """Wait (real time) until ``count`` calls are blocked by :meth:`hold`."""
        with self._held:
            return self._held.wait_for(lambda: self._blocked >= count, timeout)

    def _enter(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1
        if not self._gate.is_set():
            with self._held:
                self._blocked += 1
                self._held.notify_all()
            try:
                self._gate.wait()
            finally:
                with self._held:
                    self._blocked -= 1
        if self._fault is not None:
            raise self._fault
        if not self._installed:
            raise SchemaMissingError("lease", self.description)

    def expire(self, namespace: str) -> None:
        """Test helper: end the current lease now, as if its ttl had passed."""
        with self._lock:
            row = self._leases.get(namespace)
            if row is not None:
                row.expires_at = min(row.expires_at, self.clock.wall_us())

    # -- schema -----------------------------------------------------------------------------

    def install(self) -> list[str]:
        created = [] if self._installed else ["(memory)"]
        self._installed = True
        return created

    def uninstall(self) -> None:
        with self._lock:
            self._installed = False
            self._leases.clear()
            self._candidates.clear()
            self._runs.clear()
            self.runs.clear()

    # -- the lease --------------------------------------------------------------------------

    def elect(
        self, bid: Bid, *, term: int | None = None, timeout: float | None = None
    ) -> ElectResult:
        if term is not None:
            return self.renew(bid.namespace, bid.token, term, bid.ttl, liveness=bid.liveness)
        validate_namespace(bid.namespace)
        validate_candidate_id(bid.holder_id)
        self._enter("elect")
        return self._take(bid, vacant)

    def take_over(
        self, bid: Bid, seen: Lease, waited: float, *, timeout: float | None = None
    ) -> ElectResult:
        """Take exactly the term ``seen`` if its trust is session-bound within ``waited``."""
        self._enter("take_over")
        return self._take(bid, seen_waited(seen.term, seen.token, waited))

    def _take(self, bid: Bid, can: Callable[[HoldRow, int], bool]) -> ElectResult:
        namespace = bid.namespace
        with self._lock:
            now = self.clock.wall_us()
            row = self._leases.setdefault(namespace, HoldRow())
            won = can(row, now)
            if won:
                take(row, now, bid)
            lease = as_lease(namespace, row, now)
        if won:
            self._wake(namespace, Wakeup("elected", lease.term))
        return ElectResult(won, lease)

    def renew(
        self,
        namespace: str,
        token: str,
        term: int,
        ttl: float,
        *,
        liveness: float | None = None,
        timeout: float | None = None,
    ) -> ElectResult:
        self._enter("renew")
        with self._lock:
            now = self.clock.wall_us()
            row = self._leases.get(namespace)
            if row is None:
                return ElectResult(False, None)
            won = self._holds(row, now, token, term)
            if won:
                extend(row, now, ttl, liveness)
            lease = as_lease(namespace, row, now)
        if won:
            self._wake(namespace, Wakeup("renewed", term))
        return ElectResult(won, lease)

    def resign(
        self, namespace: str, token: str, term: int, *, timeout: float | None = None
    ) -> bool:
        self._enter("resign")
        with self._lock:
            now = self.clock.wall_us()
            row = self._leases.get(namespace)
            if row is None or row.token != token or row.term != term:
                return False
            vacate(row, now)
        self._wake(namespace, Wakeup("resigned", term))
        return True

    def transfer(
        self,
        namespace: str,
        token: str,
        term: int,
        target: CandidateInfo,
        ttl: float,
        *,
        floor: int = 0,
        timeout: float | None = None,
    ) -> ElectResult:
        """Hand (token, term) to ``target`` if it is a live, eligible candidate."""
        self._enter("transfer")

        def can(row: HoldRow, now: int) -> bool:
            return self._holds(row, now, token, term) and self._may_lead(namespace, target, now)

        return self._take(Bid(namespace, target.token, target.candidate_id, ttl, floor=floor), can)

    def ask_transfer(
        self, namespace: str, seen: Lease, target: CandidateInfo, *, timeout: float | None = None
    ) -> bool:
        """Ask the holder of ``seen`` to hand it to ``target`` (sql.py: the same rules)."""
        self._enter("ask_transfer")
        with self._lock:
            now = self.clock.wall_us()
            row = self._leases.get(namespace)
            if row is None or seen.token is None:
                return False
            won = self._holds(row, now, seen.token, seen.term) and self._may_lead(
                namespace, target, now
            )
            if won:
                row.transfer_to = target.token
        return won

    @staticmethod
    def _holds(row: HoldRow, now: int, token: str, term: int) -> bool:
        return row.token == token and row.term == term and row.expires_at > now

    def _may_lead(self, namespace: str, target: CandidateInfo, now: int) -> bool:
        """Whether ``target`` is a live, eligible candidate of ``namespace`` (lock held)."""
        c = self._candidates.get((namespace, target.token))
        return c is not None and c.expires_at_us > now and c.eligible

    def current(self, namespace: str, *, timeout: float | None = None) -> Lease | None:
        self._enter("current")
        with self._lock:
            row = self._leases.get(namespace)
            return None if row is None else as_lease(namespace, replace(row), self.clock.wall_us())

    def namespaces(self, *, timeout: float | None = None) -> list[str]:
        self._enter("namespaces")
        with self._lock:
            return sorted(set(self._leases) | {ns for ns, _ in self._candidates})

    # -- candidates -------------------------------------------------------------------------

    def register(
        self,
        namespace: str,
        token: str,
        candidate_id: str,
        hostname: str,
        pid: int,
        ttl: float,
        *,
        eligible: bool = True,
        release: str | None = None,
        timeout: float | None = None,
    ) -> None:
        validate_namespace(namespace)
        validate_candidate_id(candidate_id)
        self._enter("register")
        with self._lock:
            now = self.clock.wall_us()
            self._candidates[(namespace, token)] = CandidateInfo(
                candidate_id=candidate_id,
                hostname=hostname,
                pid=pid,
                heartbeat_at_us=now,
                expires_at_us=now + round(ttl * 1_000_000),
                token=token,
                eligible=eligible,
                release=release,
            )

    def unregister(self, namespace: str, token: str, *, timeout: float | None = None) -> None:
        self._enter("unregister")
        with self._lock:
            self._candidates.pop((namespace, token), None)

    def candidates(self, namespace: str, *, timeout: float | None = None) -> list[CandidateInfo]:
        self._enter("candidates")
        with self._lock:
            now = self.clock.wall_us()
            return [
                c
                for (ns, _), c in self._candidates.items()
                if ns == namespace and c.expires_at_us > now
            ]

    def prune(self, namespace: str, *, timeout: float | None = None) -> int:
        self._enter("prune")
        with self._lock:
            now = self.clock.wall_us()
            dead = [
                k
                for k, c in self._candidates.items()
                if k[0] == namespace and c.expires_at_us <= now
            ]
            for k in dead:
                del self._candidates[k]
            return len(dead)

    # -- beat -------------------------------------------------------------------------------

    @functools.cached_property
    def beat(self) -> MemoryBeatStore:
        """The beat entries' shared run state, with the SQL store's semantics."""
        return MemoryBeatStore(self)

    @functools.cached_property
    def keys(self) -> MemoryKeyStore:
        """Key holds, with the SQL store's semantics (memory_keys.py)."""
        session = functools.partial(MemorySession, self._locks, clock=self.clock)
        return MemoryKeyStore(self.clock, self._enter, session)

    @functools.cached_property
    def runs(self) -> MemoryRuns:
        """The run rows, with the SQL store's semantics (memory_runs.py)."""
        return MemoryRuns(self._leads_now, self.clock.wall_us, self._enter, self._lock)

    def _leads_now(self, namespace: str, term: int) -> bool:
        """Whether ``term`` holds ``namespace``'s lease now (a run claim's fence)."""
        with self._lock:
            row = self._leases.get(namespace)
            return row is not None and row.term == term and self.clock.wall_us() < row.expires_at

    # -- wakeups ----------------------------------------------------------------------------

    def subscribe_wakeups(
        self, namespace: str, callback: Callable[[Wakeup], None]
    ) -> WakeupHandle | None:
        """Wake the namespace's electors on resign and new terms (like PostgreSQL NOTIFY)."""
        if not self.notify:
            return None
        handle = _Wakeup(self, namespace, callback)
        with self._lock:
            self._wakeups.append(handle)
        return handle

    def _wake(self, namespace: str, wakeup: Wakeup) -> None:
        with self._lock:
            targets = [w for w in self._wakeups if w.namespace == namespace]
        for w in targets:
            w.callback(wakeup)

    # -- liveness ---------------------------------------------------------------------------

    def liveness_session(
        self, namespace: str, delta: float, max_wait: float
    ) -> MemorySession | None:
        """An in-process liveness lock (None unless built with ``liveness=True``).

        It behaves like the server's: a holder silent for ``delta`` on this backend's
        clock loses the lock, and ``kill_liveness`` ends a holder's session from outside.
        """
        if not self.liveness:
            return None
        return MemorySession(self._locks, namespace, delta, self.clock)

    def kill_liveness(self, namespace: str) -> bool:
        """Test helper: end the session holding ``namespace``'s lock (pg_terminate_backend)."""
        return self._locks.kill(namespace)

    def release_idle(self) -> None:
        """Nothing to release: no connections."""

    def topology_warnings(self, *, lock_on: bool) -> list[str]:
        """Nothing to say: one process, no replication."""
        return []

    def close(self) -> None:
        with self._lock:
            self._wakeups.clear()


class _Locks:
    """The liveness locks of one MemoryBackend: holder, and when each holder last spoke."""

    def __init__(self, clock: Clock, silent_holders_lose: bool) -> None:
        self.clock, self.silent_holders_lose = clock, silent_holders_lose
        self.cond = threading.Condition()
        self._holders: dict[str, MemorySession] = {}
        #: standby slots: held until released (a waiting session is not silent)
        self.slots: dict[str, MemorySession] = {}

    def holder(self, namespace: str) -> MemorySession | None:
        """The live holder (cond held); a holder silent for its delta loses the lock."""
        session = self._holders.get(namespace)
        if (
            session is not None
            and self.silent_holders_lose
            and self.clock.monotonic() - session.last_seen >= session.delta
        ):
            session.lost = True
            del self._holders[namespace]
            self.cond.notify_all()
            return None
        return session

    def free(self, namespace: str) -> bool:
        with self.cond:
            return self.holder(namespace) is None

    def kill(self, namespace: str) -> bool:
        with self.cond:
            session = self._holders.pop(namespace, None)
            if session is not None:
                session.lost = True
                self.cond.notify_all()
            return session is not None

    def take(self, namespace: str, session: MemorySession) -> bool:
        if self.holder(namespace) is None:
            self._holders[namespace] = session
            session.lost = False
            session.last_seen = self.clock.monotonic()
            return True
        return False

    def drop(self, namespace: str, session: MemorySession) -> None:
        if self._holders.get(namespace) is session:
            del self._holders[namespace]
            self.cond.notify_all()


class MemorySession:
    """The memory backend's liveness session (see ``MemoryBackend.liveness_session``)."""

    def __init__(self, locks: _Locks, namespace: str, delta: float, clock: Clock) -> None:
        self._locks, self.namespace, self.delta, self._clock = locks, namespace, delta, clock
        #: a holder silent for its delta loses the lock (the backend's choice)
        self.silent_holders_lose = locks.silent_holders_lose
        self.last_seen = 0.0
        self.lost = True
        self._interrupted = False
        self._slot: str | None = None

    def claim_slot(self, count: int) -> bool:
        with self._locks.cond:
            for n in random.sample(range(count), count):
                if self._slot is not None:
                    break
                name = f"{self.namespace}\0slot{n}"
                if self._locks.slots.setdefault(name, self) is self:
                    self._slot = name
            return self._slot is not None

    def _free_slot(self) -> None:
        """(cond held) Let another session have the slot."""
        name, self._slot = self._slot, None
        if name is not None and self._locks.slots.get(name) is self:
            del self._locks.slots[name]

    @property
    def has_lock(self) -> bool:
        with self._locks.cond:
            return not self.lost and self._locks.holder(self.namespace) is self

    def acquire(self, timeout: float) -> bool:
        end = time.monotonic() + timeout
        with self._locks.cond:
            while not self._locks.take(self.namespace, self):
                if self._interrupted:
                    self._interrupted = False
                    raise InterruptedError("liveness wait interrupted")
                left = end - time.monotonic()
                if left <= 0:
                    return False
                # also wakes to notice a holder gone silent (the server's idle timeout)
                self._locks.cond.wait(min(left, 0.01))
            self._free_slot()
            return True

    def ping(self) -> None:
        with self._locks.cond:
            if self.lost or self._locks.holder(self.namespace) is not self:
                self.lost = True
                raise BackendUnavailableError("memory liveness session lost")
            self.last_seen = self._clock.monotonic()

    def release(self) -> None:
        with self._locks.cond:
            self.lost = True
            self._free_slot()
            self._locks.drop(self.namespace, self)

    def interrupt(self) -> None:
        with self._locks.cond:
            self._interrupted = True
            self._locks.cond.notify_all()

    def ended(self, key: bytes) -> bool:
        """Whether the session named ``key`` ended (nobody holds its lock): a key holder's probe."""
        return self._locks.free(key.decode())

    def close(self) -> None:
        self.interrupt()
        self.release()
