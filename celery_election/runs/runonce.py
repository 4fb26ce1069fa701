"""Run once on the workers: a run's row decides whether a delivery runs it.

The broker may deliver one run twice: the beat re-publishes a run it cannot prove was
sent (under the same task id), Celery redelivers after a lost ack, Redis after
``visibility_timeout``. Before running, a worker starts the run's row in the election
database (``RunStore.start``: one conditional write of core/runstate.py's ``start``), naming
this delivery (a token drawn per try) and this process (its liveness session's token).
Decided by the database, so it holds across workers, hosts and pools:

* a run nobody started runs; one that ended, or started by a delivery acknowledged
  before its run (the default), is skipped: **at most once**, also when that worker died;
* ``acks_late`` (a dead worker's run comes back from the broker): a delivery of a run
  another delivery started waits while that worker's process lives (put off: published
  again a little later) and takes the run over once it died. So a second copy (sent
  again, redelivered by Redis, a publish retried) never runs beside the first, and the
  only copy's redelivery runs, whichever copy it was (windows 4 and 5 of issue 52);
* a delivery put off because the database did not answer names its try in the copy
  (``put_off``): a row that try started is its own, and runs (window 6).

The run key is the task id and its retry number: a retry (same id, one more retry) is a
new run. Part of the core: no Celery here (``runs/once.py`` is the Celery side).
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Collection
from dataclasses import dataclass

from ..backends import backend_from_url
from ..backends.base import Backend, End, RunStore
from ..core.runstate import Delivery, Start, run_key
from ..election.holder import KeyHolder
from ..errors import BackendUnavailableError, ElectionError, SchemaMissingError
from ..settings import ElectionSettings

__all__ = ["RunGuard", "Verdict", "current", "not_run", "ran", "run_key", "use"]

log = logging.getLogger("celery_election.runs.runonce")

#: A process deletes run rows past the retention this often (seconds), this many at most.
PRUNE_EVERY, PRUNE_BATCH = 600.0, 5000
#: Seconds an early-acknowledged run's end waits for the process's next start to ride on
#: (one commit for both); then it is written alone.
END_WAIT = 1.0


#: A request attribute: this delivery did not run the run (a duplicate skipped, or put off
#: to come back): its IGNORED is not the run's end, and its history row stays open.
NOT_RUN = "election_not_run"


def not_run(request: object) -> None:
    """Say that this delivery ends without running its run (see :data:`NOT_RUN`)."""
    setattr(request, NOT_RUN, True)


def ran(request: object) -> bool:
    """Whether this delivery's end is its run's end (it was not skipped or put off)."""
    return not getattr(request, NOT_RUN, False)


@dataclass(frozen=True)
class Verdict:
    """What this delivery does, and why.

    ``verdict``: "run", "skip" or "defer" (published again later: another live process
    runs it, under ``acks_late``). ``reason``: runstate.start's ("started", "own",
    "taken over", "finished", "dropped", "running"). ``delivery``: this try's token.
    """

    verdict: str
    reason: str
    key: str
    delivery: str
    attempt: int = 1
    namespace: str = ""  # where its row is (the beat's namespace for a beat run)
    acks_late: bool = False

    @property
    def run(self) -> bool:
        return self.verdict == "run"


class RunGuard:
    """One process's run rows: a backend and a liveness session of its own, at first use.

    ``connect`` builds the backend; each process (a prefork child, a solo worker) opens
    its own on first use, so nothing opened before a fork is shared after it.
    ``install`` (``election_auto_install``): create missing tables on first refusal.
    ``liveness``: the delta of the process's liveness session (None: none; a run it
    starts cannot be waited for). ``retention``: seconds a run row is kept; each process
    deletes a batch of older ones every :data:`PRUNE_EVERY` seconds (sooner while a whole
    batch went), so the table holds about a retention's worth of runs.
    """

    def __init__(
        self,
        connect: Callable[[], Backend],
        namespace: str,
        *,
        install: bool = False,
        retention: float = 86400.0,
        liveness: float | None = 1.0,
        ttl: float = 30.0,
    ) -> None:
        self.connect, self.namespace, self.install = connect, namespace, install
        self.retention, self.liveness, self.ttl = retention, liveness, ttl
        self._backend: Backend | None = None
        self._holder: KeyHolder | None = None
        self._pid = 0
        self._lock = threading.Lock()
        self._next_prune = 0.0
        self._ends: list[End] = []  # early-acknowledged runs' ends not written yet
        self._waiting = threading.Lock()  # guards them and their timer
        self._timer: threading.Timer | None = None
        self._timer_pid = 0

    @classmethod
    def from_settings(cls, settings: ElectionSettings) -> RunGuard:
        """The guard of an app's settings (a backend of its own per process)."""
        url, options = settings.url, settings.backend_options(listen=False)
        return cls(
            lambda: backend_from_url(url, **options),
            settings.namespace,
            install=settings.auto_install,
            retention=settings.run_once_retention,
            liveness=settings.config.liveness,
            ttl=settings.config.ttl,
        )

    def _process(self) -> tuple[Backend, KeyHolder]:
        """The backend and liveness of the calling process (new ones after a fork)."""
        with self._lock:
            if self._backend is None or self._holder is None or self._pid != os.getpid():
                self._backend = self.connect()
                self._holder = KeyHolder(self._backend, self.namespace, ttl=self.ttl,
                                         liveness=self.liveness)  # fmt: skip
                self._pid = os.getpid()
            return self._backend, self._holder

    def store(self) -> RunStore:
        """The run store of the calling process."""
        return self._process()[0].runs

    def enter(
        self,
        task_id: str,
        retries: int,
        task_name: str,
        hostname: str,
        *,
        acks_late: bool,
        delivery: str | None = None,
        put_off: Collection[str] = (),
        namespace: str | None = None,
    ) -> Verdict:
        """Start this delivery's run; whether it runs (see the module).

        ``delivery``: this try's token (drawn here if not given). ``put_off``: the tries
        that put this copy off before (their tokens, from the copy's header), any of which
        may have started the run although the database did not answer. Raises
        BackendUnavailableError or SchemaMissingError when the database cannot say: the
        caller neither runs the task nor drops it, and names ``delivery`` in its copy.
        ``namespace``: where the run's row is (a beat run's message names the beat's, whose
        claim wrote it); default: this guard's.
        """
        _, holder = self._process()
        d = Delivery(task_name, 0, task_id, delivery or uuid.uuid4().hex, holder.identity(),
                     acks_late, tuple(put_off), retries, namespace is not None)  # fmt: skip
        ns = namespace or self.namespace
        ends = self._take()  # the ends waiting ride on this start: one commit for all
        try:
            decided = self._start(ns, d, holder, task_name, hostname, ends)
        except BaseException:
            with self._waiting:
                self._ends[:0] = ends  # not written: they wait for the next
            raise
        attempt = decided.row.attempt if decided.row is not None else 0
        if decided.run:
            self._prune()
        return Verdict(decided.verdict, decided.reason, d.key, d.token, attempt, ns, acks_late)

    def _start(
        self, namespace: str, d: Delivery, holder: KeyHolder, task_name: str, hostname: str,
        ends: list[End],
    ) -> Start:  # fmt: skip
        for first in (True, False):
            try:
                return self.store().start(namespace, d, holder.alive, task_name=task_name,
                                          hostname=hostname, ends=ends)  # fmt: skip
            except SchemaMissingError:
                if not (first and self.install):
                    raise
                self._process()[0].install()
        raise AssertionError("unreachable")  # pragma: no cover

    def _prune(self) -> None:
        """Delete a batch of rows older than the retention, if this process is due to."""
        now = time.monotonic()
        if now < self._next_prune:
            return
        self._next_prune = now + PRUNE_EVERY  # another thread's start does not prune meanwhile
        self._next_prune = now + prune(self.store(), self.namespace, self.retention, "run once")

    def finish(self, verdict: Verdict, outcome: str) -> None:
        """Close the run; a failure is logged, never raised (the body is over).

        Acknowledged early, the run's end rides on this process's next start (one
        commit for both), or is written alone after :data:`END_WAIT` seconds: no copy of
        it can run meanwhile (its start already skips them), and the history, the overlap
        policy and the overdue alarm see it end that much later. Under ``acks_late`` a
        redelivery would take a dead worker's run over: its end is written at once.
        """
        end = (verdict.namespace or self.namespace, verdict.key, verdict.delivery, outcome)
        if verdict.acks_late:
            self._write([end])
            return
        with self._waiting:
            self._ends.append(end)
            if self._timer is None or self._timer_pid != os.getpid():
                self._timer, self._timer_pid = threading.Timer(END_WAIT, self.flush), os.getpid()
                self._timer.daemon = True
                self._timer.start()

    def flush(self) -> None:
        """Write the ends waiting for a start, now (the timer's, and at the process's exit)."""
        with self._waiting:
            self._timer = None
        self._write(self._take())

    def _take(self) -> list[End]:
        with self._waiting:
            ends, self._ends = self._ends, []
        return ends

    def _write(self, ends: list[End]) -> None:
        for ns, key, delivery, outcome in ends:
            try:
                self.store().finish(ns, key, delivery, outcome)
            except (BackendUnavailableError, SchemaMissingError) as exc:
                log.warning(
                    "run once: could not close run %s (%s): under acks_late a redelivery of "
                    "it would run it again", key, exc,
                )  # fmt: skip

    def close(self) -> None:
        """Write the ends waiting; close this process's backend and liveness session."""
        if self._ends and self._pid == os.getpid():
            self.flush()
        with self._lock:
            if self._backend is not None and self._pid == os.getpid():
                if self._holder is not None:
                    self._holder.close()
                self._backend.close()
            self._backend, self._holder = None, None


def prune(
    store: RunStore, namespace: str, retention: float, who: str, *, history: bool = False,
    again: float = PRUNE_EVERY / 10,
) -> float:  # fmt: skip
    """Delete a batch of ``namespace``'s runs older than ``retention`` s (never raises).

    ``history``: the beat's runs (``RunStore.prune``). Returns the seconds until the next
    batch: ``again`` while a whole batch went.
    """
    try:
        gone = store.prune(namespace, retention, batch=PRUNE_BATCH, history=history)
    except ElectionError as exc:  # housekeeping: never a task's or a tick's failure
        log.warning("%s: could not prune old runs (%s)", who, exc)
        return PRUNE_EVERY
    return again if gone >= PRUNE_BATCH else PRUNE_EVERY


_current: RunGuard | None = None


def use(guard: RunGuard | None) -> None:
    """Make ``guard`` this process's (a worker with ``--election`` sets it before forking)."""
    global _current
    _current = guard


def current() -> RunGuard | None:
    """The guard a worker with ``--election`` set up, or None."""
    return _current
