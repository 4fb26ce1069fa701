"""What the elector needs from a backend.

Every step is atomic on the backend's side and decided there, with the backend's clock:
``elect`` takes a vacant or expired lease with a strictly greater term and never
preempts a live leader; ``renew`` and ``resign`` act only on the exact (token, term) they
are given, so a late call from an old term cannot touch a newer one.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from ..core import runstate
from ..core.lease import Bid, CandidateInfo, ElectResult, Lease
from ..core.runstate import Delivery, Row, Start

if TYPE_CHECKING:
    from .locks import LivenessSession
    from .sessions import KeySession

__all__ = [
    "BACKEND_MEMBERS",
    "Alive",
    "Backend",
    "BeatStore",
    "KeyStore",
    "PendingRun",
    "RunClaim",
    "RunRecord",
    "RunRequest",
    "RunState",
    "RunStore",
    "Wakeup",
    "WakeupHandle",
    "backend_problem",
    "next_run_count",
]


@dataclass(frozen=True)
class Wakeup:
    """A hint that the lease of a namespace may have changed. Never a decision.

    ``kind``: "elected", "renewed" or "resigned" from the row change that sent it; "lost"
    or "reconnected" from the listener itself (events may have been missed: look at the row).
    """

    kind: str
    term: int | None = None


class WakeupHandle(Protocol):
    """A registration for wakeups; ``close()`` ends it.

    ``healthy`` is False while wakeups cannot be relied on (listener down, or a probe
    showed that notifications are not delivered): the elector then polls.
    """

    @property
    def healthy(self) -> bool:
        """Whether wakeups are being delivered now."""

    def close(self) -> None:
        """Stop delivering wakeups to this registration."""


@dataclass(frozen=True)
class RunState:
    """A beat entry's shared run state, as the store holds it.

    ``last_run_us`` is when the entry last ran, in epoch microseconds on the *database's*
    clock (each beat converts at the boundary, so a host with a wrong clock neither
    stalls nor repeats the schedule); ``term`` is the leader term that claimed that run.
    ``identity`` names the entry the state belongs to (e.g. django-celery-beat's
    ``PeriodicTask`` id; ``None`` in rows written before it existed: any entry of that
    name): an entry deleted and re-created under the same name does not inherit it.
    """

    last_run_us: int
    total_run_count: int
    term: int
    identity: str | None = None


def next_run_count(expected: RunState | None, total_run_count: int | None) -> int:
    """The run count a won claim stores: the one given, else ``expected``'s + 1 (or 1)."""
    if total_run_count is not None:
        return total_run_count
    return 1 if expected is None else expected.total_run_count + 1


@dataclass(frozen=True)
class RunClaim:
    """The answer to a claim: whether it won, and what the store holds afterwards.

    ``leading`` is False when the lease no longer had the claimer's token and term: the
    claimer has lost its term in the database, whatever its own trust window says.
    ``answered`` is False when the store said nothing (a lost round, a claim given up).
    """

    won: bool
    state: RunState | None
    leading: bool
    answered: bool = True


@dataclass(frozen=True)
class RunRequest:
    """One entry's run to claim (``BeatStore.claim_runs``)."""

    entry_name: str
    expected: RunState | None
    last_run_us: int
    total_run_count: int | None = None
    identity: str | None = None
    #: the run is to be sent: the claim writes its row (``RunStore``), claimed until the
    #: broker accepted it (``RunStore.confirm``); a state stored with no send, e.g. a run
    #: skipped by a catch-up policy, has no row
    pending: bool = False
    task_name: str = ""  # the row's task (default: the entry's name)
    due_at: int | None = None  # when the run fell due (its history shows how late it went)


@dataclass(frozen=True)
class PendingRun:
    """A run a leader claimed and the broker has not accepted yet: its row, claimed.

    ``run`` is the run's key, the stored last run it follows (0: the entry's first run),
    or a "run now"'s request time (``run_now``); ``state`` is the entry's state (with that
    run stored) and the term that owes the run; ``claimed_us`` when it was claimed
    (database clock, epoch us).
    """

    entry_name: str
    run: int
    state: RunState
    claimed_us: int
    task_id: str = ""
    run_now: bool = False


def pending_run(
    namespace: str, entry: str, due: int, term: int, claimed_us: int, task_id: str,
    state: RunState | None,
) -> PendingRun | None:  # fmt: skip
    """A claimed row as a pending run: a "run now" (its id says so) or the entry's next.

    None: a run of an entry with no stored state, which no claim of a run writes.
    """
    now = task_id == runstate.run_now_task_id(namespace, entry, due)
    if state is None:
        if not now:
            return None
        state = RunState(0, 0, term)
    return PendingRun(entry, due, replace(state, term=term), claimed_us, task_id, now)


def check_batch(requests: Sequence[RunRequest]) -> None:
    """Refuse a batch whose outcome would depend on the order, or on its statement.

    An entry named twice, or runs to send beside states to store (one statement writes
    the rows of the whole batch).
    """
    names = [r.entry_name for r in requests]
    if len(set(names)) != len(names):
        raise ValueError("claim_runs: an entry appears twice in one batch")
    if len({r.pending for r in requests}) > 1:
        raise ValueError("claim_runs: a batch is all runs to send or all states to store")


class BeatStore(Protocol):
    """Beat entries' shared run state, advanced only by the leader that holds the lease.

    The fence of a beat send: ``claim_runs`` is a compare-and-set of each entry's run
    state under the claimer's (token, term), in one statement that also locks the lease
    row (docs/design.md, rule 6). Every leader that saw the same state claims the same run,
    whatever the schedule type, so one run is sent at most once even in a split brain.
    """

    def load_runs(self, namespace: str, *, timeout: float | None = None) -> dict[str, RunState]:
        """Every entry's run state in ``namespace``, by entry name."""

    def claim_runs(
        self,
        namespace: str,
        token: str,
        term: int,
        requests: Sequence[RunRequest],
        *,
        timeout: float | None = None,
    ) -> list[RunClaim]:
        """Record each request's run after its ``expected`` (None: the entry never ran).

        A request wins only if the stored (last run, run count) still equals
        ``expected``'s (no state stored for None) and the run stored at ``expected`` is not
        claimed and unconfirmed; a lease that no longer has this token and term, unexpired,
        refuses the whole batch. A lost claim reports the stored state as it is. The new
        state has ``last_run_us``, ``total_run_count`` (default: ``expected``'s + 1, or 1)
        and ``identity``; with ``pending``, the same transaction writes the run's row (task
        id ``runstate.run_task_id`` of the new state), claimed under ``term``. Answers in
        order; few statements for many entries, so a burst of due runs costs a round trip
        per batch, not per entry.
        """

    def pending_runs(self, namespace: str, *, timeout: float | None = None) -> list[PendingRun]:
        """The runs whose rows are claimed and not confirmed (any term), oldest first.

        At most one scheduled run per entry (the entry's next run is not claimed before its
        last one is confirmed, started or dropped), and any "run now"s.
        """


class KeyStore(Protocol):
    """Key holds: leadership of one key at a time, tied to the holder's liveness.

    Each step is one conditional statement by primary key, the new term computed in SQL
    (docs/design.md, rule 1), exactly as the lease's: ``hold`` takes a vacant or expired
    key, ``take_over`` an exact (token, term) whose holder's session ended, ``renew`` and
    ``release`` act only for the holder's token.
    """

    def hold(self, bid: Bid, *, timeout: float | None = None) -> ElectResult:
        """Take ``bid.key`` if vacant or expired, with a strictly greater term.

        ``bid.liveness`` tags the hold with the holder's session delta (others may take
        it over once that session ended); the row after the step is reported either way.
        """

    def take_over(
        self, bid: Bid, seen: Lease, waited: float, *, timeout: float | None = None
    ) -> ElectResult:
        """Take exactly the hold ``seen`` (term and token), tagged with a delta <= ``waited``.

        Only a caller whose own session found ``seen``'s holder session ended
        (``KeySession.ended``) calls this, ``waited`` seconds after that answer.
        """

    def renew(self, bid: Bid, *, timeout: float | None = None) -> list[Lease]:
        """Extend every unexpired hold of ``bid.token`` in one statement; the holds after it.

        The bid's key is aside: one renewal serves all of a holder's keys.
        """

    def release(
        self, namespace: str, key: str, token: str, term: int, *, timeout: float | None = None
    ) -> bool:
        """Vacate the hold of exactly (token, term); True if it was. The term stays."""

    def force_release(
        self, namespace: str, key: str, term: int, *, timeout: float | None = None
    ) -> bool:
        """An operator's release of exactly the term they saw (never a newer hold)."""

    def get(self, namespace: str, key: str, *, timeout: float | None = None) -> Lease | None:
        """The key's row as stored now, or None if it was never held."""

    def held(self, namespace: str, *, timeout: float | None = None) -> list[Lease]:
        """The unexpired holds of ``namespace``, by key."""

    def holder_session(self, token: str, delta: float) -> KeySession | None:
        """The holder ``token``'s liveness lock on a connection of its own; None: unsupported."""

    def holder_key(self, token: str) -> bytes:
        """The lock that names holder ``token`` (for ``KeySession.ended``)."""


#: ``alive(worker)``: whether the worker process named in a run row still lives.
Alive = Callable[[str], bool]
#: A run's end as ``RunStore.finish`` takes it: (namespace, key, delivery, outcome).
End = tuple[str, str, str, str]


@dataclass(frozen=True)
class RunRecord:
    """A run row as a store holds it: the run (core/runstate.py), and what operators read.

    Times are epoch microseconds on the database's clock: ``created_us`` when the row was
    written first (its claim, or its first start), ``ended_us`` when it ended or dropped.
    """

    key: str
    row: Row
    task_name: str = ""
    hostname: str = ""  # its last starter's
    created_us: int = 0
    ended_us: int | None = None


class RunStore(Protocol):
    """One row per run (core/runstate.py): each call one transition, atomic (docs/workers.md)."""

    def start(
        self, namespace: str, d: Delivery, alive: Alive, *, task_name: str = "", hostname: str = "",
        ends: Sequence[End] = (),
    ) -> Start:  # fmt: skip
        """Delivery ``d`` is about to run the body: run, skip or put off; its row written.

        ``ends``: earlier runs' ends (as :meth:`finish`'s arguments), written with this
        start, in its transaction: a worker's run then costs one commit. Written once
        this returns; not if it raises.
        """

    def release(self, namespace: str, key: str, delivery: str) -> bool:
        """A started delivery gives its run back before the body (it was put off)."""

    def confirm(self, namespace: str, task_ids: Collection[str]) -> int:
        """The broker accepted these beat runs: claimed -> sent; how many changed.

        Only a broker's acceptance confirms: whoever sent that copy, the run is out.
        """

    def drop(self, namespace: str, task_ids: Collection[str], why: str) -> int:
        """Claimed runs given up unsent (expired, entry removed); how many changed."""

    def finish(self, namespace: str, key: str, delivery: str, outcome: str) -> bool:
        """The body of ``delivery`` ended with ``outcome``: the run closes, if it still ran it."""

    def load(self, namespace: str, key: str) -> RunRecord | None:
        """The run of ``key``, or None."""

    def newest(
        self, namespace: str, *, task_id: str | None = None, limit: int = 100
    ) -> list[RunRecord]:
        """The newest runs (of one task id if given), newest first: for operators."""

    def prune(
        self, namespace: str, older_than: float, *, batch: int = 5000, history: bool = False
    ) -> int:
        """Delete up to ``batch`` runs written ``older_than`` s ago (database clock).

        ``history``: the runs a beat's claim wrote (its schedule's history), else the others.

        Not a claimed run: it holds its entry until it is sent.
        """


@runtime_checkable
class Backend(Protocol):
    """The storage an Elector runs the protocol against."""

    #: Where the election lives, safe to log (no password).
    description: str

    def install(self) -> list[str]:
        """Create the tables if they do not exist (idempotent, safe to race).

        Returns the names of the tables this call created (empty if all existed).
        """

    def uninstall(self) -> None:
        """Drop the tables if they exist."""

    def elect(
        self, bid: Bid, *, term: int | None = None, timeout: float | None = None
    ) -> ElectResult:
        """Take the lease if vacant or expired; with ``term``, renew that term instead.

        A new term is greatest(stored term + 1, the database's clock, ``floor``): the
        elector passes the greatest term it has seen + 1 and its host's clock, so a term
        lost with a failed-over primary is not issued again by a standby whose clock is
        behind. A floor only raises a term; it never touches the lease's times.

        ``won`` is True only if this step changed the row in the caller's favour; the
        lease is the row as stored after the step, or None if the step lost to contention
        (a lock timeout or a busy database) and the row could not be read. ``liveness``
        (seconds) tags the new term as trusted only within a liveness session's delta.
        """

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
        """Extend the lease held by exactly (token, term), if it has not expired.

        ``liveness`` sets the term's tag as in ``elect`` (None clears it).
        """

    def take_over(
        self, bid: Bid, seen: Lease, waited: float, *, timeout: float | None = None
    ) -> ElectResult:
        """Take exactly the term ``seen``, even before it expires, if its tag allows.

        The row must still hold the same term and holder, tagged with a liveness delta no
        longer than ``waited``. Only the holder of the namespace's liveness lock calls
        this, ``waited`` seconds after its grant: the old holder's session ended before
        the grant, and its trust ended at most delta after its last good ping, so no two
        leaders overlap.
        """

    def liveness_session(
        self, namespace: str, delta: float, max_wait: float
    ) -> LivenessSession | None:
        """A liveness lock for ``namespace`` on a connection of its own.

        None if this backend cannot hold one: then the lease protocol runs alone.
        """

    def resign(
        self, namespace: str, token: str, term: int, *, timeout: float | None = None
    ) -> bool:
        """Vacate the lease held by exactly (token, term); True if it was."""

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
        """Hand the unexpired (token, term) to ``target``, a live and eligible candidate.

        One conditional write naming the target: it holds a new, greater term, untagged,
        and believes it only once it has renewed it; or nothing changes. The row after it.
        """

    def ask_transfer(
        self, namespace: str, seen: Lease, target: CandidateInfo, *, timeout: float | None = None
    ) -> bool:
        """Ask the holder of the unexpired term ``seen`` to hand it to ``target``.

        Set on the row if both still hold (the target live and eligible), for the leader's
        next renewal; False if not.
        """

    def current(self, namespace: str, *, timeout: float | None = None) -> Lease | None:
        """The lease row as stored now, or None if the namespace never had one."""

    def namespaces(self, *, timeout: float | None = None) -> list[str]:
        """Every namespace with a lease or a candidate, sorted."""

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
        """Create or refresh this candidate's row; it is listed for ``ttl`` seconds.

        ``eligible``: False for a candidate that never takes a term (listed as such).
        ``release``: the release it runs (older ones defer to it: core/decisions.py).
        """

    def unregister(self, namespace: str, token: str, *, timeout: float | None = None) -> None:
        """Remove this candidate's row."""

    def candidates(self, namespace: str, *, timeout: float | None = None) -> list[CandidateInfo]:
        """Candidates whose heartbeat has not expired, oldest registration first."""

    def prune(self, namespace: str, *, timeout: float | None = None) -> int:
        """Delete expired candidate rows; the number deleted."""

    def subscribe_wakeups(
        self, namespace: str, callback: Callable[[Wakeup], None]
    ) -> WakeupHandle | None:
        """Call ``callback`` when the lease may have changed; None if unsupported.

        A wakeup is only a hint to look at the row now (or, for "renewed", that looking
        can wait): nothing is decided from it.
        """

    def release_idle(self) -> None:
        """Close the connections nobody is using (nothing to do for a backend without).

        Called by an elector about to wait long (a standby); the next call reconnects.
        """

    def topology_warnings(self, *, lock_on: bool) -> list[str]:
        """What the database's set-up means for an elector, one line each (read at its start).

        ``lock_on``: the elector's trust is bound by a liveness lock. Empty when there is
        nothing to say (or nothing can be read).
        """

    @property
    def beat(self) -> BeatStore:
        """The beat entries' shared run state in this backend."""

    @property
    def keys(self) -> KeyStore:
        """Key holds in this backend (singleton tasks)."""

    @property
    def runs(self) -> RunStore:
        """The run rows in this backend (run once on the workers: core/runstate.py)."""

    def close(self) -> None:
        """Release connections and threads (idempotent)."""


#: What an Elector's backend must provide: the Protocol's methods, properties and
#: attributes, less ``keys`` and ``runs`` (singleton tasks and workers use them; an
#: elector does not, and a user's own backend written before they existed still elects).
BACKEND_MEMBERS = tuple(
    sorted(
        name
        for name in {*vars(Backend), *Backend.__annotations__}
        if not name.startswith("_") and name not in ("keys", "runs")
    )
)


def backend_problem(obj: object) -> str | None:
    """Why ``obj`` cannot be an Elector's backend, or None; judged by what it can do.

    Not ``isinstance(obj, Backend)``: from Python 3.12 that check no longer sees what a
    proxy forwards through ``__getattr__``, and a user's wrapper around a real backend
    (tracing, metrics, a fault injector) was refused.
    """
    if isinstance(obj, type):
        return "a class, not an instance"
    missing = [name for name in BACKEND_MEMBERS if getattr(obj, name, None) is None]
    return f"it has no {', '.join(missing)}" if missing else None
