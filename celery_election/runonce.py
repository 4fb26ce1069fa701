"""Run once on the workers: a run's start record decides whether a delivery runs it.

The broker may deliver one run twice: the beat re-publishes a run it cannot prove was
sent (under the same task id), Celery redelivers after a lost ack, Redis after
``visibility_timeout``. Before running, a worker records the run as started in the
election database with one insert-if-absent statement (``StartStore.record_start``); the
delivery whose insert found the row is a duplicate and is skipped. Decided by the
database, so it holds across workers, hosts and pools.

A worker that dies mid-run leaves its record unfinished. What a later delivery does then:

* by default (the message was acknowledged before the run): nothing more arrives from the
  broker, and a re-published copy is skipped: **at most once**;
* ``acks_late`` (the message is acknowledged after the run, so a dead worker's run is
  redelivered): a delivery of a run that never *finished* takes the record over for one
  more attempt (a compare-and-set on the attempt, so one redelivery wins) and runs it;
  one that finished (success, failure or a retry) is skipped. A copy the beat sent again
  (``resent``: it could not prove the first went out) is not a redelivery: while the run
  is unfinished it is skipped, since the first copy is running, or comes back from the
  broker if its worker died.

A delivery put off because the database did not answer may find the record its own try
wrote (the insert committed, the answer was lost): named by ``mine``, that record is its
own, and it runs, in either mode.

The run key is the task id and its retry number: a retry (same id, one more retry) is a
new run. Part of the core: no Celery here (``once.py`` is the Celery side).
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from .backends import backend_from_url
from .backends.base import Backend, StartStore, TaskStart
from .errors import BackendUnavailableError, ElectionError, SchemaMissingError
from .settings import ElectionSettings

__all__ = ["RunGuard", "Verdict", "current", "not_run", "ran", "run_key", "start_owner", "use"]

log = logging.getLogger("celery_election.runonce")

#: A process deletes start records past the retention this often (seconds), this many at most.
PRUNE_EVERY, PRUNE_BATCH = 600.0, 5000


#: A request attribute: this delivery did not run the run (a duplicate skipped, or put off
#: to come back): its IGNORED is not the run's end, and its history row stays open.
NOT_RUN = "election_not_run"


def not_run(request: object) -> None:
    """Say that this delivery ends without running its run (see :data:`NOT_RUN`)."""
    setattr(request, NOT_RUN, True)


def ran(request: object) -> bool:
    """Whether this delivery's end is its run's end (it was not skipped or put off)."""
    return not getattr(request, NOT_RUN, False)


def start_owner(hostname: str, pid: int) -> str:
    """Who wrote a start record, as a put-off delivery names the try that put it off."""
    return f"{hostname}:{pid}"


def run_key(task_id: str, retries: int = 0) -> str:
    """A run's key: a hash of the task id and its retry number (fits a MySQL key)."""
    return hashlib.sha1(f"{task_id}/{retries}".encode()).hexdigest()


@dataclass(frozen=True)
class Verdict:
    """Whether this delivery runs, and why.

    ``reason``: "recorded" (the first start), "rerun" (acks_late: an unfinished run taken
    over; or a put-off delivery whose own try had recorded it), "duplicate" (started
    before, by default never run twice), "finished" (acks_late: it ran to its end), "taken"
    (acks_late: another redelivery took it over first), "running" (acks_late: a copy sent
    again while the run is unfinished: only a redelivery takes it over).
    """

    run: bool
    reason: str
    key: str
    attempt: int = 1


class RunGuard:
    """One process's start records: a backend of its own, opened at first use.

    ``connect`` builds the backend; each process (a prefork child, a solo worker) opens
    its own on first use, so nothing opened before a fork is shared after it.
    ``install`` (``election_auto_install``): create missing tables on first refusal.
    ``retention``: seconds a start record is kept; each process deletes a batch of older
    ones every :data:`PRUNE_EVERY` seconds (sooner while a whole batch went), so the table
    holds about a retention's worth of runs however many workers write to it.
    """

    def __init__(
        self,
        connect: Callable[[], Backend],
        namespace: str,
        *,
        install: bool = False,
        retention: float = 86400.0,
    ) -> None:
        self.connect, self.namespace, self.install = connect, namespace, install
        self.retention = retention
        self._backend: Backend | None = None
        self._pid = 0
        self._lock = threading.Lock()
        self._next_prune = 0.0

    @classmethod
    def from_settings(cls, settings: ElectionSettings) -> RunGuard:
        """The guard of an app's settings (a backend of its own per process)."""
        url, options = settings.url, settings.backend_options(listen=False)
        return cls(
            lambda: backend_from_url(url, **options),
            settings.namespace,
            install=settings.auto_install,
            retention=settings.run_once_retention,
        )

    def store(self) -> StartStore:
        """The start store of the calling process (a new backend after a fork)."""
        with self._lock:
            if self._backend is None or self._pid != os.getpid():
                self._backend = self.connect()
                self._pid = os.getpid()
            return self._backend.starts

    def enter(
        self,
        task_id: str,
        retries: int,
        task_name: str,
        hostname: str,
        *,
        acks_late: bool,
        resent: bool = False,
        mine: str | None = None,
    ) -> Verdict:
        """Record this delivery's start; whether it runs (see the module).

        ``resent``: a copy its sender published again (the beat's resend of a run it could
        not prove sent), not the broker's redelivery. ``mine``: this delivery was put off
        by a try that wrote its record as ``hostname:pid`` (:func:`start_owner`), which may
        have committed although the database did not answer. Raises
        BackendUnavailableError or SchemaMissingError when the database cannot say: the
        caller neither runs the task nor drops it.
        """
        key = run_key(task_id, retries)
        start = TaskStart(key, task_id, task_name, hostname, os.getpid(), 1, 0)
        if self._record(start):
            self._prune()
            return Verdict(True, "recorded", key)
        if not acks_late and mine is None:
            return Verdict(False, "duplicate", key)
        store = self.store()
        seen = store.load_start(self.namespace, key)
        if seen is None:  # deleted meanwhile (an operator's clean-up): record it again
            return Verdict(self._record(start), "recorded", key)
        if seen.finished_at_us is not None:
            return Verdict(False, "finished", key, seen.attempt)
        own = mine == start_owner(seen.hostname, seen.pid)
        if not (acks_late or own):
            return Verdict(False, "duplicate", key)
        if resent and not own:
            # the first copy runs (or its worker died: the broker brings that copy back)
            return Verdict(False, "running", key, seen.attempt)
        if store.rerun_start(self.namespace, key, seen.attempt, hostname, os.getpid()):
            return Verdict(True, "rerun", key, seen.attempt + 1)
        return Verdict(False, "taken", key, seen.attempt)

    def _record(self, start: TaskStart) -> bool:
        try:
            return self.store().record_start(self.namespace, start)
        except SchemaMissingError:
            if not self.install:
                raise
            with self._lock:
                assert self._backend is not None
                self._backend.install()
            return self.store().record_start(self.namespace, start)

    def _prune(self) -> None:
        """Delete a batch of records older than the retention, if this process is due to."""
        now = time.monotonic()
        if now < self._next_prune:
            return
        self._next_prune = now + PRUNE_EVERY
        try:
            gone = self.store().prune_starts(self.namespace, self.retention, batch=PRUNE_BATCH)
        except ElectionError as exc:  # housekeeping: never the task's failure
            log.warning("run once: could not prune old start records (%s)", exc)
            return
        if gone >= PRUNE_BATCH:  # more are left: the next batch soon
            self._next_prune = now + PRUNE_EVERY / 10

    def finish(self, verdict: Verdict, outcome: str) -> None:
        """Mark the run finished; a failure is logged, never raised (the run is over)."""
        try:
            self.store().record_finish(
                self.namespace, verdict.key, outcome, attempt=verdict.attempt
            )
        except (BackendUnavailableError, SchemaMissingError) as exc:
            log.warning(
                "run once: could not mark run %s finished (%s): under acks_late a "
                "redelivery of it would run it again",
                verdict.key,
                exc,
            )

    def close(self) -> None:
        """Close this process's backend (idempotent)."""
        with self._lock:
            if self._backend is not None and self._pid == os.getpid():
                self._backend.close()
            self._backend = None


_current: RunGuard | None = None


def use(guard: RunGuard | None) -> None:
    """Make ``guard`` this process's (a worker with ``--election`` sets it before forking)."""
    global _current
    _current = guard


def current() -> RunGuard | None:
    """The guard a worker with ``--election`` set up, or None."""
    return _current
