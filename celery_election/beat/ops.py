"""The LeaderScheduler's operable schedule: runtime entries, pause, run now, policies, history.

What operators change with ``celery_election.schedule`` (or ``election schedule ...``)
reaches the leading beat here. The leader looks at the schedule's version twice a second
(one indexed statement, 0 rows when nothing changed), so a change takes effect within a
second, with no restart:

* **The schedule Celery sees** is the static ``beat_schedule`` (PersistentScheduler's
  shelve) without its paused or disabled entries, plus the dynamic entries that are
  enabled, not paused and inside their start/expiry window. Celery's own heap, ``is_due``
  and ``reserve`` then run on it unchanged; only the static entries are written back to
  the shelve, so a deleted dynamic entry cannot come back from a local file.
* **Policies** decide a due run before it is reserved (``decide``, a pure function):
  catch-up after downtime, failover or a pause, and overlap. A run they drop is still
  *claimed* (the entry's run state moves past it under the leader's term, with its run
  count unchanged), so the next leader does not send it either; the history and the
  metrics count it.
* **Run now** is claimed in the database under the leader's term before it is sent
  (``SQLScheduleStore.claim_run_now``): one send per request, whichever beats lead.
* **History**: every send is recorded with its task id and the time it was due; workers
  report the outcome (``schedule.report_runs``, connected by ``init_app``); the leader
  prunes what is older than ``election_schedule_retention`` days.
* **Leadership history**: the leader's history thread records each term it leads (the
  lease's start), moves the term's ``seen_at`` about once a second and ends it when this
  beat stops leading (a crash leaves ``seen_at``: its last sign of life). It is written
  here, on the Celery side and off the tick, not in the backends' election steps: the
  election core stays one conditional statement per step and never learns of the
  schedule tables; the price is that only namespaces a LeaderScheduler leads are drawn.

With a memory election database (tests) there are no tables: the schedule is Celery's.
"""

from __future__ import annotations

import heapq
import logging
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from celery.beat import event_t
from celery.schedules import schedstate

from .. import metrics
from ..backends.base import RunRequest
from ..clock import boottime
from ..errors import ElectionError
from ..schedule.spec import SKIP_GRACE, check_policies, from_spec
from ..schedule.store import EntryRow, SQLScheduleStore, history_row, schedule_store
from .answers import Answers, shared_answer
from .fence import BeatFence, Leadership, scheduler_app
from .policy import DefaultRunPolicy, RunPolicy

__all__ = [
    "Decision",
    "HistoryWriter",
    "OperableScheduleMixin",
    "RunPolicy",
    "ScheduleOps",
    "decide",
    "due_times",
]

log = logging.getLogger("celery_election.beat")

LOOK_EVERY = 0.5  # seconds between two looks at the schedule's version (leader only)
PRUNE_EVERY = 600.0
_CAP = 10_000  # due times counted at most (a 1 s interval after a 3-hour outage)


@dataclass(frozen=True)
class Decision:
    """What to do with a due run: send it, or drop ``count`` runs.

    Sent, its run stores ``send_as`` as last_run_at (None: Celery's now); dropped, the run
    state moves to ``skip_to``.
    """

    skip_to: datetime | None = None
    kind: str = ""  # missed (catch-up, resume) / skipped (overlap)
    count: int = 0
    send_as: datetime | None = None


SEND = Decision()


def due_times(
    schedule: Any, last_run_at: datetime, now: datetime, cap: int = _CAP
) -> list[datetime]:
    """The times ``schedule`` fell due after ``last_run_at`` up to ``now`` (at most ``cap``)."""
    out: list[datetime] = []
    last = last_run_at
    while len(out) < cap:
        due = now + schedule.remaining_estimate(last)
        if due > now or (out and due <= out[-1]) or due <= last:
            break
        out.append(due)
        last = due
    return out


def decide(
    times: list[datetime],
    now: datetime,
    policies: dict[str, Any],
    *,
    skip_before: datetime | None = None,
    busy: bool = False,
) -> Decision:
    """The policies' verdict on a due entry whose missed due times are ``times``.

    * ``busy`` (overlap ``skip`` and the previous run has not finished): skip this run.
    * ``skip_before`` (resumed with ``missed="skip"``): what fell due before it is missed.
    * Runs due longer ago than the grace window are missed (``catch_up="skip"``: 1 s by
      default); ``latest`` then sends one run for the rest, ``all`` one run per due time
      (the latest ``catch_up_max``), each stored as the due time it stands for.
    """
    if busy:
        return Decision(skip_to=now, kind="skipped", count=1)
    if not times:
        return SEND
    if skip_before is not None and times[0] < skip_before:
        before = [t for t in times if t < skip_before]
        return Decision(skip_to=min(skip_before, now), kind="missed", count=len(before))
    grace = policies.get("grace")
    if grace is None and policies["catch_up"] == "skip":
        grace = SKIP_GRACE
    if grace is not None:
        late = [t for t in times if (now - t).total_seconds() > grace]
        if late:
            to = now if len(late) == len(times) else late[-1]
            return Decision(skip_to=to, kind="missed", count=len(late))
    if policies["catch_up"] == "all":
        most = int(policies["catch_up_max"])
        if len(times) > most:
            return Decision(skip_to=times[-most - 1], kind="missed", count=len(times) - most)
        return Decision(send_as=times[0])
    return SEND


class OperableScheduleMixin:
    """Serve the operable schedule (see the module) in a LeaderSchedulerMixin scheduler.

    What Celery calls is overridden here (the schedule it sees, ``schedules_equal``,
    ``reserve``, ``tick``, ``is_due``, ``close``); what the operable schedule knows is a
    :class:`ScheduleOps`, plugged into the fence's caller as its :class:`RunPolicy`.
    """

    app: Any
    _heap: Any
    _seen: Any
    _fence: BeatFence

    def __init__(self, *args: Any, fence: BeatFence | None = None, **kwargs: Any) -> None:
        """Celery's arguments; ``fence``: the shared run state's (default: one of its own)."""
        if fence is None:
            fence = BeatFence(scheduler_app(args, kwargs))
        self._ops = ScheduleOps(fence, self._base, self.Entry)  # type: ignore[attr-defined]
        self._compared = -1  # the view's key when last found equal to its copy
        super().__init__(*args, fence=fence, policy=self._ops, **kwargs)  # type: ignore[call-arg]

    # -- the schedule Celery sees -----------------------------------------------------------

    def get_schedule(self) -> dict[str, Any]:
        view = self._ops.view
        return view if view is not None else super().get_schedule()  # type: ignore[misc]

    def set_schedule(self, schedule: dict[str, Any]) -> None:
        super().set_schedule(schedule)  # type: ignore[misc]
        if self._ops.view is not None:
            self._ops.rebuild()

    schedule = property(get_schedule, set_schedule)

    def _base(self) -> dict[str, Any]:
        """The wrapped scheduler's own schedule (PersistentScheduler's shelve)."""
        return super().get_schedule()  # type: ignore[misc, no-any-return]

    def schedules_equal(self, old: Any, new: Any) -> bool:
        """Celery's comparison, skipped while the view has not changed since it was equal.

        Celery compares every entry at every tick; with the view, only a rebuild changes
        what it could find (reserve keeps entries equal), so 10,000 entries cost nothing.
        """
        ops = self._ops
        if new is not None and new is ops.view and self._compared == ops.view_key:
            return True
        equal = bool(super().schedules_equal(old, new))  # type: ignore[misc]
        if equal and new is not None and new is ops.view:
            self._compared = ops.view_key
        return equal

    def reserve(self, entry: Any) -> Any:
        new_entry = super().reserve(entry)  # type: ignore[misc]
        ops = self._ops
        if ops.view is not None:
            name = entry.name
            if name in ops.dynamic and ops.view.get(name) is new_entry:
                ops.dynamic[name] = new_entry
            elif name in self._base():
                self._base()[name] = new_entry  # the shelve keeps static entries only
        return new_entry

    # -- looking at the stored schedule -----------------------------------------------------

    def tick(self, *args: Any, **kwargs: Any) -> float:
        lead = self._take_lead()  # type: ignore[attr-defined]
        ops = self._ops
        store = ops.store()
        if lead is not None and store is not None:
            if boottime() >= ops.next_look:
                ops.look(lead)
            self._serve_run_now(lead, store)
            ops.prune(store)
        if store is not None:
            ops.mark_term(store, lead)
        next_in = float(super().tick(*args, **kwargs))  # type: ignore[misc]
        return min(next_in, LOOK_EVERY) if store is not None else next_in

    def _serve_run_now(self, lead: Leadership, store: SQLScheduleStore) -> None:
        """Send each pending "run now" this leader wins in the database, once."""
        ops = self._ops
        for name in list(ops.asked):
            ops.asked.discard(name)
            row = ops.rows.get(name)
            if row is None or row.run_now_at is None:
                continue
            ops.rows[name] = replace(row, run_now_at=None)
            entry = self._base().get(name) if row.task is None else ops.dynamic_entry(row)
            if entry is None:
                log.warning("beat election: run now of %s: no such entry in this beat", name)
                continue
            election = self._fence.election
            assert election is not None
            try:
                won = store.claim_run_now(ops.namespace, (election.namespace, lead.token,
                                          lead.term), name, row.run_now_at)  # fmt: skip
            except ElectionError as exc:
                log.warning("beat election: run now of %s not claimed (%s)", name, exc)
                ops.rows[name] = row  # try again at the next tick
                ops.asked.add(name)
                continue
            if not won:
                continue
            log.info("beat election: run now: %s (requested by %s)", name, row.updated_by)
            ops.run_now_key = row.run_now_at
            try:
                self.apply_entry(entry, producer=self.producer)  # type: ignore[attr-defined]
            finally:
                ops.run_now_key = None

    # -- policies ---------------------------------------------------------------------------

    def is_due(self, entry: Any) -> Any:
        state = super().is_due(entry)  # type: ignore[misc]
        ops = self._ops
        row = ops.rows.get(entry.name)
        if not state.is_due or row is None:
            return state
        cached = ops.policies.get(entry.name)
        if cached is None:
            cached = ops.policies[entry.name] = check_policies(row.spec)
        policies = cached
        lead = self._take_lead()  # type: ignore[attr-defined]
        if lead is None:
            return state
        now = self.app.now()
        last = entry.last_run_at or now
        times = due_times(entry.schedule, last, now)
        skip_before = None
        if row.skip_before is not None:
            skip_before = self._fence.from_db(row.skip_before, now)
        busy = policies["overlap"] == "skip" and ops.busy(entry.name, policies)
        decision = decide(times, now, policies, skip_before=skip_before, busy=busy)
        if decision.skip_to is not None:
            self._skip(entry, lead, decision)
            return schedstate(False, 0)
        if decision.send_as is not None:
            # the run stands for its due time, and the next missed one is due at once
            ops.send_as[entry.name] = decision.send_as
            state = schedstate(True, 0)
        if times:
            late = (now - times[-1]).total_seconds()
            metrics.count(ops.metric(entry.name, "late_ms"), max(0, round(late * 1000)))
        return state

    def _skip(self, entry: Any, lead: Leadership, decision: Decision) -> None:
        """Move the run state past dropped runs, under this term; the history counts them."""
        name = entry.name
        fence, ops = self._fence, self._ops
        expected = fence.runs.get(name)
        assert decision.skip_to is not None
        at = fence.to_db(decision.skip_to)
        count = int(entry.total_run_count or 0)
        identity = self.run_state_identity(entry)  # type: ignore[attr-defined]
        claim = fence.claim(lead, RunRequest(str(name), expected, at, count, identity))
        if claim.won:
            self.adopt_run_state(entry, decision.skip_to, count)  # type: ignore[attr-defined]
            self._seen[name] = (entry.last_run_at, entry.total_run_count)
            what = "missed" if decision.kind == "missed" else "skipped_overlap"
            metrics.count(ops.metric(name, what), decision.count)
            policy = "overlap" if decision.kind == "skipped" else "catch-up"
            log.info("beat election: %s: %d run(s) %s (%s policy)", name, decision.count,
                     decision.kind, policy)  # fmt: skip
            ops.history(name, decision.kind, lead.term, expected.last_run_us if expected else 0,
                        None, decision.count)  # fmt: skip
        elif claim.state is not None and claim.state != expected:
            self._adopt(entry, claim.state)  # type: ignore[attr-defined]
        heap = self._heap
        if heap and heap[0][2] is entry:
            due, next_in = entry.is_due()
            when = self._when(entry, 0 if due else next_in)  # type: ignore[attr-defined]
            heapq.heapreplace(heap, event_t(when, heap[0][1], entry))
        else:
            self._heap = None

    def close(self) -> None:
        try:
            super().close()  # type: ignore[misc]
        finally:
            self._ops.close()


class ScheduleOps(DefaultRunPolicy):
    """The operable schedule as this beat knows it, and the :class:`RunPolicy` it gives.

    It reads the stored schedule's changes (:meth:`look`), builds the schedule Celery sees
    (:attr:`view`: the shelve's entries less the paused ones, plus the dynamic entries),
    keeps each entry's checked policies and pending "run now", and queues the history.
    As the scheduler's policy it loads the stored schedule at promotion, names the
    entries that exist (beside the shelve's), gives dynamic entries their identity and
    origin, stores a caught-up run as its due time, and heads and records each send.
    """

    def __init__(
        self, fence: BeatFence, base: Callable[[], dict[str, Any]], make_entry: Callable[..., Any]
    ) -> None:
        """``base``: the wrapped scheduler's own schedule; ``make_entry``: its Entry class."""
        self.fence = fence
        self.app = fence.app
        self._base, self._make_entry = base, make_entry
        self.rows: dict[str, EntryRow] = {}  # stored rows, by name (deleted ones dropped)
        self.dynamic: dict[str, Any] = {}  # dynamic entries as Celery schedules them
        self._identity: dict[str, str] = {}  # dynamic entry -> its run state's identity
        self._built: dict[str, EntryRow] = {}  # dynamic entry -> the row it was built from
        self.view: dict[str, Any] | None = None  # the schedule Celery sees, if not the shelve
        self.view_key = 0  # moves at each rebuild of the view
        self._since = -1  # the stored schedule's version read up to
        self._term: int | None = None  # the term the rows were read in
        self.next_look = 0.0
        self._next_prune = 0.0
        self._windowed: dict[str, bool] = {}  # dynamic entries with start/expiry: inside?
        self.send_as: dict[str, datetime] = {}  # a due run stands for this time (catch-up)
        self.asked: set[str] = set()  # entries with a "run now" this leader has not served
        self.policies: dict[str, dict[str, Any]] = {}  # checked policies, by entry
        self._writer: HistoryWriter | None = None
        self.run_now_key: int | None = None  # the "run now" being sent
        self._answers: Answers = {}  # due times shared by a burst's crontabs

    def store(self) -> SQLScheduleStore | None:
        """The stored schedule (None: a memory election database, no tables)."""
        election = self.fence.election
        return None if election is None else schedule_store(election.backend)

    @property
    def namespace(self) -> str:
        """The stored schedule's namespace (the beats')."""
        election = self.fence.election
        assert election is not None
        return str(election.settings.beat_namespace)

    # -- the RunPolicy ----------------------------------------------------------------------

    def promote(self, lead: Leadership) -> bool:
        """Load the stored schedule before the shared run state is matched with it."""
        return self.store() is None or self.look(lead, full=True)

    def live_names(self, schedule: Mapping[str, Any]) -> set[str]:
        """Entries that exist, sent now or not: their run state is not retired."""
        return set(self._base()) | set(self.rows)

    def follows_deploys(self, entry: Any) -> bool:
        """A dynamic entry starts when it was added (its row says so), not at a promotion."""
        return entry.name not in self._identity and super().follows_deploys(entry)

    def identity(self, entry: Any) -> str | None:
        return self._identity.get(entry.name)

    def next_run_at(self, entry: Any, new_entry: Any) -> Any:
        send_as = self.send_as.pop(entry.name, None)
        return new_entry.last_run_at if send_as is None else send_as

    def send_headers(self, entry: Any) -> dict[str, Any]:
        if self.store() is None:
            return {}
        return {"election_schedule": self.namespace, "election_entry": str(entry.name)}

    def sent(self, entry: Any, result: Any, term: int, run: int | None) -> None:
        kind = "run" if run is not None or self.run_now_key is None else "run_now"
        key = run if run is not None else (self.run_now_key or 0)
        if kind == "run_now":
            metrics.count(self.metric(entry.name, "run_now"))
        now = self.app.now()  # one reading for both: Celery's now is a tenth of a send
        due = self._due_us(entry, run, now) if kind == "run" else None
        self.history(entry.name, kind, term, key, getattr(result, "id", None), 1, due, now)

    # -- the view ---------------------------------------------------------------------------

    def rebuild(self) -> None:
        """Recompute the view from the shelve's entries and the stored rows."""
        self.view_key += 1
        if not self.rows:
            self.view = None
            return
        base = self._base()
        view = {}
        for name, entry in base.items():
            row = self.rows.get(name)
            if row is None or row.task is not None or (row.enabled and not row.paused):
                view[name] = entry
        now = self.app.now()
        self._windowed = {}
        for name, row in self.rows.items():
            if row.task is None or name in base:
                continue  # an overlay, or a name a deploy made static (the code wins)
            inside = _inside(row, now)
            if "start_at" in row.spec or "expires_at" in row.spec:
                self._windowed[name] = inside
            if row.enabled and not row.paused and inside:
                view[name] = self.dynamic_entry(row)
        self.view = view

    def dynamic_entry(self, row: EntryRow) -> Any:
        """The Celery entry of a dynamic row; an edit keeps the entry's run state."""
        name = row.name
        old = self.dynamic.get(name)
        identity = f"dyn:{row.created_at}"
        if old is not None and self._built.get(name) is row:
            return old
        spec = row.spec
        if old is not None and self._identity.get(name) == identity:
            last, count = old.last_run_at, old.total_run_count
        else:
            last, count = self.fence.from_db(row.created_at, self.app.now()), 0
        entry = self._make_entry(
            name=name,
            task=row.task,
            schedule=from_spec(spec["schedule"], self.app),
            args=tuple(spec.get("args") or ()),
            kwargs=dict(spec.get("kwargs") or {}),
            options=dict(spec.get("options") or {}),
            last_run_at=last,
            total_run_count=count,
            app=self.app,
        )
        self.dynamic[name] = entry
        self._identity[name] = identity
        self._built[name] = row
        return entry

    def look(self, lead: Leadership, *, full: bool = False) -> bool:
        """Read what changed since the last look; False if the database did not answer."""
        store = self.store()
        assert store is not None
        if full or lead.term != self._term:
            self._since, self.rows, self._term = -1, {}, lead.term
            self.asked, self.policies = set(), {}
        self.next_look = boottime() + LOOK_EVERY
        try:
            changed = store.changes(self.namespace, self._since)
        except ElectionError as exc:
            log.warning("beat election: could not read the schedule's changes (%s)", exc)
            return False
        for row in changed:
            self._since = max(self._since, row.version)
            self.policies.pop(row.name, None)
            if row.deleted:
                self.rows.pop(row.name, None)
                self.dynamic.pop(row.name, None)
            else:
                self.rows[row.name] = row
            if row.run_now_at is not None and not row.deleted:
                self.asked.add(row.name)
        if changed:
            log.info("beat election: %d schedule change(s) up to version %d", len(changed),
                     self._since)  # fmt: skip
        now = self.app.now()
        crossed = any(_inside(self.rows[n], now) != v for n, v in self._windowed.items()
                      if n in self.rows)  # fmt: skip
        if changed or crossed:
            self.rebuild()
        return True

    def busy(self, name: str, policies: dict[str, Any]) -> bool:
        """Whether the entry's last sent run is still running (within overlap_timeout)."""
        store = self.store()
        if store is None:
            return False
        if self._writer is not None:
            self._writer.flush()  # this leader's last send must be in the table first
        try:
            last = store.last_sent(self.namespace, name)
            if last is None or last.finished_at is not None:
                return False
            age = (store.db_now() - last.sent_at) / 1e6
        except ElectionError as exc:
            log.warning("beat election: overlap check of %s failed (%s); sending", name, exc)
            return False
        return age < float(policies["overlap_timeout"])

    def prune(self, store: SQLScheduleStore) -> None:
        if boottime() < self._next_prune:
            return
        self._next_prune = boottime() + PRUNE_EVERY
        election = self.fence.election
        assert election is not None
        days = float(election.settings.schedule_retention)
        try:
            cut = store.db_now() - int(days * 86_400_000_000)
            gone = store.prune(self.namespace, cut)
            store.prune_terms(election.namespace, cut)
        except ElectionError as exc:
            log.warning("beat election: could not prune the run history (%s)", exc)
            return
        if gone:
            log.info("beat election: pruned %d history rows older than %g days", gone, days)

    # -- history ----------------------------------------------------------------------------

    def mark_term(self, store: SQLScheduleStore, lead: Leadership | None) -> None:
        """Tell the leadership history which term this beat leads now (None: none)."""
        if lead is None and self._writer is None:
            return
        if self._writer is None:
            self._writer = HistoryWriter(store)
        self._writer.lead(self.fence.namespace, None if lead is None else lead.term,
                          self._leader_label())  # fmt: skip

    def _leader_label(self) -> str:
        """Who leads, for the leadership history when the lease row no longer says."""
        elector = getattr(self.fence.election, "elector", None)
        return str(elector.candidate_id) if elector is not None else f"beat pid {os.getpid()}"

    def _due_us(self, entry: Any, run: int | None, now: datetime | None = None) -> int | None:
        """When the run sent now fell due (database clock): its schedule after ``run``.

        The page shows how late a run went out; None when unknown (an entry's first run,
        a schedule Celery cannot estimate).
        """
        if not run:
            return None
        try:
            now = self.app.now() if now is None else now
            due = self._due_after(entry.schedule, run, now)
            return self.fence.to_db(min(due, now))
        except Exception as exc:  # informational only: the run went out
            log.debug("beat election: due time of %s: %s", entry.name, exc)
            return None

    def _due_after(self, sched: Any, run: int, now: datetime) -> datetime:
        """When ``sched`` falls due after the stored run ``run`` (Celery's answer).

        Shared by equal crontabs last run in the same minute (``shared_answer``): asking
        Celery for each entry of a burst cost 8 % of a 10,000-entry burst.
        """
        last = self.fence.from_db(run, now)

        def ask() -> datetime:
            due: datetime = now + sched.remaining_estimate(last)
            return due

        return shared_answer(self._answers, "due", sched, last, now, ask)

    def history(
        self,
        name: str,
        kind: str,
        term: int,
        run_key: int,
        task_id: str | None,
        count: int,
        due_at: int | None = None,
        now: datetime | None = None,
    ) -> None:
        """Queue a history row: written off the tick thread, so a send costs one claim."""
        store = self.store()
        if store is None:
            return
        if self._writer is None:
            self._writer = HistoryWriter(store)
        sent_at = self.fence.to_db(self.app.now() if now is None else now)
        row = history_row(self.namespace, str(name), kind, run_key=run_key, term=term,
                          task_id=task_id, count=count, sent_at=sent_at,
                          due_at=due_at)  # fmt: skip
        self._writer.add(row)

    def metric(self, name: str, what: str) -> str:
        return metrics.key(metrics.BEAT, self.namespace, str(name), what)

    def close(self) -> None:
        """Write the queued history and end the led term's record."""
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.close()


class HistoryWriter:
    """History rows written by a thread of their own, a batch every ``every`` seconds.

    A send then costs the tick loop its claim only: with the history written inline, each
    send was two round trips and one leader kept up with about 170 sends a second on
    PostgreSQL (benchmarks/beat_dynamic.py). A batch that fails is kept for the next one
    (up to ``limit`` rows: history is best effort, the runs themselves went out).
    """

    #: Seconds between two marks of the led term's ``seen_at`` (its end after a crash).
    SEEN_EVERY = 1.0

    def __init__(self, store: SQLScheduleStore, every: float = 0.25, limit: int = 50_000):
        self.store, self.every, self.limit = store, every, limit
        self._rows: list[dict[str, Any]] = []
        # leadership history: the term led now (namespace, term, label), whether its row is
        # written, when it was last marked seen, and terms that ended but are not marked so
        self._term: tuple[str, int, str] | None = None
        self._term_written = False
        self._seen_at = 0.0
        self._ended: list[tuple[str, int]] = []
        self._lock = threading.Lock()  # the queue
        self._writing = threading.Lock()  # one batch at a time, in order
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="election-history", daemon=True)
        self._thread.start()

    def add(self, row: dict[str, Any]) -> None:
        with self._lock:
            if len(self._rows) < self.limit:
                self._rows.append(row)

    def lead(self, namespace: str, term: int | None, label: str) -> None:
        """The term this beat leads now (None: none); the thread records changes."""
        with self._lock:
            current = self._term
            if current is not None and (term is None or current[1] != term):
                if self._term_written:
                    self._ended.append(current[:2])
                self._term = None
            if term is not None and self._term is None:
                self._term, self._term_written, self._seen_at = (namespace, term, label), False, 0.0

    def _terms(self) -> None:
        """Write the leadership history's changes (best effort, retried next time)."""
        with self._lock:
            ended, self._ended = self._ended, []
            current, written = self._term, self._term_written
        try:
            for ns, term in ended:
                self.store.term_seen(ns, term, ended=True)
            if current is not None and not written:
                self.store.term_started(*current)
                with self._lock:
                    if self._term == current:
                        self._term_written, self._seen_at = True, boottime()
            elif current is not None and boottime() - self._seen_at >= self.SEEN_EVERY:
                self.store.term_seen(*current[:2])
                self._seen_at = boottime()
        except ElectionError as exc:
            log.debug("beat election: leadership history not written yet (%s)", exc)
            with self._lock:
                self._ended[:0] = ended

    def flush(self) -> None:
        """Write what is queued now, in the caller's thread."""
        with self._writing:
            self._terms()
            with self._lock:
                rows, self._rows = self._rows, []
            if not rows:
                return
            try:
                self.store.record_many(rows)
            except ElectionError as exc:
                log.warning("beat election: %d history rows not written yet (%s)", len(rows), exc)
                with self._lock:
                    self._rows[:0] = rows[: self.limit - len(self._rows)]

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.flush()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        with self._lock:
            if self._term is not None and self._term_written:
                self._ended.append(self._term[:2])
            self._term = None
        self.flush()


def _inside(row: EntryRow, now: datetime) -> bool:
    """Whether ``now`` is inside the row's start/expiry window."""
    start, end = row.spec.get("start_at"), row.spec.get("expires_at")
    if start is not None and now < datetime.fromisoformat(start):
        return False
    return end is None or now < datetime.fromisoformat(end)
