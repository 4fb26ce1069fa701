"""Leader-only beat: run ``celery beat -S celery_election.beat:LeaderScheduler`` everywhere.

The wrapped scheduler stays the only authority on *whether and when* an entry is due:
Celery's heap, ``is_due``, the per-entry guards, ``max_interval``, ``sync``, ``reserve``,
``schedules_equal`` and ``beat_cron_starting_deadline`` all run as they do in stock beat
(or in django-celery-beat's ``DatabaseScheduler``). The election adds four things:

* **Leadership gates the tick.** A follower sends nothing and looks again in 0.2 s (an
  in-memory flag, no I/O).
* **The shared state is loaded at promotion.** Each entry's run state (when it last ran,
  how often) lives in the election database. A new leader adopts it before its first
  tick, so it resumes where the old leader stopped; a run missed during the failover is
  caught up once, exactly as stock Celery does after a restart.
* **A runaway is held.** A schedule that answers "due" again too soon (Celery's crontab
  in a fall-back's repeated hour answers "due, next in 0 s" on every tick) is not sent
  again: see :func:`runaway_hold`. No stock scheduler has this guard.
* **The send is fenced.** When Celery reserves a due entry, the leader claims "the run
  after the state I saw" with a compare-and-set under its term, in one statement that
  locks the lease row (docs/design.md, rule 6). It sends only if that claim won and it still
  trusts its lease; a refused claim adopts the stored state (another leader ran it).
  Every leader that saw the same state claims the same run, whatever the schedule type
  (crontab, interval, solar, clocked, custom), so a run is sent at most once, even in a
  split brain. At most once, not exactly once: a leader that dies between its claim and
  its send loses that run.

The mixin keeps what concerns Celery's entries (matching them with the shared state,
the burst tick, reserve, settle and send); what it asks of the election database goes
through its :class:`~.fence.BeatFence` (leadership, promotion, claims, the database
clock), and what a schedule kept beside Celery's adds goes through its
:class:`~.policy.RunPolicy` (``LeaderScheduler`` plugs in the operable schedule's).

Times in the shared state are on the database's clock: each beat measures its offset
from it (at promotion and every minute) and converts at the boundary, so a beat host
with a wrong clock neither stalls nor repeats the schedule.

Under ``celery worker -B --election`` the embedded beat shares its worker's leadership
through the worker's shared record: it is not a second candidate. Nothing blocks in
``beat_init``: the elector starts in the background.

``LeaderSchedulerMixin`` gives the same to another scheduler class, e.g.::

    class LeaderDatabaseScheduler(LeaderSchedulerMixin, DatabaseScheduler):
        pass

Entries whose run state lives elsewhere than ``last_run_at``/``total_run_count`` (and
django-celery-beat's model) can override :meth:`LeaderSchedulerMixin.adopt_run_state`.

The shared state never overrides what an operator did, as stock would not (issue 26,
``tests/integration/test_django_workflows.py``): it belongs to the entry's identity
(:meth:`LeaderSchedulerMixin.run_state_identity`: django-celery-beat's ``PeriodicTask``
id), a row edited after the stored run wins (``_edited``), only the leader writes rows
and never backwards (``sync``), and ``LeaderScheduler`` follows ``beat_schedule``
changes between deploys as a restarted ``PersistentScheduler`` does (``follow_deploys``).
"""

from __future__ import annotations

import copy
import heapq
import itertools
import logging
import sys
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

from celery.beat import PersistentScheduler, Scheduler, event_t
from celery.beat import logger as _celery_log
from celery.schedules import crontab, schedstate
from celery.schedules import schedule as interval
from celery.utils.time import maybe_make_aware

from .. import metrics, shared_state
from ..backends.base import RunClaim, RunRequest, RunState
from ..clock import boottime
from ..errors import ConfigurationError, ElectionError, cannot_start
from ..schedule.cron import CronFields, next_occurrence
from ..settings import ElectionSettings
from ..shared_state import SharedLeadership
from .answers import Answers, shared_answer
from .election import backend_description
from .fence import NOT_LEADING, BeatFence, Claim, Leadership, scheduler_app
from .ops import OperableScheduleMixin
from .policy import DefaultRunPolicy, RunPolicy, has_row
from .publish import FAILED, FENCED, SENT, BurstRouter, Job, Publishers, Reply
from .rows import DjangoRowsMixin

__all__ = ["LeaderScheduler", "LeaderSchedulerMixin"]

log = logging.getLogger("celery_election.beat")

_FOLLOWER_TICK = 0.2  # seconds between two looks at the (in-memory) leadership flag
#: Celery guards each entry's is_due in populate_heap and tick (5.7+); before, one
#: raising entry stopped the whole tick
_GUARDED = hasattr(Scheduler, "_is_due_failed")
#: Due entries sent by one tick at most: a burst of 10,000 is 10 ticks with no wait between.
BURST = 1000
#: Seconds a schedule found equal to its copy is trusted without comparing it again, as
#: long as it is the same dict, of the same size, not changed through the scheduler.
_RECHECK_EVERY = 1.0
#: ... or this many times as long as the last full comparison took, if longer: the
#: safety net costs the tick thread at most 1/20 of its time (10,000 entries took 0.05 s
#: to compare, 1/6 of a burst's CPU when compared every second).
_RECHECK_COST = 20.0
#: ... but not within a burst (a tick that sent a full batch of BURST answers 0 and the
#: next one goes on with it), for up to this many seconds: the comparisons every second
#: cost a 10,000-entry burst 3.5 % of its tick thread. Stock's tick is as blind between
#: its own comparisons, and the identity checks still run at every tick.
_RECHECK_BURST = 10.0


#: A send the fence held: logged alike whether the beat or its publisher checked.
_NOT_LEADING_NOW = "beat election: %s: this process does not lead now; not sent"

#: The attribute a reserved entry carries its claim to the send in (see ``reserve``).
CLAIM_ATTR = "election_claim"


class LeaderSchedulerMixin(DjangoRowsMixin):
    """Make a Celery beat scheduler send only on the leader, each run at most once."""

    app: Any
    schedule: Any
    max_interval: float
    _heap: Any
    old_schedulers: Any

    #: Static entries follow deploys as PersistentScheduler's shelve does: at promotion,
    #: an entry new to the shared state counts from then (as in a beat started then),
    #: and stored entries missing from the schedule are retired (a name reused later
    #: starts fresh). For schedulers whose schedule is the whole truth (LeaderScheduler);
    #: not for django-celery-beat, whose disabled entries leave the schedule.
    follow_deploys = False

    _closed = False

    # -- set-up and tear-down ---------------------------------------------------------------

    def __init__(
        self,
        *args: Any,
        fence: BeatFence | None = None,
        policy: RunPolicy | None = None,
        **kwargs: Any,
    ) -> None:
        """Celery's arguments, and the collaborators to use.

        ``fence``: the shared run state's (default: one of its own); ``policy``: what a
        schedule kept beside Celery's adds (default: nothing).
        """
        self._fence = fence if fence is not None else BeatFence(scheduler_app(args, kwargs))
        self._policy: RunPolicy = policy if policy is not None else DefaultRunPolicy()
        # entry name -> the entry's (last_run_at, total_run_count) as matched with the
        # fence's shared state
        self._seen: dict[str, tuple[Any, Any]] = {}
        # a batch tick's reserved runs, claimed together (None: reserve claims at once)
        self._deferred: list[_Reserved] | None = None
        self._schedule_version = 0  # changes made through the scheduler's own methods
        self._equal: tuple[Any, Any, int, int] | None = None  # (old, new, len, version)
        self._equal_until = 0.0
        self._warned: dict[str, Any] = {}  # entry name -> the last run its runaway was logged for
        self._recording: list[RunRequest] | None = None  # a promotion's records, batched
        self._answers: Answers = {}  # crontab answers shared by a burst (shared_answer)
        self._router: BurstRouter | None = None  # the burst's router (_send_burst)
        self._burst_until = 0.0  # a burst goes on: the safety comparison waits till then
        self._publishers: Publishers | None = None  # election_beat_publishers (beat.publish)
        self._handed: dict[int, tuple[Any, _Send]] = {}  # a job's entry and fence, by key
        self._jobs = itertools.count()
        super().__init__(*args, **kwargs)

    def setup_schedule(self) -> None:
        self._start_publishers()
        super().setup_schedule()  # type: ignore[misc]
        try:
            self._fence.elect()
        except ConfigurationError as exc:
            # `celery beat` would log the exception with a long traceback (it catches
            # Exception around the scheduler's start); SystemExit passes through: one line
            # and exit 1, as a worker with bad settings ends. The real stderr: beat has
            # redirected sys.stderr to its log by now.
            print("Error: " + cannot_start(exc, "fix the election_* settings"), file=sys.__stderr__)
            raise SystemExit(1) from None

    def close(self) -> None:
        self._closed = True
        try:
            self._stop_publishers()  # what they sent goes into the final sync's history
            super().close()  # type: ignore[misc]  # its final sync, while still leading
        finally:
            self._fence.close()
            self._close_record()

    def wait_for_leadership(self, timeout: float) -> bool:
        """Block until this scheduler leads, e.g. in tests; False after ``timeout`` s.

        A lazy scheduler (``lazy=True``, set up for introspection) joins the election here.
        """
        return self._fence.elect().wait_for_leadership(timeout)

    @property
    def info(self) -> str:
        base = super().info  # type: ignore[misc]
        try:
            s = ElectionSettings.from_app(self.app)
            where = backend_description(s.url)
            ns = s.namespace if shared_state.current() is not None else s.beat_namespace
            line = f"    . election -> {where} namespace={ns!r}, ttl={s.config.ttl}s"
        except ElectionError as exc:
            line = f"    . election -> misconfigured: {exc}"
        return f"{base}\n{line}" if base else line

    # -- leadership -------------------------------------------------------------------------

    def _take_lead(self) -> Leadership | None:
        """The leadership to act under, or None; acts: a newly won term is promoted first.

        Not a query (the fence's ``leadership()`` is one): it starts the election if need
        be, promotes a term whose shared state is not loaded yet (:meth:`_promote`), and
        reads the database clock again every minute.
        """
        if self._closed:
            return None
        fence = self._fence
        fence.elect()
        lead = fence.leadership()
        if lead is None:
            fence.demote()
            return None
        if lead.term != fence.loaded_term and not self._promote(lead):
            return None
        fence.measure_offset()
        return lead

    def _promote(self, lead: Leadership) -> bool:
        """Newly leading: adopt the shared run state, not this process's memory."""
        fence = self._fence
        if not self._policy.promote(lead) or not fence.promote(lead):
            return False  # not loaded: try again next tick
        self._seen = {}
        if self._reconcile(lead):
            self._heap = None  # rebuilt by the wrapped scheduler from the adopted state
        if self.follow_deploys:
            # a deploy removed the stored entries this beat's schedule lacks
            fence.retire_absent(lead, self._policy.live_names(self.schedule))
        if hasattr(self, "_last_sync"):
            # sync at the first loop, as a beat started now would: the rows (and the
            # shelve) show the adopted state at once, not up to beat_sync_every later
            self._last_sync = None
        log.info(
            "beat election: leading namespace=%s term=%s; resumed %d entries from the shared state",
            fence.namespace,
            lead.term,
            len(fence.runs),
        )
        return True

    def tick(self, *args: Any, **kwargs: Any) -> float:
        if self._take_lead() is None:
            next_in = min(self.max_interval, _FOLLOWER_TICK)
        else:
            next_in = self._tick_burst()
        if next_in > 0:
            self._burst_until = 0.0  # no burst goes on
            self._collect()
        # the health probe's clock: a tick loop wedged in a send stops moving it
        metrics.mark_tick(self._fence.namespace, next_in)
        return next_in

    def _tick_burst(self) -> float:
        """Celery's ``Scheduler.tick``, except that a due entry brings the others due now.

        Stock sends one entry per tick and compares the whole schedule first, so a burst
        of N due entries cost O(N^2) and a claim per send. Here the change check is cheap
        (:meth:`schedules_equal`) and every entry due now (up to :data:`BURST`) is reserved,
        claimed in one batch (``claim_runs``) and sent in this tick. Each keeps its own
        fence: it is sent only if its claim won and this term still leads at its send.
        A top entry that is not due, or a heap changed under ``is_due``, is handled as
        stock handles it.
        """
        max_interval = self.max_interval
        if self._heap is None or not self.schedules_equal(
            self.old_schedulers,
            self.schedule,
        ):
            current = self.schedule
            self.old_schedulers = copy.copy(current)
            self.populate_heap()
            # a copy equals what it copies: no need to compare them at the next tick
            self._equal = (self.old_schedulers, current, len(current), self._schedule_version)
            self._equal_until = boottime() + _RECHECK_EVERY
        heap = self._heap
        if not heap:
            return float(max_interval)
        batch: list[tuple[Any, Any, float]] = []  # (event, next_time_to_run, now), popped
        while heap and len(batch) < BURST:
            event = heap[0]
            entry = event[2]
            now = self._when(entry, 0)  # type: ignore[attr-defined]
            if event[0] > now:
                if batch:
                    break
                return float(min(event[0] - now, max_interval))
            try:
                is_due, next_time_to_run = self.is_due(entry)
            except Exception:
                is_due, next_time_to_run = self._is_due_failed(entry)
            verify = heapq.heappop(heap)
            if verify is not event:  # the heap changed under is_due: look again
                heapq.heappush(heap, verify)
                if batch:
                    break
                return float(min(verify[0] - self._when(verify[2], 0), max_interval))  # type: ignore[attr-defined]
            if not is_due:
                # the heap says now, the entry later: stock reheaps it at that time
                delay = next_time_to_run if _numeric(next_time_to_run) else max_interval
                heapq.heappush(heap, event_t(self._when(entry, delay), event[1], entry))  # type: ignore[attr-defined]
                if batch or (heap and heap[0][2] is not entry):
                    break
                return float(min(self.adjust(delay), max_interval))  # type: ignore[attr-defined]
            batch.append((event, next_time_to_run, now))
        if len(batch) < BURST:
            self._burst_until = 0.0
        elif not self._burst_until:
            self._burst_until = boottime() + _RECHECK_BURST
        self._send_burst(heap, batch)
        return 0.0

    def _send_burst(self, heap: list[Any], batch: list[tuple[Any, Any, float]]) -> None:
        """Reserve every entry of ``batch``, claim them together, send, and reheap them.

        An entry goes back on the heap at the time its schedule named when it was asked
        (``now`` then, plus the answer), as Celery's ``_when`` reckons it: reckoned after
        the send, as stock does, the time moved later by how long the batch took to send
        before it, and cost another reading of Celery's (slow) clock per entry.
        """
        self._deferred = []
        nexts: list[Any] = []
        try:
            for event, _, _ in batch:
                nexts.append(self.reserve(event[2]))
        finally:
            deferred, self._deferred = self._deferred, None
            for event, _, _ in batch[len(nexts) :]:
                heapq.heappush(heap, event)  # not reserved (reserve raised): as they were
            self._settle_deferred(deferred)
        producer = self.producer  # type: ignore[attr-defined]
        self._router = BurstRouter(self.app.amqp.router, producer)
        publishers = self._publishers
        try:
            if publishers is not None and publishers.alive:
                self._hand_off(batch[: len(nexts)], publishers)
            else:
                for event, _, _ in batch[: len(nexts)]:
                    self.apply_entry(event[2], producer=producer)  # type: ignore[attr-defined]
        finally:
            self._router = None
            adjust = self.adjust  # type: ignore[attr-defined]
            for (event, next_time_to_run, now), next_entry in zip(batch, nexts, strict=False):
                when = now + (adjust(next_time_to_run) or 0)  # = _when(next_entry, next) then
                heapq.heappush(heap, event_t(when, event[1], next_entry))

    def _settle_deferred(self, deferred: list[_Reserved]) -> None:
        """Claim the deferred runs, one batch per leadership they were reserved under."""
        groups: dict[Leadership, list[_Reserved]] = {}
        for item in deferred:
            groups.setdefault(item.lead, []).append(item)
        for lead, items in groups.items():
            claims = self._fence.claim_many(lead, [item.request for item in items])
            for item, claim in zip(items, claims, strict=True):
                self._settle(item, claim)

    def schedules_equal(self, old: Any, new: Any) -> bool:
        """Celery's comparison, skipped while the schedule cannot have changed.

        Stock compares every entry on every tick (O(N) per send). A schedule found equal
        stays equal while it is the same dict, of the same size, changed by none of the
        scheduler's methods (``add``, ``update_from_dict``, ``merge_inplace``,
        ``install_default_entries``); a schedule replaced (a new dict: django-celery-beat's
        reload, a shelve read again after ``sync``) is compared. In case something writes
        into the dict directly, it is compared again every second anyway, or after 20
        times as long as the comparison took, for a schedule so large that it took longer
        than 50 ms.
        """
        if old is not None and new is not None and self._equal is not None:
            was_old, was_new, size, version = self._equal
            if (
                old is was_old
                and new is was_new
                and len(new) == size
                and version == self._schedule_version
                and boottime() < max(self._equal_until, self._burst_until)
            ):
                return True
        started = boottime()
        equal = bool(super().schedules_equal(old, new))  # type: ignore[misc]
        if equal and old is not None and new is not None:
            self._equal = (old, new, len(new), self._schedule_version)
            took = boottime() - started
            self._equal_until = boottime() + max(_RECHECK_EVERY, _RECHECK_COST * took)
        else:
            self._equal = None
        return equal

    def _changed(self) -> None:
        self._schedule_version += 1

    def add(self, *args: Any, **kwargs: Any) -> Any:
        self._changed()
        return super().add(*args, **kwargs)  # type: ignore[misc]

    def update_from_dict(self, *args: Any, **kwargs: Any) -> Any:
        self._changed()
        return super().update_from_dict(*args, **kwargs)  # type: ignore[misc]

    def merge_inplace(self, *args: Any, **kwargs: Any) -> Any:
        self._changed()
        return super().merge_inplace(*args, **kwargs)  # type: ignore[misc]

    def install_default_entries(self, *args: Any, **kwargs: Any) -> Any:
        self._changed()
        return super().install_default_entries(*args, **kwargs)  # type: ignore[misc]

    def populate_heap(self, *args: Any, **kwargs: Any) -> None:
        """Celery's own heap, after the entries adopted the shared state they lack.

        Celery before 5.7 let one entry that cannot compute its next run stop the whole
        heap (and beat): there each entry is guarded here, as 5.7 guards it.
        """
        self._reconcile()
        if _GUARDED:
            super().populate_heap(*args, **kwargs)  # type: ignore[misc]
            return
        self._heap = []
        for entry in self.schedule.values():
            try:
                is_due, delay = entry.is_due()
            except Exception:
                is_due, delay = self._is_due_failed(entry)
            when = self._when(entry, 0 if is_due else delay) or 0  # type: ignore[attr-defined]
            self._heap.append(event_t(when, 5, entry))
        heapq.heapify(self._heap)

    if not hasattr(Scheduler, "_is_due_failed"):  # Celery 5.7 has it

        def _is_due_failed(self, entry: Any) -> tuple[bool, float]:
            """One entry whose next run cannot be computed is retried later, alone."""
            log.error(
                "beat: Cannot calculate the next run of %r, trying again in %ss.",
                entry.name,
                self.max_interval,
                exc_info=True,
            )
            return False, self.max_interval

    def _reconcile(self, promoting: Leadership | None = None) -> bool:
        """Match entries that do not hold the shared state with it; True if any changed.

        An entry holds it when its ``last_run_at`` and ``total_run_count`` are the ones
        this leader matched with the stored state; a new leader (``promoting``: its term
        and token), or a schedule read again (django-celery-beat reloads it from its
        models), gives entries that must be matched: see :meth:`_match`.
        """
        changed = False
        if promoting is not None:
            self._recording = []  # new entries' records, claimed together below
        try:
            for name, entry in list(self.schedule.items()):
                if self._seen.get(name) != _state_of(entry):
                    changed = self._match(entry, promoting) or changed
        finally:
            recording, self._recording = self._recording, None
        if promoting is not None and recording:
            self._fence.store_states(promoting, recording)
        return changed

    def _match(self, entry: Any, promoting: Leadership | None) -> bool:
        """One entry against the shared state; True if the entry's state changed.

        * The stored state is another entry's (a different :meth:`run_state_identity`:
          deleted and re-created, a name retired by a deploy) or there is none: the entry
          keeps its own state, as stock keeps it (django-celery-beat's row, or the time
          the entry appeared). A static entry of :attr:`follow_deploys` that never ran
          here counts from the promotion, as in a beat started then (one that ran keeps
          the shelve's last run, as a restarted PersistentScheduler does), and is
          recorded at once: the next leader counts from the same point.
        * Its own row was edited after the stored run (:meth:`_edited`): the edit wins; the
          next run is claimed after the stored state, like any run.
        * Otherwise the entry adopts the stored state (its row lags: the old leader ran
          it since, or had not saved yet).
        """
        name = entry.name
        state = self._fence.runs.get(name)
        identity = self.run_state_identity(entry)
        if state is not None and state.identity in (None, identity):
            if self._edited(entry, state):
                log.info("beat election: %s was edited (last_run_at %s, run count %s); "
                         "the edit wins over the shared state", name, entry.last_run_at,
                         entry.total_run_count)  # fmt: skip
                self._seen[name] = _state_of(entry)
                return False
            self._adopt(entry, state)
            return True
        changed = False
        if promoting is not None and self.follow_deploys and self._policy.follows_deploys(entry):
            if not entry.total_run_count:  # it never ran here: when it appeared, not now
                entry.last_run_at = entry.default_now()
            self._record(promoting, entry, state, identity)
            changed = True
        self._seen[name] = _state_of(entry)
        return changed

    def run_state_identity(self, entry: Any) -> str:
        """Whose run state it is: an entry with another identity does not inherit it.

        django-celery-beat's entries: the ``PeriodicTask`` id (a deleted and re-created
        task starts fresh, as with stock); a dynamic entry of the operable schedule: when
        it was added (its policy says). Others: the name alone (``""``); a name that a
        deploy dropped is retired (:attr:`follow_deploys`).
        """
        identity = self._policy.identity(entry)
        if identity:
            return identity
        model = getattr(entry, "model", None)
        pk = getattr(model, "pk", None)
        return "" if pk is None else f"id:{pk}"

    def _edited(self, entry: Any, state: RunState) -> bool:
        """Whether the entry's own row holds an operator's edit newer than ``state``.

        Only entries with a row (django-celery-beat's ``model``) can be edited. A row is
        written by leaders only with stored states, and the stored state only moves on:
        a row that holds an older state lags (an earlier run count, saved before the
        stored run). Anything else was written by someone else: a last_run_at other than
        the stored one with the same run count (a forced run, a reset to None), a higher
        run count, or a row saved (``date_changed``: disabled and enabled again, changed
        in the admin) after the stored run.
        """
        if not has_row(entry) or entry.last_run_at is None:
            return False
        row_us = self._fence.to_db(entry.last_run_at)
        count = int(entry.total_run_count or 0)
        if count == state.total_run_count:
            return abs(row_us - state.last_run_us) > _SAME_TIME_US
        if count > state.total_run_count:
            return True
        changed = getattr(entry.model, "date_changed", None)
        return isinstance(changed, datetime) and self._fence.to_db(changed) > state.last_run_us

    def _record(self, lead: Leadership, entry: Any, state: RunState | None, identity: str) -> None:
        """Store a new entry's state under this term (the next leader counts from it).

        During a promotion's ``_reconcile`` the record waits for the others (one batch).
        """
        at = self._fence.to_db(entry.last_run_at)
        count = int(entry.total_run_count or 0)
        request = RunRequest(str(entry.name), state, at, count, identity)
        if self._recording is not None:
            self._recording.append(request)
            return
        self._fence.store_states(lead, [request])

    # -- adopting the shared state ----------------------------------------------------------

    def adopt_run_state(self, entry: Any, last_run_at: datetime, total_run_count: int) -> None:
        """Give ``entry`` the shared run state; override where an entry keeps it elsewhere.

        django-celery-beat's ``ModelEntry`` keeps it on its model too (one-off tasks check
        ``model.total_run_count``), so the model gets it as well.
        """
        entry.last_run_at = last_run_at
        entry.total_run_count = total_run_count
        model = getattr(entry, "model", None)
        if model is not None and hasattr(model, "last_run_at"):
            model.last_run_at = last_run_at
            model.total_run_count = total_run_count

    def _adopt(self, entry: Any, state: RunState) -> None:
        """Give ``entry`` the stored ``state`` (the fence's, as the store holds it)."""
        when = self._fence.from_db(state.last_run_us, entry.last_run_at or entry.default_now())
        row = (entry.last_run_at, entry.total_run_count)
        self.adopt_run_state(entry, when, state.total_run_count)
        self._seen[entry.name] = _state_of(entry)
        dirty = getattr(self, "_dirty", None)
        if has_row(entry) and isinstance(dirty, set) and row != (when, state.total_run_count):
            dirty.add(entry.name)  # the row lags: the next sync writes the adopted state

    # -- the runaway guard -----------------------------------------------------------------

    def is_due(self, entry: Any) -> Any:
        """Celery's answer, unless it would send ``entry`` again too soon (a runaway).

        Checked before the run is reserved, so a held send changes no state: Celery
        re-heaps the entry at the end of the hold, and then asks its schedule again. The
        first held send after a run is logged at WARNING, the others at DEBUG.
        """
        state = super().is_due(entry)  # type: ignore[misc]
        due, answer = state
        if not due:
            return state
        hold = runaway_hold(entry, self._answers)
        if hold is None:
            return state
        wait, why = hold
        again = self._warned.get(entry.name) == entry.last_run_at
        level = logging.DEBUG if again else logging.WARNING
        self._warned[entry.name] = entry.last_run_at
        log.log(level, "beat election: %s not sent: its schedule %r answered due (next in %ss), "
                "but %s; held %.3fs (runaway guard)", entry.name, entry.schedule, answer, why,
                wait)  # fmt: skip
        self._count(entry, "held")
        return schedstate(False, wait)

    # -- the fence --------------------------------------------------------------------------

    def reserve(self, entry: Any) -> Any:
        """Celery's reserve, fenced: claim the run in the shared state under this term.

        The claim travels with the entries to the send: Celery's tick sends the entry it
        gave (``apply_entry``), ``apply_async(advance=True)`` the one returned, so both
        carry it (``election_claim``) and the send takes it (:func:`_take_claim`).
        """
        name = entry.name
        was = (entry.last_run_at, entry.total_run_count)
        entry.__dict__.pop(CLAIM_ATTR, None)  # Celery's next(entry) copies its attributes
        new_entry = super().reserve(entry)  # type: ignore[misc]
        lead = self._take_lead()
        if lead is None:
            _give_claim(entry, new_entry, NOT_LEADING)
            self.adopt_run_state(new_entry, *was)
            return new_entry
        fence = self._fence
        expected = fence.runs.get(name)
        new_entry.last_run_at = self._policy.next_run_at(entry, new_entry)
        at = fence.to_db(new_entry.last_run_at or new_entry.default_now())
        count = int(new_entry.total_run_count or 0)
        identity = self.run_state_identity(new_entry)
        request = RunRequest(str(name), expected, at, count, identity)
        item = _Reserved(entry, new_entry, was, lead, request)
        if self._deferred is not None:  # a burst: claimed with the others (_send_burst)
            self._deferred.append(item)
            return new_entry
        self._settle(item, fence.claim(lead, item.request))
        return new_entry

    def _settle(self, item: _Reserved, result: RunClaim) -> None:
        """Act on a reserved run's claim: its entries carry it to the send.

        Refused, the entry adopts what is stored (another leader ran it), or else its own
        state again.
        """
        new_entry, request = item.new_entry, item.request
        claim = self._fence.settle(item.lead, request, result)
        _give_claim(item.entry, new_entry, claim)
        if claim.won:
            self._seen[new_entry.name] = _state_of(new_entry)
            return
        state = result.state  # what the store holds now
        ran = state is not None and state != request.expected  # another leader ran it
        if ran and state is not None and state.identity in (None, request.identity):
            self._adopt(new_entry, state)
            return
        self.adopt_run_state(new_entry, *item.was)

    def apply_async(
        self, entry: Any, producer: Any = None, advance: bool = True, **kwargs: Any
    ) -> Any:
        """Celery's send, only for a run this leader claimed (or, unreserved, while leading)."""
        if advance:
            entry = self.reserve(entry)
        send = self._send_under(entry)
        if send is None:
            return None
        return self._publish(entry, send, producer, **kwargs)

    def _send_under(self, entry: Any) -> _Send | None:
        """The fence at a send: its leadership and options, or None: not sent (logged).

        The options carry the election's headers: the term, and the run (the task can see
        which run it is, ``self.request.election_run``, e.g. to deduplicate or fence its
        own writes).
        """
        claim = _take_claim(entry)
        fence = self._fence
        checked = boottime()  # read before the check: the history's rule for an act
        leading = self._take_lead()  # a term won since the last tick is promoted first
        if claim is not None and not claim.won:
            log.debug("beat election: %s was not claimed by this leader; not sent", entry.name)
            return None
        lead = None if leading is None or fence.election is None else fence.may_send(claim)
        if lead is None:
            log.warning(_NOT_LEADING_NOW, entry.name)
            return None
        headers = dict(entry.options.get("headers") or {})
        headers.update(self._policy.send_headers(entry))
        headers["election_term"] = lead.term
        if claim is not None:
            headers["election_run"] = claim.run
        options = {**entry.options, "headers": headers}
        if self._router is not None and "router" not in entry.options:
            options["router"] = self._router  # send_task(router=...): see BurstRouter
        return _Send(lead, claim, checked, options)

    def _publish(self, entry: Any, send: _Send, producer: Any, **kwargs: Any) -> Any:
        """Celery's publish of ``entry`` with the fenced options, in this process."""
        original = entry.options
        entry.options = send.options
        try:
            result = super().apply_async(entry, producer, advance=False, **kwargs)  # type: ignore[misc]
        except BaseException:
            self._count(entry, "publish_failed")
            raise
        else:
            self._sent(entry, send, result, send.checked)
        finally:
            # Celery compares the schedule with a snapshot that holds this very entry: a
            # changed options dict there made every tick rebuild the whole heap.
            entry.options = original
        return result

    def _count(self, entry: Any, what: str) -> None:
        metrics.count(metrics.key(metrics.BEAT, self._fence.namespace, str(entry.name), what))

    def _sent(self, entry: Any, send: _Send, result: Any, checked: float) -> None:
        """A run went out (here or from a publisher): count it, keep its history and record."""
        self._count(entry, "sent")
        claim, term = send.claim, send.lead.term
        self._policy.sent(entry, result, term, None if claim is None else claim.run)
        election = self._fence.election
        if election is not None and election.recorder is not None and claim is not None:
            election.recorder.record("send", mono=checked, ns=election.namespace, term=term,
                                     entry=entry.name, run=claim.run, at=claim.at)  # fmt: skip

    # -- publisher processes (election_beat_publishers) -------------------------------------

    def _start_publishers(self) -> None:
        """Fork the ``election_beat_publishers``, before any connection or thread opens."""
        try:
            count = ElectionSettings.from_app(self.app).beat_publishers
        except ElectionError:
            return  # the election reports the settings' problems, all at once
        if not count or self._publishers is not None:
            return
        record = shared_state.current()  # embedded: the worker's record
        if record is None:  # standalone: one that this beat's elector writes
            record = SharedLeadership.create(published=False)
            self._fence.publishers_record = record
        self._publishers = Publishers(self.app, record, count)

    def _hand_off(self, batch: list[tuple[Any, Any, float]], publishers: Publishers) -> None:
        """Hand the batch's sends to the publishers; act on the replies to the batch before."""
        jobs = []
        for event, _, _ in batch:
            entry = event[2]
            _celery_log.info("Scheduler: Sending due task %s (%s)", entry.name, entry.task)
            send = self._send_under(entry)
            if send is None:
                continue
            key = next(self._jobs)
            self._handed[key] = (entry, send)
            options = {k: v for k, v in send.options.items() if v is not self._router}
            args = (str(entry.name), entry.task, entry.args, entry.kwargs, options)
            jobs.append(Job(key, *args, send.lead.term))
        replies, kept = publishers.hand(jobs)
        self._settle_replies(replies)
        for job in kept:  # no publisher took it: sent here, as apply_entry sends
            entry, send = self._handed.pop(job.key)
            try:
                self._publish(entry, send, self.producer)  # type: ignore[attr-defined]
            except Exception as exc:
                _celery_log.error("Message Error: %s", exc, exc_info=True)
        self._tasks_since_sync: int = self._tasks_since_sync + len(jobs)

    def _settle_replies(self, replies: list[Reply]) -> None:
        """Act on what the publishers did with the jobs handed to them."""
        for reply in replies:
            entry, send = self._handed.pop(reply.key)
            if reply.outcome == SENT:
                self._sent(entry, send, _Published(reply.task_id), reply.checked)
            elif reply.outcome == FENCED:
                log.warning(_NOT_LEADING_NOW, entry.name)
            else:  # FAILED, or LOST with its publisher (logged then)
                self._count(entry, "publish_failed")
                if reply.outcome == FAILED:
                    _celery_log.error("Message Error: %s", reply.error)

    def _collect(self) -> None:
        """Wait for the replies the publishers owe (the burst is over, or the beat stops)."""
        if self._publishers is not None and self._handed:
            self._settle_replies(self._publishers.collect())

    def _stop_publishers(self) -> None:
        publishers, self._publishers = self._publishers, None
        if publishers is not None:
            self._settle_replies(publishers.close())

    def _close_record(self) -> None:
        """The publishers' record goes after the election (its elector writes it to the end)."""
        record, self._fence.publishers_record = self._fence.publishers_record, None
        if record is not None:
            record.write(None, None)
            record.close()


class _Send(NamedTuple):
    """A send the fence let through: under which lead, for which claim, with what."""

    lead: Leadership
    claim: Claim | None
    checked: float  # boot-time clock, read before the fence check
    options: dict[str, Any]


class _Published(NamedTuple):
    """A publisher's send, as the history reads Celery's result: its task id."""

    id: str | None


@dataclass(frozen=True)
class _Reserved:
    """A run reserved under ``lead``: its claim's request (a burst's wait for the batch)."""

    entry: Any  # the entry reserve was given (Celery's tick sends this one)
    new_entry: Any  # the entry it returned (apply_async(advance=True) sends this one)
    was: tuple[Any, Any]  # the entry's (last_run_at, total_run_count) before reserve
    lead: Leadership
    request: RunRequest


class _Ticket:
    """A reserved run's claim, on both entries of the reservation: taken once, by its send.

    Shared so that the entry not sent (Celery keeps one of the two in its schedule)
    cannot carry the claim to a later, unreserved send of it (a "run now").
    """

    __slots__ = ("claim",)

    def __init__(self, claim: Claim) -> None:
        self.claim: Claim | None = claim


def _give_claim(entry: Any, new_entry: Any, claim: Claim) -> None:
    """Put a reserved run's claim on both entries of its reservation."""
    ticket = _Ticket(claim)
    setattr(entry, CLAIM_ATTR, ticket)
    setattr(new_entry, CLAIM_ATTR, ticket)


def _take_claim(entry: Any) -> Claim | None:
    """The claim an entry carries to its send, taken (None: an unreserved send).

    Never pickled into a shelve: ``ScheduleEntry.__reduce__`` names the fields it keeps.
    """
    ticket: _Ticket | None = entry.__dict__.pop(CLAIM_ATTR, None)
    if ticket is None:
        return None
    claim, ticket.claim = ticket.claim, None
    return claim


def _numeric(value: Any) -> bool:
    """Celery's ``is_numeric_value``: a delay, not None or a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


MIN_GAP = 1.0  # seconds: a schedule of no known period is not sent twice within this


def runaway_hold(entry: Any, answers: Answers | None = None) -> tuple[float, str] | None:
    """Seconds to hold a due ``entry`` and why, or None: sending it now is no runaway.

    * A crontab is sent only if its fields matched a wall-clock minute since its last run
      (``cron.next_occurrence``: each real occurrence, and a time a gap skipped at the
      gap's end), so never twice in one minute. Celery's crontab, last run in a fall-back's
      repeated hour before its time, answers due at every tick until that time comes round.
    * An interval (not ``relative``, which realigns to clock boundaries) is not sent again
      within ``run_every`` of its last run.
    * Any other schedule (solar, clocked, custom, relative) is not sent twice within
      :data:`MIN_GAP` (1 s).

    Only a counted run (``total_run_count`` > 0) is "sent" for the last two rules: an
    entry's ``last_run_at`` before its first run is when it appeared, and Celery's own
    tests send ``always due`` entries at once.

    ``answers``: a crontab's next occurrence, shared by equal crontabs whose last runs
    fell in the same minute (a burst's entries).
    """
    last = entry.last_run_at
    if last is None:
        return None
    schedule = entry.schedule
    now = maybe_make_aware(entry.default_now())
    last = maybe_make_aware(last)
    if isinstance(schedule, crontab):
        seen = shared_answer(
            answers, "seen", schedule, last, now,
            lambda: next_occurrence(CronFields.of(schedule), schedule.tz, last),
        )  # fmt: skip
        if seen is not None and seen > now:
            return (seen - now).total_seconds(), (
                f"its fields matched no minute since {last.isoformat()} (its last run, or "
                f"start); next at {seen.astimezone(schedule.tz).isoformat()}"
            )
        return None
    if not entry.total_run_count:
        return None
    if isinstance(schedule, interval) and not schedule.relative:
        period = schedule.run_every.total_seconds()
    else:
        period = MIN_GAP
    left = period - (now - last).total_seconds()
    if left > 0:
        return left, f"it ran {period - left:.3f}s ago ({last.isoformat()}), within {period:g}s"
    return None


_SAME_TIME_US = 1_000_000  # a row within 1 s of the stored run holds it (offsets move)


def _state_of(entry: Any) -> tuple[Any, Any]:
    """The run state an entry holds, as :meth:`LeaderSchedulerMixin._reconcile` compares it."""
    return entry.last_run_at, entry.total_run_count


class LeaderScheduler(OperableScheduleMixin, LeaderSchedulerMixin, PersistentScheduler):
    """PersistentScheduler that sends only on the elected beat, each run at most once.

    The local shelve still caches the schedule as in stock beat; the run state that
    decides is the shared one in the election database. Changes of ``beat_schedule``
    between deploys behave as with a restarted PersistentScheduler (``follow_deploys``).
    Entries added, paused, run or given policies at runtime (``celery_election.schedule``)
    are served beside it (``beat/ops.py``).
    """

    follow_deploys = True
