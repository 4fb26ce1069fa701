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
* **Policies** decide a due run before it is reserved (``catchup.decide``, a pure function):
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

import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import datetime
from typing import Any

from .. import metrics
from ..backends.base import RunState
from ..core.clock import boottime
from ..core.due import due_after, due_times, in_window
from ..errors import ElectionError
from ..runs import runonce
from ..schedule.records import EntryRow, history_row
from ..schedule.spec import check_policies, from_spec
from ..schedule.store import SQLScheduleStore, schedule_store
from .answers import Answers, shared_answer
from .catchup import Decision, decide
from .election import BeatTerm
from .fence import BeatFence
from .history import HistoryWriter
from .policy import RunNow, RunPolicy

__all__ = ["ScheduleOps"]

log = logging.getLogger("celery_election.beat")

LOOK_EVERY = 0.5  # seconds between two looks at the schedule's version (leader only)


class ScheduleOps(RunPolicy):
    """The operable schedule as this beat knows it, and the :class:`RunPolicy` it gives.

    It reads the stored schedule's changes (:meth:`look`), builds the schedule Celery sees
    (:attr:`view`: the shelve's entries less the paused ones, plus the dynamic entries),
    keeps each entry's checked policies and pending "run now", and queues the history.
    As ``LeaderScheduler``'s run policy it is asked at each of the mixin's steps and
    answers with values: before a tick, the "run now"s it won (:meth:`before_tick`); on
    a due entry, the catch-up and overlap verdict (:meth:`verdict`, from
    ``catchup.decide``); at a reserve, the view keeps the successor (:meth:`reserved`);
    at a promotion it loads the stored schedule and names the entries that exist; at a
    send it heads and records it. ``LeaderScheduler`` shows Celery the :attr:`view`.
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
        self._windowed: dict[str, bool] = {}  # dynamic entries with start/expiry: inside?
        self.send_as: dict[str, datetime] = {}  # a due run stands for this time (catch-up)
        self.asked: set[str] = set()  # entries with a "run now" this leader has not served
        self.policies: dict[str, dict[str, Any]] = {}  # checked policies, by entry
        self._writer: HistoryWriter | None = None
        self._answers: Answers = {}  # due times shared by a burst's crontabs
        self._compared = -1  # the view's key when last found equal to its copy

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

    def promote(self, lead: BeatTerm) -> bool:
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

    def sent(self, entry: Any, term: int, run: int | None, run_now: int | None) -> None:
        """The run's row is its history (its claim wrote it): a "run now" is counted."""
        if run is None and run_now is not None:
            metrics.count(self.metric(entry.name, "run_now"))

    def before_tick(self, lead: BeatTerm | None) -> list[RunNow]:
        """The pending "run now"s this leader won; first, the stored schedule's changes.

        Also tells the leadership history which term this beat leads (its thread prunes
        what the retention no longer keeps).
        """
        store = self.store()
        if store is None:
            return []
        runs: list[RunNow] = []
        if lead is not None:
            if boottime() >= self.next_look:
                self.look(lead)
            runs = self._run_now(lead, store)
        self.mark_term(store, lead)
        return runs

    def next_tick_within(self) -> float | None:
        return LOOK_EVERY if self.store() is not None else None

    def _run_now(self, lead: BeatTerm, store: SQLScheduleStore) -> list[RunNow]:
        """The pending "run now"s this leader wins in the database (each sent once)."""
        election = self.fence.election
        assert election is not None
        runs = []
        for name in list(self.asked):
            self.asked.discard(name)
            row = self.rows.get(name)
            if row is None or row.run_now_at is None:
                continue
            self.rows[name] = replace(row, run_now_at=None)
            entry = self._base().get(name) if row.task is None else self.dynamic_entry(row)
            if entry is None:
                log.warning("beat election: run now of %s: no such entry in this beat", name)
                continue
            try:
                won = store.claim_run_now(self.namespace, (election.namespace, lead.token,
                                          lead.term), name, row.run_now_at,
                                          str(entry.task))  # fmt: skip
            except ElectionError as exc:
                log.warning("beat election: run now of %s not claimed (%s)", name, exc)
                self.rows[name] = row  # try again at the next tick
                self.asked.add(name)
                continue
            if won:
                log.info("beat election: run now: %s (requested by %s)", name, row.updated_by)
                runs.append(RunNow(entry, row.run_now_at))
        return runs

    def verdict(self, entry: Any, lead_now: Callable[[], BeatTerm | None]) -> Decision | None:
        """The policies' decision on a due entry (catch-up, resume, overlap), if leading."""
        row = self.rows.get(entry.name)
        if row is None or lead_now() is None:
            return None
        policies = self.policies.get(entry.name)
        if policies is None:
            policies = self.policies[entry.name] = check_policies(row.spec)
        now = self.app.now()
        times = due_times(entry.schedule, entry.last_run_at or now, now)
        skip_before = None
        if row.skip_before is not None:
            skip_before = self.fence.from_db(row.skip_before, now)
        busy = policies["overlap"] == "skip" and self.busy(entry.name, policies)
        decision = decide(times, now, policies, skip_before=skip_before, busy=busy)
        if decision.send_as is not None:
            # the run stands for its due time, and the next missed one is due at once
            self.send_as[entry.name] = decision.send_as
        if decision.skip_to is None and times:
            late = (now - times[-1]).total_seconds()
            metrics.count(self.metric(entry.name, "late_ms"), max(0, round(late * 1000)))
        return decision

    def skipped(self, entry: Any, lead: BeatTerm, decision: Decision, run_key: int) -> None:
        name = entry.name
        what = "missed" if decision.kind == "missed" else "skipped_overlap"
        metrics.count(self.metric(name, what), decision.count)
        policy = "overlap" if decision.kind == "skipped" else "catch-up"
        log.info("beat election: %s: %d run(s) %s (%s policy)", name, decision.count,
                 decision.kind, policy)  # fmt: skip
        self.history(name, decision.kind, lead.term, run_key, decision.count)

    def reserved(self, entry: Any, next_entry: Any) -> None:
        """The view and the shelve hold the reserved entry's successor."""
        if self.view is None:
            return
        name = entry.name
        if name in self.dynamic and self.view.get(name) is next_entry:
            self.dynamic[name] = next_entry
        elif name in self._base():
            self._base()[name] = next_entry  # the shelve keeps static entries only

    def schedule_unchanged(self, schedule: Any) -> bool:
        """The view, unchanged since it was found equal to its copy.

        Only a rebuild changes what Celery could find (reserve keeps entries equal), so
        10,000 entries cost nothing.
        """
        return schedule is not None and schedule is self.view and self._compared == self.view_key

    def schedule_compared(self, schedule: Any, equal: bool) -> None:
        if equal and schedule is not None and schedule is self.view:
            self._compared = self.view_key

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

    def look(self, lead: BeatTerm, *, full: bool = False) -> bool:
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
        try:  # the runs' rows, which their claims wrote: this leader's last is there
            last = store.last_sent([self.fence.namespace], name)
            if last is None or last.finished_at is not None:
                return False
            age = (store.db_now() - last.sent_at) / 1e6
        except ElectionError as exc:
            log.warning("beat election: overlap check of %s failed (%s); sending", name, exc)
            return False
        return age < float(policies["overlap_timeout"])

    def prune(self) -> float:
        """Delete a batch of this namespace's runs and its terms past the history's retention.

        On the history thread, while this beat leads: its claims wrote the rows, the
        workers that end them never prune a beat's. Returns the seconds until the next
        batch: at once while whole batches go (10,000 rows a second and more: RESULTS.md).
        """
        election, store = self.fence.election, self.store()
        assert election is not None and store is not None
        days = float(election.settings.schedule_retention)
        runs, ns = election.backend.runs, election.namespace
        wait = runonce.prune(runs, ns, days * 86_400, "beat election", history=True, again=0.0)
        if wait:  # caught up: the terms too (not again with every batch while behind)
            try:
                store.prune_terms(ns, store.db_now() - int(days * 86_400_000_000))
            except ElectionError as exc:
                log.warning("beat election: could not prune the leadership history (%s)", exc)
        return wait

    # -- history ----------------------------------------------------------------------------

    def mark_term(self, store: SQLScheduleStore, lead: BeatTerm | None) -> None:
        """Tell the leadership history which term this beat leads now (None: none)."""
        if lead is None and self._writer is None:
            return
        if self._writer is None:
            self._writer = HistoryWriter(store, prune=self.prune)
        self._writer.lead(self.fence.namespace, None if lead is None else lead.term,
                          self._leader_label())  # fmt: skip

    def _leader_label(self) -> str:
        """Who leads, for the leadership history when the lease row no longer says."""
        elector = getattr(self.fence.election, "elector", None)
        return str(elector.candidate_id) if elector is not None else f"beat pid {os.getpid()}"

    def due_at(self, entry: Any, run: RunState | None) -> int | None:
        """When the run claimed now fell due (database clock): its schedule after ``run``.

        The page shows how late a run went out; None when unknown (an entry's first run,
        a schedule Celery cannot estimate, no stored schedule).
        """
        if run is None or not run.last_run_us or self.store() is None:
            return None
        try:
            now = self.app.now()
            due = self._due_after(entry.schedule, run.last_run_us, now)
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
        return shared_answer(
            self._answers, "due", sched, last, now, lambda: due_after(sched, last, now)
        )

    def history(self, name: str, kind: str, term: int, run_key: int, count: int) -> None:
        """Queue the row of runs a policy did not send (written off the tick thread)."""
        store = self.store()
        if store is None:
            return
        if self._writer is None:
            self._writer = HistoryWriter(store, prune=self.prune)
        sent_at = self.fence.to_db(self.app.now())
        row = history_row(self.fence.namespace, str(name), kind, run_key=run_key, term=term,
                          count=count, sent_at=sent_at)  # fmt: skip
        self._writer.add(row)

    def metric(self, name: str, what: str) -> str:
        return metrics.key(metrics.BEAT, self.namespace, str(name), what)

    def bursting(self, going_on: bool) -> None:
        """The history waits for a burst's end (``HistoryWriter.hold``)."""
        if self._writer is not None:
            self._writer.hold(going_on)

    def close(self) -> None:
        """Write the queued history and end the led term's record."""
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.close()


def _inside(row: EntryRow, now: datetime) -> bool:
    """Whether ``now`` is inside the row's start/expiry window (``core.due.in_window``)."""
    return in_window(now, row.spec.get("start_at"), row.spec.get("expires_at")) == now
