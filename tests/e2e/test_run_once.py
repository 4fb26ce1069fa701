"""Run once on real workers (``celery worker --election``, RabbitMQ + PostgreSQL).

A beat run delivered twice under the same task id (what a re-publish or a redelivery
looks like to a worker) executes once: the second is skipped and counted, in each pool
(prefork, threads, solo, gevent). With ``acks_late`` (the e2e project's setting), a
worker SIGKILLed mid-run has its run redelivered, and it executes exactly once more.
Executions are counted in the database (``tests.e2e.proj.tick`` inserts a row each).
"""

from __future__ import annotations

import signal
import uuid

import pytest
import sqlalchemy as sa

from celery_election.runs.runonce import run_key
from harness.cluster import Cluster, wait_until

from .test_metrics import free_port, get, sample

pytestmark = [pytest.mark.slow]

TICK = "tests.e2e.proj.tick"
#: What the beat puts on a run it sends (beat/sender.py): the run header makes it checked.
RUN = {"election_run": 1, "election_term": 1}


def executions(c: Cluster, task_id: str) -> list[str]:
    t = c.ticks
    with c.engine.connect() as conn:
        return [r[0] for r in conn.execute(sa.select(t.c.worker).where(t.c.task_id == task_id))]


def skips(c: Cluster, name: str) -> int:
    return (c.tmp / f"{name}.log").read_text().count("skipped: this run was delivered before")


def send(c: Cluster, task_id: str, *args: object) -> None:
    c.app.send_task(TICK, ["once", *args], task_id=task_id, headers=RUN, queue=c.env["E2E_QUEUE"])


@pytest.mark.parametrize("pool", ["prefork", "threads", "solo", "gevent"])
def test_a_redelivered_finished_run_is_skipped_and_counted(cluster: Cluster, pool: str) -> None:
    c = cluster
    c.start("w1", pool=pool, c=2 if pool != "solo" else 1)
    c.start("w2", pool=pool, c=1)  # a second worker: either may get either delivery
    tid = uuid.uuid4().hex
    send(c, tid)
    wait_until(lambda: executions(c, tid) or None, 30, "the first delivery runs")
    runs = c.backend.runs
    wait_until(
        lambda: (s := runs.load(c.namespace, run_key(tid))) and s.ended_us,
        10,
        "the run is marked finished",
    )
    send(c, tid)  # the same run again: what a re-publish or a redelivery delivers
    wait_until(lambda: skips(c, "w1") + skips(c, "w2") or None, 20, "the second is skipped")
    assert len(executions(c, tid)) == 1
    stored = runs.load(c.namespace, run_key(tid))
    assert stored.row.outcome == "SUCCESS" and stored.row.attempt == 1
    other = uuid.uuid4().hex  # a task sent without the beat's header is not checked
    c.app.send_task(TICK, ["plain"], task_id=other, queue=c.env["E2E_QUEUE"])
    c.app.send_task(TICK, ["plain"], task_id=other, queue=c.env["E2E_QUEUE"])
    wait_until(lambda: len(executions(c, other)) == 2 or None, 20, "unchecked tasks run")
    assert runs.load(c.namespace, run_key(other)) is None


def test_the_skip_is_counted_on_metrics(cluster: Cluster) -> None:
    c = cluster
    port = free_port()
    c.start("w1", "--election-metrics-port", str(port), c=2)
    tid = uuid.uuid4().hex
    send(c, tid)
    wait_until(lambda: executions(c, tid) or None, 30, "the first delivery runs")
    send(c, tid)
    wait_until(lambda: skips(c, "w1") or None, 20, "the second is skipped")

    def duplicates() -> float | None:
        status, body = get(port, "/metrics")
        labels = {"task": TICK, "outcome": "duplicate"}
        return sample(body, "celery_election_leader_tasks_total", **labels) if status else None

    assert wait_until(duplicates, 10, "the duplicate counted") == 1.0
    assert len(executions(c, tid)) == 1


@pytest.mark.parametrize("resent", [False, True], ids=["first-copy", "resent-copy"])
def test_acks_late_a_run_killed_mid_task_runs_exactly_once_more(
    cluster: Cluster, resent: bool
) -> None:
    """Also when the only copy is one the beat sent again (window 4 of issue 52: at
    50bbd93 its redelivery was skipped as "running", and the run never ended)."""
    c = cluster
    c.start("w1", c=1)
    tid = uuid.uuid4().hex
    headers = {**RUN, "election_resent": 2} if resent else RUN
    c.app.send_task(TICK, ["once", 3.0], task_id=tid, headers=headers,
                    queue=c.env["E2E_QUEUE"])  # fmt: skip  # runs 3 s: killed before it ends
    wait_until(lambda: executions(c, tid) or None, 30, "the run starts on w1")
    c.workers["w1"].signal_group(signal.SIGKILL)  # the worker and its pool child
    c.workers["w1"].wait(10)
    c.start("w2", c=1)  # RabbitMQ redelivers the unacked run to the next consumer
    wait_until(lambda: len(executions(c, tid)) == 2 or None, 60, "the redelivery runs it")
    runs = c.backend.runs

    def finished() -> int | None:
        stored = runs.load(c.namespace, run_key(tid))
        return stored.row.attempt if stored is not None and stored.ended_us else None

    assert wait_until(finished, 20, "the second attempt finishes") == 2
    send(c, tid)  # and once it finished, a further delivery is skipped
    wait_until(lambda: skips(c, "w2") or None, 20, "a delivery after the end is skipped")
    assert [w.split("@")[0] for w in executions(c, tid)] == ["w1", "w2"]
