"""The Celery project the chaos runs start as ``celery worker --election`` and ``celery beat``.

Configured from the environment, one process at a time (each gets its own proxied URL):

CHAOS_BROKER, CHAOS_ELECTION (election URL), CHAOS_PREFIX (table prefix), CHAOS_NS
(workers' namespace; standalone beats elect in ``<ns>-beat``), CHAOS_TTL, CHAOS_LISTEN
("0" for poll only), CHAOS_HISTORY (the history file every process appends to).

Beat sends ``touch`` every second to the workers' leader queue; the leader worker runs it
and records the act under its term, read before a last trust check.
"""

from __future__ import annotations

import os

from celery import Celery

from celery_election import init_app, leader_task
from celery_election.clock import boottime
from celery_election.history import Recorder
from celery_election.tasks import current_term

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
            "options": {"expires": 30},
        },
    },
)
init_app(app)

_recorder: Recorder | None = None


@leader_task(app=app, on_follower="requeue")  # type: ignore[untyped-decorator]
def touch() -> None:
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
