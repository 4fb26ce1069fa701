"""An in-process backend with the SQL backend's semantics, for tests.

Its "database clock" is the clock it is given (a FakeClock in tests), so a test moves time
and watches leases expire without sleeping. ``hold()`` and ``fail()`` inject the faults an
elector must survive: a call that hangs and a database that errors.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace

from ..clock import Clock, RealClock
from ..config import validate_candidate_id, validate_namespace
from ..errors import SchemaMissingError
from ..term import CandidateInfo, ElectResult, Lease
from .base import Wakeup, WakeupHandle

__all__ = ["MemoryBackend"]


@dataclass
class _Row:
    term: int = 0
    token: str | None = None
    leader_id: str | None = None
    acquired_at: int | None = None
    renewed_at: int | None = None
    expires_at: int = 0


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

    def __init__(self, clock: Clock | None = None, *, notify: bool = True) -> None:
        self.clock: Clock = clock or RealClock()
        self.notify = notify
        self._lock = threading.Lock()
        self._leases: dict[str, _Row] = {}
        self._candidates: dict[tuple[str, str], CandidateInfo] = {}
        # beat: (namespace, entry) -> [last due, run count]; (ns, entry, due) -> [term, sent]
        self._beat_state: dict[tuple[str, str], list[int]] = {}
        self._ledger: dict[tuple[str, str, int], list[int | None]] = {}
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

    def install(self) -> None:
        self._installed = True

    def uninstall(self) -> None:
        with self._lock:
            self._installed = False
            self._leases.clear()
            self._candidates.clear()
            self._beat_state.clear()
            self._ledger.clear()

    # -- the lease --------------------------------------------------------------------------

    def _lease(self, namespace: str, row: _Row, now: int) -> Lease:
        return Lease(
            namespace=namespace,
            term=row.term,
            leader_id=row.leader_id,
            expires_at_us=row.expires_at,
            db_now_us=now,
            acquired_at_us=row.acquired_at,
            renewed_at_us=row.renewed_at,
            token=row.token,
        )

    def elect(
        self,
        namespace: str,
        token: str,
        candidate_id: str,
        ttl: float,
        *,
        term: int | None = None,
        timeout: float | None = None,
    ) -> ElectResult:
        if term is not None:
            return self.renew(namespace, token, term, ttl, timeout=timeout)
        validate_namespace(namespace)
        validate_candidate_id(candidate_id)
        self._enter("elect")
        with self._lock:
            now = self.clock.wall_us()
            row = self._leases.setdefault(namespace, _Row())
            won = row.token is None or row.expires_at <= now
            if won:
                row.term = max(row.term + 1, now)
                row.token, row.leader_id = token, candidate_id
                row.acquired_at = row.renewed_at = now
                row.expires_at = now + round(ttl * 1_000_000)
            lease = self._lease(namespace, row, now)
        if won:
            self._wake(namespace, Wakeup("elected", lease.term))
        return ElectResult(won, lease)

    def renew(
        self, namespace: str, token: str, term: int, ttl: float, *, timeout: float | None = None
    ) -> ElectResult:
        self._enter("renew")
        with self._lock:
            now = self.clock.wall_us()
            row = self._leases.get(namespace)
            if row is None:
                return ElectResult(False, None)
            won = row.token == token and row.term == term and row.expires_at > now
            if won:
                row.renewed_at = now
                row.expires_at = now + round(ttl * 1_000_000)
            lease = self._lease(namespace, row, now)
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
            row.token = row.leader_id = None
            row.expires_at = now
        self._wake(namespace, Wakeup("resigned", term))
        return True

    def current(self, namespace: str, *, timeout: float | None = None) -> Lease | None:
        self._enter("current")
        with self._lock:
            row = self._leases.get(namespace)
            return (
                None if row is None else self._lease(namespace, replace(row), self.clock.wall_us())
            )

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
            )

    heartbeat = register

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

    def _holds(self, namespace: str, token: str, term: int, now: int) -> bool:
        row = self._leases.get(namespace)
        return row is not None and (row.token, row.term) == (token, term) and row.expires_at > now

    def claim_tick(
        self,
        namespace: str,
        token: str,
        term: int,
        entry_name: str,
        due_us: int,
        *,
        retry: bool = False,
        timeout: float | None = None,
    ) -> bool:
        self._enter("claim_tick")
        with self._lock:
            key = (namespace, entry_name, due_us)
            if key in self._ledger:
                return retry and self._ledger[key][0] == term
            if not self._holds(namespace, token, term, self.clock.wall_us()):
                return False
            self._ledger[key] = [term, None]
            state = self._beat_state.setdefault((namespace, entry_name), [due_us, 0])
            state[0] = max(state[0], due_us)
            state[1] += 1
            return True

    def confirm_tick(
        self, namespace: str, entry_name: str, due_us: int, *, timeout: float | None = None
    ) -> None:
        self._enter("confirm_tick")
        with self._lock:
            row = self._ledger.get((namespace, entry_name, due_us))
            if row is not None:
                row[1] = self.clock.wall_us()

    def beat_entries(
        self, namespace: str, *, timeout: float | None = None
    ) -> dict[str, tuple[int, int]]:
        self._enter("beat_entries")
        with self._lock:
            return {e: (s[0], s[1]) for (ns, e), s in self._beat_state.items() if ns == namespace}

    def unconfirmed_ticks(
        self, namespace: str, before_term: int, *, timeout: float | None = None
    ) -> list[tuple[str, int, int]]:
        self._enter("unconfirmed_ticks")
        with self._lock:
            return sorted(
                ((e, due, int(row[0] or 0)) for (ns, e, due), row in self._ledger.items()
                 if ns == namespace and row[1] is None and (row[0] or 0) < before_term),
                key=lambda t: t[1],
            )  # fmt: skip

    def reclaim_tick(
        self,
        namespace: str,
        token: str,
        term: int,
        entry_name: str,
        due_us: int,
        old_term: int,
        *,
        timeout: float | None = None,
    ) -> bool:
        self._enter("reclaim_tick")
        with self._lock:
            row = self._ledger.get((namespace, entry_name, due_us))
            if row is None or row[0] != old_term or row[1] is not None:
                return False
            if not self._holds(namespace, token, term, self.clock.wall_us()):
                return False
            row[0] = term
            return True

    def prune_ledger(
        self, namespace: str, older_than_us: int, *, timeout: float | None = None
    ) -> int:
        self._enter("prune_ledger")
        with self._lock:
            old = [k for k in self._ledger if k[0] == namespace and k[2] < older_than_us]
            for k in old:
                del self._ledger[k]
            return len(old)

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

    def close(self) -> None:
        with self._lock:
            self._wakeups.clear()
