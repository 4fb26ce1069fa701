"""The worker bootstep: one Elector per worker, a shared leadership record, a leader queue.

Order matters (docs/design.md, "Celery facts"):

* ``__init__`` (before any step starts, so before the pool and embedded beat fork) creates
  the shared record and writes "not leader" into it, so children inherit the mapping.
* ``start`` runs after the Pool and Beat steps have forked their processes (``requires``):
  an elector thread already talking to SQLite when a process forks can leave the child
  stuck on a lock copied while held. Later forks (``--max-tasks-per-child``,
  ``--autoscale``) wait for the elector's current database call (the SQLite backend
  holds a fork lock around each call).
* Leadership changes reach the consumer through ``consumer.call_soon``: start consuming
  the leader queue when elected, cancel it when revoked.
* ``stop`` (warm shutdown): the consumer step has already stopped consuming (steps stop
  in reverse order); the elector then resigns, so a follower takes over at once, and the
  record says "not leader" again.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import click
from celery import bootsteps

from .. import metrics
from ..backends.base import Backend
from ..core.identity import new_candidate_id
from ..election import shared_state
from ..election.elector import Elector, RevokeReason
from ..election.shared_state import SharedLeadership
from ..errors import ConfigurationError, ElectionError, SchemaMissingError, cannot_start
from ..process import ProcessElection
from ..runs import once, runonce
from ..settings import ElectionSettings, hide_password
from ..signals import leader_elected, leader_revoked
from .tasks import leader_queues

if TYPE_CHECKING:
    from ..schedule.overdue import OverdueWatch

__all__ = ["ElectionStep", "in_process_worker"]

log = logging.getLogger("celery_election.worker")

_BEAT_START = 60.0  # seconds an embedded beat has for its first tick (health probe)


class ElectionStep(bootsteps.StartStopStep):
    """Runs an Elector in the worker's main process for the worker's lifetime."""

    label = "Election"
    requires = ("celery.worker.components:Pool", "celery.worker.components:Beat")

    def __init__(
        self,
        worker: Any,
        election: bool | None = None,
        election_namespace: str | None = None,
        election_metrics_port: int | None = None,
        election_eligible: bool | None = None,
        **kwargs: Any,
    ) -> None:
        try:
            self.settings = ElectionSettings.from_app(
                worker.app,
                enabled=election,
                namespace=election_namespace,
                metrics_port=election_metrics_port,
                eligible=election_eligible,
            )
            if self.settings.enabled:
                self.settings.refuse_split()
        except ConfigurationError as exc:
            # One line and exit 1, as Celery's own bad options end (not a 55-line
            # traceback from inside the worker's construction).
            raise click.ClickException(
                cannot_start(exc, "fix the election_* settings or the --election options")
            ) from exc
        self.enabled = self.settings.enabled
        self.parts = ProcessElection(self.settings, "worker", log)
        self.shared: SharedLeadership | None = None
        self.guard: runonce.RunGuard | None = None
        self.counters: metrics.SharedCounters | None = None
        self.beats: list[metrics.BeatProbe] = []
        self.overdue: OverdueWatch | None = None
        super().__init__(worker, **kwargs)
        if not self.enabled:
            if self.settings.metrics_port is not None:
                log.warning(
                    "election: election_metrics_port is set but this worker runs no "
                    "election, so nothing is served: add --election (or election_enabled)"
                )
            return
        self.worker = worker
        worker.election = self
        self._extend_banner(worker)
        if kwargs.get("beat"):
            self._gate_embedded_beat(worker)
        if self.settings.metrics_port is not None:
            try:
                self.parts.serve(self._probe)
            except ConfigurationError as exc:  # the port is taken
                fix = "set election_metrics_port or --election-metrics-port to a free port"
                raise click.ClickException(cannot_start(exc, fix)) from exc
        # Before any fork: children inherit the mapping, and see "not leader" until told.
        self.shared = SharedLeadership.create()
        shared_state.use(self.shared)
        self._guard_beat_runs(worker)
        if self.settings.metrics_port is not None:
            self._share_counters(bool(kwargs.get("beat")))

    def _guard_beat_runs(self, worker: Any) -> None:
        """Run each beat run once here (runs/once.py): the check goes in before the pool forks."""
        self.guard = runonce.RunGuard.from_settings(self.settings)
        runonce.use(self.guard)
        once.guard_registered(worker.app)

    def _extend_banner(self, worker: Any) -> None:
        """Add the election's database (password hidden) and namespace to the banner."""
        startup_info = getattr(worker, "startup_info", None)
        if startup_info is None:  # an in-process WorkController prints no banner
            return
        s = self.settings
        lines = (
            f"[election]\n.> namespace:   {s.namespace} (leader queue {s.leader_queue})\n"
            f".> database:    {hide_password(s.url)} ({s.url_source})\n"
        )

        def with_election(*args: Any, **kwargs: Any) -> str:
            return f"{startup_info(*args, **kwargs)}\n{lines}"

        worker.startup_info = with_election

    @property
    def elector(self) -> Elector | None:
        """The worker's Elector while started."""
        return self.parts.elector

    @property
    def backend(self) -> Backend | None:
        return self.parts.backend

    @property
    def server(self) -> metrics.MetricsServer | None:
        """The /metrics server (``election_metrics_port``), if any."""
        return self.parts.server

    def _probe(self) -> tuple[bool, bool, list[str]]:
        elector = self.elector
        return metrics.health([elector] if elector is not None else [], self.beats)

    def _share_counters(self, beat: bool) -> None:
        """One counter table for this process, its pool children and its embedded beat."""
        from celery.signals import worker_process_init

        self.counters = metrics.SharedCounters.create()
        metrics.use_counters(self.counters)
        # a spawned child attaches by path (a forked one inherits the mapping)
        worker_process_init.connect(lambda **kw: metrics.store(), weak=False)
        if beat:
            ns = self.settings.namespace
            # late if the embedded beat has not ticked within a minute of starting
            metrics.allow_start(ns, _BEAT_START)
            self.beats = [metrics.BeatProbe(ns, grace=self.settings.config.ttl)]

    def _gate_embedded_beat(self, worker: Any) -> None:
        """``worker -B --election``: the embedded beat must send only on the leader."""
        scheduler = worker.scheduler
        name = scheduler if isinstance(scheduler, str) else getattr(scheduler, "__name__", "")
        if name in (None, "", "celery.beat:PersistentScheduler", "PersistentScheduler"):
            worker.scheduler = "celery_election.beat:LeaderScheduler"
            log.info("election: embedded beat uses celery_election.beat:LeaderScheduler")
            return
        from celery.utils.imports import symbol_by_name

        from ..beat import LeaderSchedulerMixin

        try:
            cls = symbol_by_name(scheduler)
        except Exception:
            cls = None
        if not (isinstance(cls, type) and issubclass(cls, LeaderSchedulerMixin)):
            log.warning(
                "election: embedded beat uses %s, which does not know about the election: "
                "every worker started with -B will send every task. Use a scheduler with "
                "celery_election.beat.LeaderSchedulerMixin.",
                scheduler,
            )

    # -- life cycle -------------------------------------------------------------------------

    def start(self, worker: Any) -> None:
        s = self.settings
        # Never consume the leader queue before leading, even if task_queues lists it.
        worker.app.amqp.queues.deselect(s.leader_queue)
        backend = self.parts.connect()
        log.info(
            "election: namespace %r in %s (%s), leader queue %r",
            s.namespace,
            backend.description,
            s.url_source,
            s.leader_queue,
        )
        if s.url_source.startswith("a SQLite file"):
            log.warning(
                "election: no election_url set and the app has no PostgreSQL/MySQL database "
                "URL, so workers elect through %s: only workers on this host, started from "
                "this directory, take part. Set election_url to share one election.",
                backend.description,
            )
        elector = self.parts.elect(
            s.namespace,
            new_candidate_id(worker.hostname),
            on_elected=self._elected,
            on_revoked=self._revoked,
            on_error=self._error,
        )
        shared = self.shared
        assert shared is not None
        elector.watch_trust(lambda term, until: shared.write(term, until, elector.token))
        if s.metrics_port is not None:
            # each entry's overdue seconds: judged by every worker, the followers too
            from ..schedule.overdue import OverdueWatch

            self.overdue = OverdueWatch(worker.app).start()
        self.parts.start()

    def stop(self, worker: Any) -> None:
        """Resign, publish "not leader", release everything (idempotent).

        Celery calls ``stop`` (warm shutdown) or ``terminate`` (cold shutdown) on worker
        steps, never ``shutdown``: so everything is released here, the /dev/shm record
        included (children that still map it keep a valid mapping that says "not leader").
        """
        self.parts.close()
        if self.overdue is not None:
            self.overdue.close()
            self.overdue = None
        if self.guard is not None:
            self.guard.close()
            runonce.use(None)
            self.guard = None
        if self.counters is not None:
            metrics.use_counters(None)
            self.counters.close()
            self.counters = None
        if self.shared is not None:
            self.shared.write(None, None)
            self.shared.close()
            shared_state.use(None)
            self.shared = None

    terminate = stop  # cold shutdown resigns too, or followers would wait out the lease
    shutdown = stop

    # -- callbacks (the elector's event thread) ---------------------------------------------

    def _elected(self, term: int) -> None:
        self._consume(True)
        leader_elected.send(
            sender=self.worker.hostname, term=term, namespace=self.settings.namespace
        )

    def _revoked(self, term: int, reason: RevokeReason) -> None:
        self._consume(False)
        leader_revoked.send(
            sender=self.worker.hostname,
            term=term,
            namespace=self.settings.namespace,
            reason=reason.value,
        )

    def _error(self, exc: BaseException) -> None:
        if isinstance(exc, SchemaMissingError) and self.settings.auto_install:
            self.parts.install()

    def _consume(self, on: bool) -> None:
        """Start or stop consuming the leader queue, in the consumer's own thread."""
        consumer = getattr(self.worker, "consumer", None)
        if consumer is None:
            return
        queue = self.settings.leader_queue

        def apply() -> None:
            queues = consumer.app.amqp.queues
            started = getattr(consumer, "task_consumer", None) is not None
            try:
                if on and started:
                    consumer.add_task_queue(queue)
                elif on:
                    queues.select_add(queues[queue])  # consumed once the consumer starts
                elif started:
                    consumer.cancel_task_queue(queue)
                else:
                    queues.deselect(queue)
            except Exception:  # the consumer may be restarting or stopping
                log.exception("election: could not %s the leader queue", "add" if on else "cancel")

        consumer.call_soon(apply)

    # -- remote control ---------------------------------------------------------------------

    def info(self) -> dict[str, Any]:
        """The worker's view of its election, for ``celery inspect election``."""
        e = self.elector
        lease = e.last_lease if e is not None else None
        return {
            "namespace": self.settings.namespace,
            "leader": bool(e and e.is_leader),
            "state": e.state.value if e is not None else "stopped",
            "term": e.term if e is not None and e.is_leader else (lease.term if lease else None),
            "leader_id": e.leader_id if e is not None else None,
            "candidate_id": e.candidate_id if e is not None else None,
            # False: it never takes a term (--no-election-eligible)
            "eligible": self.settings.eligible,
            "release": e.release if e is not None else None,
            "trusted_for": round(e.trusted_for, 3) if e is not None else 0.0,
            "database": self.backend.description if self.backend is not None else None,
            "leader_queue": self.settings.leader_queue,
            # "off", or this worker's use of the liveness lock: holding / waiting / standby / idle
            "liveness": e.liveness if e is not None else "off",
            "liveness_delta": e.config.liveness if e is not None else None,
        }


@contextlib.contextmanager
def in_process_worker(app: Any, *, pool: str = "solo", **options: Any) -> Iterator[Any]:
    """Celery's in-process test worker on ``app``, consuming the leader queue(s) too.

    The test kit's ``celery_election.testing.worker``: it lives here, on the Celery side.

    ``options`` go to ``celery.contrib.testing.worker.start_worker`` (then to the
    WorkController): ``queues`` (default: the app's default queue) gets the leader queues
    added, and ``election`` defaults to False, so a worker of an ``init_app`` app runs no
    elector of its own and the controller's record decides. Registers Celery's ``ping``
    task, which the worker's start-up check sends (unless ``perform_ping_check=False``).
    Start and stop take milliseconds on the memory broker polled every 10 ms
    (``broker_transport_options={"polling_interval": 0.01}``), not the ~0.5 s and ~4 s of
    Celery's ``celery_worker`` fixture.
    """
    from celery.contrib.testing.worker import start_worker

    app.loader.import_module("celery.contrib.testing.tasks")
    queues = list(options.pop("queues", None) or [app.conf.task_default_queue])
    for name in leader_queues(app):
        if name not in queues:
            queues.append(name)
    options.setdefault("election", False)
    check = options.pop("perform_ping_check", True)
    timeout = options.pop("ping_task_timeout", 10.0)
    with start_worker(app, pool=pool, queues=queues, perform_ping_check=False, **options) as w:
        try:
            if check:  # Celery's check, polling the result every 10 ms instead of 500
                from celery.result import allow_join_result

                with allow_join_result():
                    pong = app.tasks["celery.ping"].apply_async(queue=queues[0])
                    answer = pong.get(timeout=timeout, interval=0.01)
                if answer != "pong":
                    raise ElectionError(f"the test worker answered its ping with {answer!r}")
            yield w
        finally:
            _wake_to_stop(app, queues[0])


def _wake_to_stop(app: Any, queue: str) -> None:
    """Make the stop that follows take milliseconds instead of about 4 seconds.

    ``start_worker`` stops its worker by setting ``should_terminate``, which the
    consumer's loop checks between two waits for a message of up to 2 s each (and it
    waits once more after seeing the flag). Set the flag now and send two pings, one to end
    each wait. (If the worker happens to be between waits, one ping stays queued and the
    next worker on this broker answers it.)
    """
    from celery.worker import state

    state.should_terminate = 0  # what start_worker does next; it resets it after the join
    ping = app.tasks["celery.ping"]
    for _ in range(2):
        ping.apply_async(queue=queue, ignore_result=True)
