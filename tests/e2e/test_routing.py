"""Leader tasks sent by name reach the leader, however they are sent.

Two ``celery worker --election`` on RabbitMQ. ``send_task`` by name (another process
enqueuing work with the app) and ``celery call`` bypass the task's ``apply_async``; before
the router, their messages went to the default queue, a follower took about half of them
and (``on_follower="skip"``) dropped them. The task used here skips on a follower, so a
single misrouted message shows as a missing run.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from harness.cluster import ROOT, Cluster, wait_until

pytestmark = pytest.mark.slow
N = 20


def python(code: str, env: dict[str, str]) -> None:
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_send_task_and_celery_call_by_name_run_on_the_leader(cluster: Cluster) -> None:
    c = cluster
    c.start("w1")
    c.start("w2")
    c.wait_candidates(2)
    leader = c.wait_leader(30)
    lease = c.lease()
    assert lease is not None
    name = "tests.e2e.proj.skip"
    # send_task by name, as a service that enqueues work with the app does
    python(
        f"from tests.e2e.proj import app\n"
        f"for i in range({N}):\n"
        f"    app.send_task({name!r}, [f'send-{{i}}'])\n",
        c.env,
    )
    # `celery call`, one process per call, as from a shell or a cron job
    for i in range(N):
        done = subprocess.run(
            [sys.executable, "-m", "celery", "-A", "tests.e2e.proj", "call", name,
             "--args", f'["call-{i}"]'],
            env=c.env, cwd=ROOT, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
    wanted = {f"send-{i}" for i in range(N)} | {f"call-{i}" for i in range(N)}
    wait_until(
        lambda: wanted <= {r.label for r in c.rows(c.runs)}, 60, f"{2 * N} runs by the leader"
    )
    runs = [r for r in c.rows(c.runs) if r.label in wanted]
    assert len(runs) == 2 * N  # each once
    assert {r.worker.split("@")[0] for r in runs} == {leader}
    assert {r.term for r in runs} == {lease.term}
    follower = "w2" if leader == "w1" else "w1"
    assert "not the leader" not in (c.tmp / f"{follower}.log").read_text()  # none reached it
