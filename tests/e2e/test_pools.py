"""Every worker pool users run, on RabbitMQ and on Redis, as real processes (issue 33).

For each pool (prefork, threads, solo, gevent, eventlet on RabbitMQ; prefork and gevent on
Redis): two ``celery worker -P <pool> -c 4 --election`` in working directories of their
own, one worker of the same pool without ``--election`` beside them, two standalone
``celery beat`` with the LeaderScheduler. Then, each step checked from the database:

one leader -> leader tasks by name all run on it -> the follower serves its own queue
while it waits on the lock (the no-election worker's latency printed beside it) -> a
remote ``election_resign`` moves leadership, leader tasks follow -> SIGKILL of the leading
worker and of the leading beat: another leads through the liveness lock (before the
lease would have ended), leader tasks follow -> every beat run sent once -> no CRITICAL
and no traceback in any log.

Under eventlet a follower's lock wait used to freeze its whole worker (0 of 50 plain
tasks in 60 s): that cell fails on the code before backends/green.py.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import time
from collections import Counter
from pathlib import Path

import pytest

from harness.cluster import Cluster, wait_until

from ..conftest import server_url
from ..support.locks import waiting_on_lock
from .test_worker_election import _inspect, remote

CELLS = [
    ("prefork", "amqp"),
    ("threads", "amqp"),
    ("solo", "amqp"),
    ("gevent", "amqp"),
    ("eventlet", "amqp"),
    ("prefork", "redis"),
    ("gevent", "redis"),
]
TTL = 12.0  # long: a take-over well inside it is the liveness lock's, not the lease's

pytestmark = [pytest.mark.slow, pytest.mark.tier2, pytest.mark.timeout(600)]


def _leader_tasks_on(c: Cluster, leader: str, label: str, n: int = 20) -> None:
    """``n`` leader tasks sent by name all run, all on ``leader``.

    ``on_follower="requeue"``: a task the old leader had prefetched when it resigned
    goes back to the leader queue instead of being skipped.
    """
    for i in range(n):
        c.send("requeue", f"{label}{i}")
    wanted = {f"{label}{i}" for i in range(n)}

    def done() -> list[str] | None:
        ran = [r.worker.split("@")[0] for r in c.rows(c.runs) if r.label in wanted]
        return ran if len(ran) >= n else None

    ran = wait_until(done, 90, f"{n} leader tasks {label}*")
    assert set(ran) == {leader}, Counter(ran)


def _plain_latencies(c: Cluster, worker: str, n: int = 50) -> list[float]:
    """Send ``n`` plain tasks to ``worker``'s own queue; each one's seconds to a result."""
    sent = [(time.monotonic(), c.send("plain", f"{worker}-p{i}", queue=c.own_queue(worker)))
            for i in range(n)]  # fmt: skip
    latencies = []
    for t0, result in sent:
        result.get(timeout=60, interval=0.02)
        latencies.append(time.monotonic() - t0)
    return latencies


def _failover(c: Cluster, victim: str) -> float:
    """SIGKILL ``victim`` (leading): seconds until another holds the lease (database view)."""
    # the other worker waits on the lock (a resigned one stays out for resign_backoff)
    db = str(c.engine.url.render_as_string(hide_password=False))
    wait_until(lambda: waiting_on_lock(db, c.prefix, c.namespace), 2 * TTL, "a standby")
    before = c.lease()
    assert before is not None
    t0 = time.monotonic()
    c.signal(victim, signal.SIGKILL)
    c.wait_leader(TTL + 10, other_than=victim)
    took = time.monotonic() - t0
    after = c.lease()
    assert after is not None and after.term > before.term
    # the dead leader's lock session released at once: taken before its lease ended
    assert after.acquired_at_us is not None and after.acquired_at_us < before.expires_at_us
    return took


@pytest.mark.parametrize(("pool", "broker"), CELLS, ids=[f"{p}-{b}" for p, b in CELLS])
def test_pool_and_broker(pool: str, broker: str, tmp_path: Path) -> None:
    if pool in ("gevent", "eventlet"):
        pytest.importorskip(pool)
    db = server_url("postgresql")
    c = Cluster(tmp_path, server_url(broker), db, f"db+{db}", ttl=TTL, beat=True)
    try:
        for name in ("w1", "w2"):
            c.start(name, pool=pool, c=4)
        c.start("plain", pool=pool, c=4, election=False)
        c.start_beat("b1")
        c.start_beat("b2")
        leader = c.wait_leader(60)
        follower = next(w for w in ("w1", "w2") if w != leader)
        replies = wait_until(lambda: _inspect(c, 3), 60, "three workers answering inspect")
        node = next(n for n in replies if n.startswith(f"{leader}@"))
        assert [n for n, r in replies.items() if r.get("leader")] == [node], replies

        _leader_tasks_on(c, leader, "a")
        # the follower waits on the liveness lock meanwhile; it must serve its own queue
        waiting = _plain_latencies(c, follower)
        stock = _plain_latencies(c, "plain")
        median = statistics.median
        print(f"\n{pool}/{broker}: plain tasks, median seconds: follower {median(waiting):.3f}"
              f", no election {median(stock):.3f}")  # fmt: skip

        assert "resigned" in json.dumps(remote(c, "election_resign", node))
        leader = c.wait_leader(15, other_than=leader)
        _leader_tasks_on(c, leader, "b")

        beat = c.wait_beat_leader(60)
        took = _failover(c, leader)
        c.signal(beat, signal.SIGKILL)
        print(f"{pool}/{broker}: worker failover after SIGKILL {took:.2f} s")
        leader = c.wait_leader(5)
        _leader_tasks_on(c, leader, "c")
        survivor = c.wait_beat_leader(TTL + 10, other_than=beat)

        # the surviving beat sends on: new runs after the kill, each run key sent once
        sent_before = len(c.rows(c.ticks))
        wait_until(lambda: len(c.rows(c.ticks)) >= sent_before + 4, 30, "beat runs after the kill")
        # sent once: one task id per run key (a SIGKILLed worker's acks_late tick runs
        # again under the same id: Celery's at-least-once, not a second send)
        sends: dict[tuple[str, int], set[str]] = {}
        for t in c.rows(c.ticks):
            sends.setdefault((t.entry, t.run), set()).add(t.task_id)
        assert sends and all(len(ids) == 1 for ids in sends.values()), sends
        assert survivor in c.alive()

        for log in tmp_path.glob("*.log"):
            text = log.read_text(errors="replace")
            assert "CRITICAL" not in text and "Traceback" not in text, (
                f"{log.name}:\n{text[-3000:]}"
            )
    except BaseException:
        print(c.logs())
        raise
    finally:
        c.close()


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize("pool", ["prefork", "threads"])
def test_a_sigkilled_worker_leaves_no_process_behind(pool: str, tmp_path: Path) -> None:
    """``worker -B --election``: SIGKILL of the main process ends its embedded beat too.

    The embedded beat used to stay, re-parented to init, with its sockets open.
    """
    db = server_url("postgresql")
    c = Cluster(tmp_path, server_url("amqp"), db, f"db+{db}", ttl=TTL, beat=True)
    try:
        c.start("w1", "-B", pool=pool)
        c.wait_leader(60)
        pgid = c.workers["w1"].pid  # a session of its own: its group is the worker's
        wait_until(lambda: len(c.rows(c.ticks)) >= 2, 60, "the embedded beat sending")
        c.signal("w1", signal.SIGKILL)
        c.wait_exit("w1")  # reaped: a zombie would still count in the group
        wait_until(lambda: not _group_alive(pgid), 10, "the worker's processes to end")
    except BaseException:
        print(c.logs())
        raise
    finally:
        c.close()


#: the README's recommendation for Redis: kombu sweeps every interval x throttle seconds
#: (100 s by default), and restores what has waited longer than visibility_timeout
RECOMMENDED = {"visibility_timeout": 20.0, "unacked_restore_throttle": 1}


@pytest.mark.parametrize("visibility", [None, 20.0], ids=["default", "recommended"])
def test_redis_returns_a_killed_leaders_tasks_after_the_visibility_timeout(
    visibility: float | None, tmp_path: Path
) -> None:
    """On Redis a SIGKILLed leader's unacked leader tasks return after ``visibility_timeout``.

    kombu keeps a consumed message in its ``unacked`` hash until it is acked; a dead
    worker never acks, and a consumer restores what is older than the timeout (at start
    and every ``unacked_restore_interval`` x ``unacked_restore_throttle`` seconds on
    prefork's event loop: 10 x 10 by default). Measured, and printed, from the kill until
    both tasks the leader was running have run again on the new leader.
    """
    db = server_url("postgresql")
    broker = server_url("redis")
    c = Cluster(tmp_path, broker, db, f"db+{db}", ttl=TTL)
    if visibility is not None:
        c.env["E2E_BROKER_OPTIONS"] = json.dumps({**RECOMMENDED, "visibility_timeout": visibility})
    window = 75.0  # the default (3600 s) is not waited out: printed as "not within"
    try:
        c.start("w1", c=2)
        leader = c.wait_leader(60)
        c.start("w2", c=2)
        wait_until(lambda: waiting_on_lock(db, c.prefix, c.namespace), 2 * TTL, "a standby")
        for i in range(2):
            c.send("slow", f"k{i}", None, 4.0)
        running = {f"k{i}" for i in range(2)}

        def started() -> bool:
            return running <= {r.label for r in c.rows(c.runs)}

        wait_until(started, 30, "the leader running both slow tasks")
        t0 = time.monotonic()
        c.signal(leader, signal.SIGKILL)
        successor = c.wait_leader(TTL + 10, other_than=leader)

        def rerun() -> bool:
            again = {r.label for r in c.rows(c.runs) if r.worker.startswith(f"{successor}@")}
            return running <= again

        deadline = t0 + (visibility or 0) + window
        while not rerun() and time.monotonic() < deadline:
            time.sleep(0.2)
        setting = (
            "kombu's defaults (visibility_timeout=3600 s, a sweep every 100 s)"
            if visibility is None
            else f"visibility_timeout={visibility:g} s, unacked_restore_throttle=1"
        )
        if rerun():
            print(f"\nredis, {setting}: the killed leader's 2 tasks ran on the new "
                  f"leader {time.monotonic() - t0:.1f} s after the kill")  # fmt: skip
            assert visibility is not None and time.monotonic() - t0 >= visibility
        else:
            print(f"\nredis, {setting}: the killed leader's 2 tasks had not run "
                  f"{time.monotonic() - t0:.0f} s after the kill")  # fmt: skip
            assert visibility is None, "the tasks did not come back within the timeout + 75 s"
    except BaseException:
        print(c.logs())
        raise
    finally:
        c.close()
