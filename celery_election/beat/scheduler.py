"""Leader-only beat: run ``celery beat -S celery_election.beat:LeaderScheduler`` everywhere.

The wrapped scheduler stays the only authority on *whether and when* an entry is due:
Celery's heap, ``is_due``, the per-entry guards, ``max_interval``, ``sync``, ``reserve``,
``schedules_equal`` and ``beat_cron_starting_deadline`` all run as they do in stock beat
(or in django-celery-beat's ``DatabaseScheduler``). The election adds four things:

* **Leadership gates the tick.** A follower sends nothing and looks again in 0.2 s.
* **The shared state is loaded at promotion.** Each entry's run state (when it last ran,
  how often) lives in the election database. A new leader adopts it before its first
  tick (``matching.py``), so it resumes where the old leader stopped; a run missed during
  the failover is caught up once, exactly as stock Celery does after a restart.
* **A runaway is held** (``guards.py``): a schedule that answers "due" again too soon is
  not sent again.
* **The send is fenced, and owed until the broker took it.** Each run goes due ->
  reserve -> claim -> send -> settle as a :class:`~.runs.Run` value: the leader claims
  "the run after the state I saw" with a compare-and-set under its term that locks the
  lease row (``fence.py``; docs/design.md, rule 6), and its :class:`~.sender.Sender`
  sends only if that claim won and it still trusts its lease; a refused claim adopts the
  stored state (another leader ran it). A claimed run stays pending in the database until
  the broker took it (``ledger.py``): a failed send is retried, a dead leader's pending
  runs are sent by the next at promotion, each send of a run under one task id.

:class:`LeaderSchedulerMixin` is the one class of ours over Celery's scheduler: it
overrides Celery's methods and calls collaborators with values, which return values: the
fence (leadership, claims, the database clock), the matching of entries with the shared
state, the guards, the sender (and the publisher processes), and the run policy (what a
schedule kept beside Celery's adds: ``LeaderScheduler`` plugs in the operable schedule,
``ops.ScheduleOps``). Only this class touches Celery's privates (``_heap``, ``_when``,
``_tasks_since_sync``, ``_last_sync``, django-celery-beat's ``_dirty``), each commented.

Embedded (``celery worker -B --election``), the beat shares its worker's leadership
(``election.py``). ``LeaderSchedulerMixin`` gives the same to another scheduler class::

    class LeaderDatabaseScheduler(LeaderSchedulerMixin, DatabaseScheduler):
        pass

The shared state never overrides what an operator did: it belongs to the entry's
identity (:meth:`LeaderSchedulerMixin.run_state_identity`), a row edited after the stored
run wins, only the leader writes rows, never backwards (``rows.py``), and
``LeaderScheduler`` follows ``beat_schedule`` between deploys (``follow_deploys``).
"""

from __future__ import annotations

import copy
import heapq
import itertools
import logging
import sys
import threading
from datetime import datetime
from typing import TYPE_CHECKING, Any

from celery.beat import Scheduler, event_t
from celery.schedules import schedstate

from .. import metrics
from ..backends.base import RunRequest
from ..core.clock import boottime
from ..errors import ConfigurationError, cannot_start
from . import rows
from .answers import numeric
from .burst_costs import CollectorPause, held
from .catchup import Decision
from .election import banner_line
from .fence import BeatFence, BeatTerm, claim_of, scheduler_app
from .guards import RunawayGuard, SameSchedule, is_due_failed
from .matching import Matching, state_of
from .policy import RunPolicy
from .runs import NOT_LEADING, Run
from .sender import Sender

__all__ = ["LeaderSchedulerMixin"]

log = logging.getLogger("celery_election.beat")

_FOLLOWER_TICK = 0.2  # seconds between two looks at the (in-memory) leadership flag
#: Celery guards each entry's is_due in populate_heap and tick (5.7+); before, one
#: raising entry stopped the whole tick
_GUARDED = hasattr(Scheduler, "_is_due_failed")
#: Due entries sent by one tick at most: a burst of 10,000 is 10 ticks with no wait between.
BURST = 1000
_TIES = itertools.count()  # the heap's tie-breaks (event_t's priority) of reheaped runs

if TYPE_CHECKING:  # what the mixin is mixed into, for its super() calls (Celery's: Any)
    from celery.beat import Scheduler as _Scheduler
else:
    _Scheduler = object


class LeaderSchedulerMixin(_Scheduler):
    """Make a Celery beat scheduler send only on the leader, each run once."""

    #: Static entries follow deploys as PersistentScheduler's shelve does: at promotion,
    #: an entry new to the shared state counts from then (as in a beat started then),
    #: and stored entries missing from the schedule are retired (a name reused later
    #: starts fresh). For schedulers whose schedule is the whole truth (LeaderScheduler);
    #: not for django-celery-beat, whose disabled entries leave the schedule.
    follow_deploys = False

    _closed = False
    _ticking: int | None = None  # the thread in a tick (a close from it: a signal handler's)
    _heap: Any  # Celery's heap of events (None: to be built)
    old_schedulers: Any  # Celery's copy of the schedule, as its tick last saw it

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
        schedule kept beside Celery's adds (default: :meth:`make_policy`).
        """
        self._fence = fence if fence is not None else BeatFence(scheduler_app(args, kwargs))
        self._policy = policy if policy is not None else self.make_policy(self._fence)
        self._matching = Matching(
            self._fence,
            self._policy,
            identity=self.run_state_identity,
            adopt=self.adopt_run_state,
            dirty=self._dirty_rows,
            follow_deploys=self.follow_deploys,
        )
        self._same = SameSchedule()
        self._collector = CollectorPause()
        self._ledger: dict[str, Run] = {}  # runs claimed through reserve(), by name: see reserve
        publish = super().apply_async  # Celery's own send (the sender fences it)
        self._sender = Sender(
            self._fence,
            self._policy,
            self._take_lead,
            lambda entry, producer, **kw: publish(entry, producer, advance=False, **kw),
        )
        self._guard = RunawayGuard(self._sender.count)
        super().__init__(*args, **kwargs)

    def make_policy(self, fence: BeatFence) -> RunPolicy:
        """The run policy of this scheduler's schedule (none beside Celery's by default)."""
        return RunPolicy()

    def setup_schedule(self) -> None:
        self._sender.start(self.app)
        super().setup_schedule()
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
        interrupted, self._closed = self._closed, True  # closed before: by a handler, mid-tick
        if self._ticking == threading.get_ident():
            return  # a signal handler's, inside the tick: beat's close at exit closes (tick)
        try:
            try:
                self._sender.close()  # what they sent goes into the final sync's history
                if interrupted and "connection" in self.__dict__:  # maybe mid-frame: Celery's
                    self.__dict__.pop("connection").collect()  # close (5.6 on) read for ever
                super().close()  # its final sync, while still leading
            finally:
                self._fence.close()
                self._sender.close_record()
        finally:
            self._collector.resume()
            self._policy.close()

    def wait_for_leadership(self, timeout: float) -> bool:
        """Block until this scheduler leads, e.g. in tests; False after ``timeout`` s.

        A lazy scheduler (``lazy=True``, set up for introspection) joins the election here.
        """
        return self._fence.elect().wait_for_leadership(timeout)

    @property
    def info(self) -> str:
        base, line = super().info, banner_line(self.app)
        return f"{base}\n{line}" if base else line

    # -- leadership -------------------------------------------------------------------------

    def _take_lead(self) -> BeatTerm | None:
        """The leadership to act under, or None; acts: a newly won term is promoted first.

        Not a query (the fence's ``leadership()`` is one): it starts the election if need
        be, promotes a term whose shared state is not loaded yet (:meth:`_promote`), and
        reads the database clock again every minute.
        """
        if self._closed:  # SIGTERM's handler closed it; its SystemExit may have been lost
            raise SystemExit()  # (py-amqp's cleanup replaced it): the beat must stop
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

    def _promote(self, lead: BeatTerm) -> bool:
        """Newly leading: adopt the shared run state, not this process's memory."""
        fence = self._fence
        if not self._policy.promote(lead) or not fence.promote(lead):
            return False  # not loaded: try again next tick
        self._matching.forget()
        if self._matching.reconcile(self.schedule, lead):
            self._heap = None  # Celery's heap: rebuilt by its tick from the adopted state
        if not self._sender.recover(lead, self.schedule, lambda: self.producer):
            fence.demote()  # the pending runs unread: promoted again at the next tick
            return False
        if self.follow_deploys:
            # a deploy removed the stored entries this beat's schedule lacks
            fence.retire_absent(lead, self._policy.live_names(self.schedule))
        if hasattr(self, "_last_sync"):
            # Celery's: sync at the first loop, as a beat started now would: the rows (and
            # the shelve) show the adopted state at once, not up to beat_sync_every later
            self._last_sync = None
        log.info(
            "beat election: leading namespace=%s term=%s; resumed %d entries from the shared state",
            fence.namespace,
            lead.term,
            len(fence.runs),
        )
        return True

    # -- the tick: due -> reserve -> claim -> send -> settle --------------------------------

    def tick(self, *args: Any, **kwargs: Any) -> float:
        """Celery's tick (:meth:`_tick`); a close on its thread meanwhile only marks it closed.

        Celery's SIGTERM handler closes the scheduler where the signal found it: closing
        mid-publish wrote into the interrupted write of the broker's socket, or read inside
        its interrupted read, and hung. The handler's SystemExit unwinds the tick, or the
        next tick's ``_take_lead`` raises it, and beat's close at exit closes.
        """
        self._ticking = threading.get_ident()
        try:
            return self._tick()
        finally:
            self._ticking = None

    def _tick(self) -> float:
        lead = self._take_lead()
        for run_now in self._policy.before_tick(lead):
            self._sender.send_now(run_now, self.producer)
        next_in = min(self.max_interval, _FOLLOWER_TICK) if lead is None else self._tick_burst()
        self._sender.settle(lead, lambda: self.producer, lambda: self.old_schedulers)
        if next_in > 0:  # the burst is over: its last replies first, then what it put off
            self._sender.collect()
            self._bursting(False)
        # the health probe's clock: a tick loop wedged in a send stops moving it
        metrics.mark_tick(self._fence.namespace, next_in)
        within = self._policy.next_tick_within()
        return float(next_in) if within is None else min(float(next_in), within)

    def _tick_burst(self) -> float:
        """Celery's ``Scheduler.tick``, except that a due entry brings the others due now.

        Stock sends one entry per tick and compares the whole schedule first, so a burst
        of N due entries cost O(N^2) and a claim per send. Here the change check is cheap
        (:meth:`schedules_equal`) and every entry due now (up to :data:`BURST`) is
        reserved, claimed in one batch and sent in this tick (:meth:`_send_burst`). Each
        keeps its own fence: it is sent only if its claim won and this term still leads at
        its send. A top entry that is not due, or a heap changed under ``is_due``, is
        handled as stock handles it.
        """
        if self._heap is None or not self.schedules_equal(self.old_schedulers, self.schedule):
            current = self.schedule
            self.old_schedulers = copy.copy(current)  # Celery's snapshot, as its tick takes
            self.populate_heap()
            # a copy equals what it copies: no need to compare them at the next tick
            self._same.found(self.old_schedulers, current, True, 0.0)
        heap = self._heap  # Celery's heap of (time, priority, entry): popped as its tick does
        if not heap:
            return float(self.max_interval)
        with held(self.app):  # burst_costs.py: one reading of Celery's clock per step
            batch, next_in = self._due_batch(heap)
        if not batch:
            return next_in
        self._bursting(len(batch) >= BURST)
        self._send_burst(heap, batch)
        return 0.0

    def _bursting(self, going_on: bool) -> None:
        """A tick sent a full batch (a burst goes on), or nothing is due now (it is over)."""
        self._same.burst(going_on)  # no whole-schedule comparison meanwhile (guards.py)
        self._collector.burst(going_on)  # nor a collection (burst_costs.py)
        self._policy.bursting(going_on)  # nor a history write (history.py)

    def _due_batch(self, heap: list[Any]) -> tuple[list[tuple[Any, Any, float]], float]:
        """Pop the events due now (up to :data:`BURST`) as (event, next time, now).

        None due: the seconds until the first is, as Celery's tick answers.
        """
        max_interval = self.max_interval
        batch: list[tuple[Any, Any, float]] = []
        while heap and len(batch) < BURST:
            event = heap[0]
            entry = event[2]
            now = self._when(entry, 0)  # Celery's clock, as its tick reads it
            if event[0] > now:
                return batch, float(min(event[0] - now, max_interval))
            try:
                is_due, next_time_to_run = self.is_due(entry)
            except Exception:
                is_due, next_time_to_run = self._is_due_failed(entry)
            verify = heapq.heappop(heap)
            if verify is not event:  # the heap changed under is_due: look again
                heapq.heappush(heap, verify)
                return batch, float(min(verify[0] - self._when(verify[2], 0), max_interval))
            if not is_due:
                # the heap says now, the entry later: stock reheaps it at that time
                delay = next_time_to_run if numeric(next_time_to_run) else max_interval
                heapq.heappush(heap, event_t(self._when(entry, delay), event[1], entry))
                if batch or (heap and heap[0][2] is not entry):
                    return batch, 0.0
                return batch, float(min(self.adjust(delay), max_interval))
            batch.append((event, next_time_to_run, now))
        return batch, 0.0

    def _send_burst(self, heap: list[Any], batch: list[tuple[Any, Any, float]]) -> None:
        """Reserve every entry of ``batch``, claim them together, send, and reheap them.

        An entry goes back on the heap at ``now`` when asked plus its schedule's answer, as
        ``_when`` reckons it (reckoned after the send, stock's way, the batch delayed it).
        """
        runs: list[Run] = []
        try:
            with held(self.app):
                for event, _, _ in batch:
                    runs.append(self._reserve(event[2]))
        finally:
            for event, _, _ in batch[len(runs) :]:
                heapq.heappush(heap, event)  # not reserved (reserve raised): as they were
            runs = self._claim(runs)
        producer = self.producer
        sender = self._sender
        try:
            with sender.burst(self.app.amqp.router, producer):
                if sender.publishers is not None and sender.publishers.alive:
                    # Celery's count of sends towards its next sync
                    self._tasks_since_sync += sender.hand_off(runs, producer)
                else:
                    self._ledger.update((run.name, run) for run in runs)
                    for run in runs:  # Celery's send, whose apply_async takes the run
                        self.apply_entry(run.entry, producer=producer)
        finally:
            for run in runs:
                self._ledger.pop(run.name, None)  # a send that never came: not owed later
            adjust = self.adjust
            for (_, next_time_to_run, now), run in zip(batch, runs, strict=False):
                # = _when(next_entry, next) then; unclaimed (the store said nothing): now
                when = now if run.claim is None else now + (adjust(next_time_to_run) or 0)
                # a tie-break of its own: with Celery's one priority (5), equal times (a
                # burst's, on the held clock) made heapq compare the entries' fields
                heapq.heappush(heap, event_t(when, next(_TIES), run.next_entry))

    def _reserve(self, entry: Any) -> Run:
        """Celery's reserve of ``entry``: the run it stands for, to be claimed."""
        was = state_of(entry)
        next_entry = super().reserve(entry)
        self._policy.reserved(entry, next_entry)
        lead = self._take_lead()
        if lead is None:
            self.adopt_run_state(next_entry, *was)
            return Run(entry, next_entry, was, None, None).claimed(NOT_LEADING)
        next_entry.last_run_at = self._policy.next_run_at(entry, next_entry)
        at = next_entry.last_run_at or next_entry.default_now()
        due_at = self._policy.due_at(entry, self._fence.runs.get(entry.name))  # its row keeps it
        request = self._matching.request(next_entry, at, pending=True, task_name=str(entry.task),
                                         due_at=due_at)  # fmt: skip
        return Run(entry, next_entry, was, lead, request)

    def _claim(self, runs: list[Run]) -> list[Run]:
        """Claim the reserved runs, one batch per leadership they were reserved under."""
        groups: dict[BeatTerm, list[tuple[int, RunRequest]]] = {}
        for i, run in enumerate(runs):
            if run.lead is not None and run.request is not None and run.claim is None:
                groups.setdefault(run.lead, []).append((i, run.request))
        out = list(runs)
        for lead, items in groups.items():
            results = self._fence.claim_runs(lead, [request for _, request in items])
            for (i, request), result in zip(items, results, strict=True):
                if result.answered:  # else it stays unclaimed: not sent, due again at once
                    out[i] = runs[i].claimed(claim_of(lead, request, result))
                self._matching.settle(out[i], result)
        return out

    # -- Celery's reserve and send ----------------------------------------------------------

    def reserve(self, entry: Any) -> Any:
        """Celery's reserve, fenced: the run is claimed under this term at once.

        Celery's tick then sends ``entry`` with ``apply_entry``, whose signature has no
        room for the claim: the run waits in the ledger (by entry name) for that send,
        which takes it once. A run refused there is never sent by that send; an entry
        sent with no run waiting (a "run now", an ``apply_async(advance=False)`` of an
        unreserved entry) goes out as an unreserved send.
        """
        (run,) = self._claim([self._reserve(entry)])
        self._ledger[run.name] = run
        return run.next_entry

    def apply_async(
        self, entry: Any, producer: Any = None, advance: bool = True, **kwargs: Any
    ) -> Any:
        """Celery's send, only for a run this leader claimed (or, unreserved, while leading)."""
        if advance:  # Celery's reserve, then the send that takes its run
            entry = self.reserve(entry)
        run = self._ledger.pop(entry.name, None)
        claim = None if run is None else (run.claim or NOT_LEADING)
        send = self._sender.prepare(entry, claim)
        if send is None:
            return None
        return self._sender.publish(entry, send, producer, **kwargs)

    # -- Celery's questions: is it due, has the schedule changed ----------------------------

    def is_due(self, entry: Any) -> Any:
        """Celery's answer, unless held or dropped.

        Held: a runaway (``guards.RunawayGuard``); dropped: the run policy's verdict
        (catch-up, overlap), claimed as skipped, not sent.
        """
        state = self._sender.ledger.hold(entry, self._guard.check(entry, super().is_due(entry)))
        if not state[0]:
            return state
        decision = self._policy.verdict(entry, self._take_lead)
        if decision is None:
            return state
        if decision.skip_to is not None:
            lead = self._take_lead()  # as the verdict asked it: still leading?
            if lead is None:
                return state
            self._skip(entry, lead, decision)
            return schedstate(False, 0)
        if decision.send_as is not None:
            return schedstate(True, 0)  # a caught-up run: the next missed one is due at once
        return state

    def _skip(self, entry: Any, lead: BeatTerm, decision: Decision) -> None:
        """Move the run state past dropped runs, under this term; the policy records them."""
        assert decision.skip_to is not None
        request = self._matching.request(entry, decision.skip_to)
        expected = request.expected
        (result,) = self._fence.claim(lead, [request])
        if result.won:
            self.adopt_run_state(entry, decision.skip_to, int(entry.total_run_count or 0))
            self._matching.matched(entry)
            self._policy.skipped(entry, lead, decision, expected.last_run_us if expected else 0)
        elif result.state is not None and result.state != expected:
            self._matching.adopt(entry, result.state)
        heap = self._heap  # Celery's: the entry goes back at its new time, or all are rebuilt
        if heap and heap[0][2] is entry:
            due, next_in = entry.is_due()
            when = self._when(entry, 0 if due else next_in)
            heapq.heapreplace(heap, event_t(when, heap[0][1], entry))
        else:
            self._heap = None

    def schedules_equal(self, old: Any, new: Any) -> bool:
        """Celery's comparison, skipped while the schedule cannot have changed.

        See ``guards.SameSchedule``, and the run policy's own view.
        """
        if self._policy.schedule_unchanged(new) or self._same.known_equal(old, new):
            return True
        started = boottime()
        equal = bool(super().schedules_equal(old, new))
        self._same.found(old, new, equal, boottime() - started)
        self._policy.schedule_compared(new, equal)
        return equal

    def add(self, *args: Any, **kwargs: Any) -> Any:
        self._same.changed()
        return super().add(*args, **kwargs)

    def update_from_dict(self, *args: Any, **kwargs: Any) -> Any:
        self._same.changed()
        return super().update_from_dict(*args, **kwargs)

    def merge_inplace(self, *args: Any, **kwargs: Any) -> Any:
        self._same.changed()
        return super().merge_inplace(*args, **kwargs)

    def install_default_entries(self, *args: Any, **kwargs: Any) -> Any:
        self._same.changed()
        return super().install_default_entries(*args, **kwargs)

    def populate_heap(self, *args: Any, **kwargs: Any) -> None:
        """Celery's own heap, after the entries adopted the shared state they lack.

        Celery before 5.7 let one entry that cannot compute its next run stop the whole
        heap (and beat): there each entry is guarded here, as 5.7 guards it.
        """
        self._matching.reconcile(self.schedule, None)
        if _GUARDED:
            super().populate_heap(*args, **kwargs)
            return
        heap = []  # Celery's heap, built as 5.7 builds it
        for entry in self.schedule.values():
            try:
                is_due, delay = entry.is_due()
            except Exception:
                is_due, delay = self._is_due_failed(entry)
            heap.append(event_t(self._when(entry, 0 if is_due else delay) or 0, 5, entry))
        heapq.heapify(heap)
        self._heap = heap

    if not _GUARDED:  # Celery 5.7 has it

        def _is_due_failed(self, entry: Any) -> tuple[bool, float]:
            return is_due_failed(entry, self.max_interval)

    # -- the shared state and the wrapped scheduler's rows ----------------------------------

    def sync(self) -> None:
        """The wrapped scheduler's sync; model rows are written by the leader only.

        A beat that no longer leads (or leads in a term it has not loaded) forgets the
        runs it has not written: the leader holds newer ones and writes them itself. A
        django-celery-beat row is written only if that does not move it back
        (``rows.write_rows``).
        """
        dirty = self._dirty_rows()
        if dirty:
            if not rows.may_write(self._fence):
                log.debug("beat election: not leading; %d unsaved runs left to the leader",
                          len(dirty))  # fmt: skip
                dirty.clear()
            else:
                try:  # django-celery-beat's _schedule and Changes: the rows it would save
                    rows.write_rows(getattr(self, "_schedule", None) or {}, dirty,
                                    getattr(self, "Changes", None))  # fmt: skip
                except Exception as exc:  # as the wrapped sync: log, retry at the next
                    log.warning("beat election: could not write the schedule rows (%s)", exc)
                    return
        super().sync()

    def _dirty_rows(self) -> set[Any] | None:
        """django-celery-beat's names of entries whose rows its next sync writes."""
        dirty = getattr(self, "_dirty", None)
        return dirty if isinstance(dirty, set) else None

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
