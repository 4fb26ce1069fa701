"""The beat's fence: the shared run state a leading scheduler claims each run in.

``LeaderSchedulerMixin`` (scheduler.py) keeps what concerns Celery's entries: it matches
them with the shared state, reserves, settles and sends them. What it needs from the
election and its database it asks of a :class:`BeatFence`:

* :meth:`~BeatFence.leadership`: who leads now, a read of memory (no I/O);
* :meth:`~BeatFence.promote`: a newly won term loads the shared run state and measures
  the database clock (I/O);
* :meth:`~BeatFence.claim` (and :meth:`~BeatFence.claim_runs` for reserved runs,
  :meth:`~BeatFence.store_states` for records): the compare-and-set of runs under the
  term, in one statement that locks the lease row (docs/design.md, rule 6), retried by
  one loop while this process still trusts its term; the fence keeps what the store then
  holds;
* :meth:`~BeatFence.may_send`: the check at a send of a run's :class:`~.runs.Claim`.

Times in the shared state are on the database's clock: :meth:`~BeatFence.to_db` and
:meth:`~BeatFence.from_db` convert at the boundary with the offset measured at each
promotion and every minute, so a beat host with a wrong clock neither stalls nor repeats
the schedule.

``BeatTerm`` (term, token) is what :class:`~.election.BeatElection` answers; it is
defined there (the election imports nothing of the fence) and named here with the rest.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Sequence
from datetime import datetime, timedelta, timezone
from typing import Any

from .. import metrics
from ..backends.base import PendingRun, RunClaim, RunRequest, RunState
from ..core.clock import boottime
from ..election.shared_state import SharedLeadership
from ..errors import ElectionError
from .burst_costs import real_now
from .election import BeatElection, BeatTerm
from .runs import NOT_LEADING, Claim

__all__ = ["NOT_LEADING", "BeatFence", "BeatTerm", "Claim", "claim_of", "scheduler_app"]

log = logging.getLogger("celery_election.beat")

EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_US = timedelta(microseconds=1)
_OFFSET_EVERY = 60.0  # seconds between two readings of the database clock (leader only)
RETIRED = "-"  # the identity of a stored entry a deploy removed (follow_deploys)


def scheduler_app(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The app among a Celery scheduler's constructor arguments (its first)."""
    return kwargs["app"] if "app" in kwargs else args[0]


class BeatFence:
    """The shared run state of one beat scheduler: its election, claims and clock."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.election: BeatElection | None = None  # started on first need (elect)
        #: A standalone beat's record for its publishers (beat.publish), written by its
        #: elector; set (by the Sender) before the election starts, taken back at the end.
        self.publishers_record: SharedLeadership | None = None
        self.runs: dict[str, RunState] = {}  # the shared state as this leader knows it
        self._loaded_term: int | None = None  # the term whose shared state was loaded
        self._lost_term: int | None = None  # a term a claim found over in the database
        self._offset_us = 0  # database clock - this host's clock
        self._next_offset = 0.0
        self.sleep: Callable[[float], None] = time.sleep  # between two tries of a claim

    # -- the election -----------------------------------------------------------------------

    def elect(self) -> BeatElection:
        """The scheduler's election, started on first need (a lazy scheduler's too)."""
        if self.election is None:
            self.election = BeatElection(self.app, self.publishers_record)
            log.info("beat election: %s", self.election.describe())
        return self.election

    def close(self) -> None:
        """Stop the election (it resigns); idempotent."""
        election, self.election = self.election, None
        if election is not None:
            election.close()

    @property
    def namespace(self) -> str:
        return self.election.namespace if self.election is not None else "?"

    # -- leadership -------------------------------------------------------------------------

    def leadership(self) -> BeatTerm | None:
        """Who leads now: this process's term and token, or None. No I/O.

        None also in a term a claim found over in the database (:meth:`claim_runs`).
        """
        election = self.election
        lead = election.leadership() if election is not None else None
        if lead is None or lead.term == self._lost_term:
            return None
        return lead

    @property
    def loaded_term(self) -> int | None:
        """The term whose shared state this process loaded (None: none since it last led)."""
        return self._loaded_term

    def demote(self) -> None:
        """Not leading: a term won later (even this one again) loads the state again."""
        self._loaded_term = None

    def promote(self, lead: BeatTerm) -> bool:
        """Newly leading: load the shared run state and measure the database clock.

        False if the state could not be loaded (the next tick tries again).
        """
        election = self.election
        assert election is not None
        self._next_offset = 0.0
        self.measure_offset()
        try:
            self.runs = election.store.load_runs(election.namespace)
        except ElectionError as exc:
            log.error("beat election: cannot load the shared schedule state (%s)", exc)
            return False  # loaded_term stays unset: try again next tick
        self._loaded_term = lead.term
        return True

    def may_send(self, claim: Claim | None) -> BeatTerm | None:
        """The leadership a send goes out under, or None: not sent.

        A reserved run (``claim``) only if its claim won and its term still leads; an
        unreserved send (None) while this process leads in a term whose state it loaded.
        """
        lead = self.leadership()
        if lead is None or lead.term != self._loaded_term:
            return None
        if claim is not None and (not claim.won or claim.term != lead.term):
            return None
        return lead

    # -- claims -----------------------------------------------------------------------------

    def claim(self, lead: BeatTerm, requests: Sequence[RunRequest]) -> list[RunClaim]:
        """Claim ``requests`` in one statement, retried while trusted (up to a renew interval).

        A claim that raised may have committed: a retry that finds exactly the state it
        tried to write, under its own term, counts it as its own. Without the retry, a
        database blip at a run's due time lost that run although this process went on
        leading (the chaos runs found it). The fence keeps what the store then holds.
        """
        election = self.election
        assert election is not None
        what = requests[0].entry_name if len(requests) == 1 else f"{len(requests)} runs"
        deadline = boottime() + election.settings.config.renew_interval
        delay, retried = 0.05, False
        while True:
            try:
                claims = election.store.claim_runs(election.namespace, lead.token, lead.term,
                                                   list(requests))  # fmt: skip
                break
            except ElectionError as exc:
                if boottime() + delay > deadline or election.leadership() != lead:
                    log.error("beat election: could not claim %s (%s); not sent", what, exc)
                    claims = [RunClaim(False, r.expected, True, answered=False) for r in requests]
                    retried = False
                    break
                log.warning("beat election: claim of %s failed (%s); retrying", what, exc)
            self.sleep(delay)
            delay, retried = min(delay * 2, 0.5), True
        if retried:
            claims = [_own(lead, r, c) for r, c in zip(requests, claims, strict=True)]
        for r, c in zip(requests, claims, strict=True):
            if c.state is not None:  # what the store holds after it, won or refused: shared
                self.runs[r.entry_name] = c.state
        return claims

    def store_states(self, lead: BeatTerm, requests: list[RunRequest]) -> None:
        """Claim ``requests`` in batches and keep what the store then holds for each.

        A new leader of 10,000 entries made 10,000 single claims (40 s) before its first
        send; a name twice (not from one dict) is claimed on its own.
        """
        batch: list[RunRequest] = []
        alone: list[RunRequest] = []
        names: set[str] = set()
        for r in requests:
            (alone if r.entry_name in names else batch).append(r)
            names.add(r.entry_name)
        if batch:
            self.claim(lead, batch)
        for r in alone:
            self.claim(lead, [r])

    def retire_absent(self, lead: BeatTerm, live: Collection[str]) -> None:
        """Retire stored entries whose names are not ``live`` (a deploy removed them).

        As PersistentScheduler drops them from its shelve: a name reused later starts
        fresh instead of inheriting the old entry's last run.
        """
        requests = [
            RunRequest(name, state, state.last_run_us, state.total_run_count, RETIRED)
            for name, state in list(self.runs.items())
            if name not in live and state.identity != RETIRED
        ]
        if requests:
            self.store_states(lead, requests)

    def claim_runs(self, lead: BeatTerm, requests: Sequence[RunRequest]) -> list[RunClaim]:
        """:meth:`claim` for reserved runs: counted, and a term found over ends acting.

        A claim refused because the term is over in the database ends this process's
        acting in that term (:meth:`leadership` answers None for it from now on).
        """
        results = self.claim(lead, requests)
        for request, result in zip(requests, results, strict=True):
            name = request.entry_name
            if result.won:
                metrics.count(metrics.key(metrics.BEAT, self.namespace, name, "claimed"))
                continue
            if not result.leading:
                log.warning("beat election: namespace=%s term=%s is over in the database; "
                            "%s not sent", self.namespace, lead.term, name)  # fmt: skip
                self._lost_term = lead.term
            state = result.state
            if state is not None and state != request.expected:
                log.info("beat election: %s already ran (term %s); not sent", name, state.term)
                metrics.count(metrics.key(metrics.BEAT, self.namespace, name, "refused"))
        return results

    # -- the run ledger ---------------------------------------------------------------------

    def pending_runs(self) -> list[PendingRun]:
        """The runs claimed and not confirmed in this namespace (by any term)."""
        election = self.election
        assert election is not None
        return election.store.pending_runs(election.namespace)

    def confirm(self, task_ids: list[str]) -> int:
        """The broker took these runs: their rows are sent (whichever term claimed them)."""
        election = self.election
        assert election is not None
        return election.backend.runs.confirm(election.namespace, task_ids)

    def drop(self, task_ids: list[str], why: str) -> int:
        """Give these claimed runs up unsent: their rows are dropped."""
        election = self.election
        assert election is not None
        return election.backend.runs.drop(election.namespace, task_ids, why)

    # -- the clock --------------------------------------------------------------------------

    def measure_offset(self) -> None:
        """Read the database clock against this host's (one statement, leader only).

        The shared state holds times every beat must agree on. With host clocks a beat
        whose clock was an hour fast stored runs an hour ahead, and the next leader then
        waited an hour (the chaos runs skew one process's clock). The offset is good to
        half a round trip; it is measured at each promotion and every minute.
        """
        election = self.election
        if election is None or boottime() < self._next_offset:
            return
        self._next_offset = boottime() + _OFFSET_EVERY
        try:
            before = real_now(self.app).timestamp()  # the clock Celery's entries are read on
            lease = election.backend.current(election.namespace)
            after = real_now(self.app).timestamp()
        except ElectionError as exc:
            log.warning("beat election: could not read the database clock (%s)", exc)
            return
        if lease is not None:
            offset = lease.db_now_us - round((before + after) / 2 * 1_000_000)
            if abs(offset) > 1_000_000:
                log.warning("beat election: this host's clock is %+.3fs off the database's; "
                            "the shared state follows the database", -offset / 1e6)  # fmt: skip
            self._offset_us = offset

    @property
    def offset_us(self) -> int:
        """The database clock minus this host's, in microseconds, as last measured."""
        return self._offset_us

    def to_db(self, when: datetime) -> int:
        """A host-clock time as stored: database-clock epoch microseconds."""
        aware = when if when.tzinfo is not None else when.replace(tzinfo=timezone.utc)
        return (aware - EPOCH) // _US + self._offset_us

    def from_db(self, us: int, like: Any) -> datetime:
        """A stored time on this host's clock, shaped like ``like`` (naive stays naive UTC)."""
        when = EPOCH + _US * (us - self._offset_us)
        if isinstance(like, datetime) and like.tzinfo is None:
            return when.replace(tzinfo=None)
        if isinstance(like, datetime):
            return when.astimezone(like.tzinfo)
        return when.astimezone(self.app.timezone)


def claim_of(lead: BeatTerm, request: RunRequest, result: RunClaim) -> Claim:
    """A reserved run's claim as its send checks it."""
    run = 0 if request.expected is None else request.expected.last_run_us
    return Claim(result.won, lead.term, run, request.last_run_us, time.time_ns())


def _own(lead: BeatTerm, request: RunRequest, claim: RunClaim) -> RunClaim:
    """A retried claim refused by its own earlier try (which committed) is won."""
    state = claim.state
    mine = state is not None and (state.term, state.last_run_us) == (lead.term, request.last_run_us)
    return RunClaim(True, state, True) if not claim.won and mine else claim
