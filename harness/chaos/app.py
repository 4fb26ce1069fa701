"""The Celery project the chaos runs start as ``celery worker --election`` and ``celery beat``.

Configured from the environment, one process at a time (each gets its own proxied URL):

CHAOS_BROKER, CHAOS_ELECTION (election URL), CHAOS_PREFIX (table prefix), CHAOS_NS
(workers' namespace; standalone beats elect in ``<ns>-beat``), CHAOS_TTL, CHAOS_LISTEN
("0" for poll only), CHAOS_HISTORY (the history file every process appends to).

Beat sends ``touch`` every second to the workers' leader queue; the leader worker runs it
and records the act under its term, read before a last trust check, and then that the run
ran (``ran``: the entry and the run, from the beat's ``election_run`` header): the checker
counts each run's executions. The driver gives ``touch`` ``catch_up="all"`` (the operable
schedule's policy for a static entry), so that every due time is a run of its own, also
those that fell due while nobody led: a run missing is lost, with no failover excused.
``acks_late``: a worker killed mid-run has its run redelivered, and run once more only if
it never finished (docs/beat.md).
"""

from __future__ import annotations

import os
from typing import Any

from celery import Celery

from celery_election import init_app, leader_task
from celery_election.core.clock import boottime
from celery_election.history import Recorder
from celery_election.integration.tasks import current_term

NS = os.environ.get("CHAOS_NS", "chaos")
TICK_EVERY = 1.0

app = Celery("chaos", broker=os.environ.get("CHAOS_BROKER", "memory://"))
app.conf.update(
    election_url=os.environ.get("CHAOS_ELECTION"),
    election_table_prefix=os.environ.get("CHAOS_PREFIX", "celery_election_"),
    election_namespace=NS,
    election_ttl=float(os.environ.get("CHAOS_TTL", "2")),
    election_listen=os.environ.get("CHAOS_LISTEN", "1") != "0",
    election_history_file=os.environ.get("CHAOS_HISTORY"),
    task_default_queue=f"q.{NS}",
    task_ignore_result=True,
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
    beat_scheduler="celery_election.beat:LeaderScheduler",
    beat_max_loop_interval=1,
    beat_schedule={
        "touch": {
            "task": "harness.chaos.app.touch",
            "schedule": TICK_EVERY,
            # past the skew fault's hour: a worker an hour fast would discard a run sent
            # with less as expired (Celery checks expires by the worker's clock)
            "options": {"expires": 7200},
        },
    },
)
init_app(app)

_recorder: Recorder | None = None


@leader_task(app=app, on_follower="requeue", bind=True, acks_late=True)  # type: ignore[untyped-decorator]
def touch(self: Any) -> None:
    """A leader task: record that it acted, under the term trusted at the last check."""
    global _recorder
    path = os.environ.get("CHAOS_HISTORY")
    if not path:
        return
    if _recorder is None:
        _recorder = Recorder(path, role="task")
    checked = boottime()
    term = current_term()  # the shared-memory trust check, as a careful task does
    if term is not None:
        _recorder.act(NS, term, checked, what="leader_task")
    run = getattr(self.request, "election_run", None)
    if run is not None:  # the run executed: its side effect, for the checker to count
        _recorder.record("ran", ns=f"{NS}-beat", entry="touch", run=run,
                         task_id=self.request.id, ppid=os.getppid())  # fmt: skip
