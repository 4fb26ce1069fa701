"""Singleton tasks in real workers (issue 43): one running per key, a dead holder replaced.

Two ``celery worker`` processes, one prefork (``-c 4``: four holders, one per child) and
one gevent (``-c 8``), on RabbitMQ, with tests/e2e/proj.py's ``exclusive`` task, which
records each execution's start and end on the database clock (under gevent from a pool
thread, as docs/singleton.md advises for SQLite). Everything is checked from those records:

* 200 tasks over 10 keys, random durations, ``on_busy="requeue"``: per key no execution
  starts before the previous one ended, terms grow in that order, and every task ran
  exactly once;
* the holder of a key (a prefork child) SIGKILLed mid-task: the next instance of that key
  starts (printed: about delta + the requeue delay, under a second at E2E_TTL=3);
* the holder SIGSTOPped past delta (tier 2): the next instance starts (PostgreSQL ends the
  stopped session after delta, MariaDB after its whole-second wait_timeout, SQLite only
  when the hold's lease ends: the stopped process keeps its file lock), and the stopped
  one, resumed, finds its term superseded.

PostgreSQL here (tier 1, about 30 s); MariaDB and SQLite, and the pause, in the second tier.
"""

from __future__ import annotations

import itertools
import os
import random
import signal
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.cluster import Cluster, wait_until

from ..conftest import server_url

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

TASK = "tests.e2e.proj.exclusive"
KEYS = [f"acct-{i}" for i in range(10)]
N = 200


def _db(kind: str, tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/election.db" if kind == "sqlite" else server_url(kind)


@pytest.fixture(
    params=[
        "postgresql",
        pytest.param("mysql", marks=pytest.mark.tier2),
        pytest.param("sqlite", marks=pytest.mark.tier2),
    ]
)
def cluster(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Cluster]:
    pytest.importorskip("gevent")
    db = _db(request.param, tmp_path)
    c = Cluster(tmp_path, server_url("amqp"), db, "cache+memory://")
    try:
        c.start("w1", election=False, pool="prefork", c=4)
        c.start("w2", election=False, pool="gevent", c=8)
        yield c
    finally:
        c.close()


def send(c: Cluster, key: str, label: int, seconds: float, queue: str | None = None) -> None:
    c.app.send_task(TASK, [key, label, seconds], queue=queue or f"q.{c.namespace}")


def executions(c: Cluster) -> list[Any]:
    return [r for r in c.rows(c.ticks) if r.run is not None]


def started(c: Cluster, label: int) -> Any:
    return next((r for r in executions(c) if r.run == label), None)


def check_one_at_a_time(rows: list[Any]) -> None:
    """Per key, in start order: each starts after the previous ended, with a greater term."""
    by_key: dict[str, list[Any]] = defaultdict(list)
    for r in rows:
        by_key[r.entry].append(r)
    for key, runs in by_key.items():
        runs.sort(key=lambda r: (r.started_at, r.id))
        for before, after in itertools.pairwise(runs):
            assert before.ended_at is not None and after.started_at >= before.ended_at, (
                key, before, after,
            )  # fmt: skip
            assert after.term > before.term, (key, before, after)


def test_each_key_runs_alone_every_task_once_and_a_killed_holder_is_replaced(
    cluster: Cluster,
) -> None:
    c = cluster
    rng = random.Random(43)
    t0 = time.monotonic()
    for i in range(N):
        send(c, KEYS[i % len(KEYS)], i, rng.uniform(0.0, 0.1))
    try:
        wait_until(
            lambda: sum(1 for r in executions(c) if r.ended_at is not None) >= N, 120, f"{N} ends"
        )
    except AssertionError:
        ended = sum(1 for r in executions(c) if r.ended_at is not None)
        held = [(h.key, h.leader_id, h.term) for h in c.backend.keys.held(c.namespace)]
        rows = {r.run: r for r in executions(c)}
        missing = [
            (i, rows.get(i)) for i in range(N) if rows.get(i) is None or not rows[i].ended_at
        ]
        errors = [line for p in sorted(c.tmp.glob("*.log")) for line in p.read_text().splitlines()
                  if "ERROR" in line or "WARNING" in line]  # fmt: skip
        raise AssertionError(
            f"{ended} of {N} ended; missing {missing}; held: {held}\n" + "\n".join(errors[-40:])
        ) from None
    took = time.monotonic() - t0
    rows = executions(c)
    counts = Counter(r.run for r in rows)
    assert sorted(counts) == list(range(N)) and set(counts.values()) == {1}, counts
    check_one_at_a_time(rows)
    pools = Counter(r.worker.split("@")[0] for r in rows)
    print(f"\n{N} tasks over {len(KEYS)} keys in {took:.1f} s; executions by worker: {dict(pools)}")
    assert set(pools) == {"w1", "w2"}  # both pools ran some

    # the holder of a key, a prefork child, SIGKILLed mid-task
    send(c, "victim", 1000, 60.0, queue=c.own_queue("w1"))
    victim = wait_until(lambda: started(c, 1000), 30, "the victim's execution")
    send(c, "victim", 1001, 0.05, queue=c.own_queue("w2"))
    pid = int(victim.worker.rsplit(":", 1)[1])
    killed = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    nxt = wait_until(lambda: started(c, 1001), 60, "the next instance of the key")
    print(f"next instance of a SIGKILLed holder's key started {time.monotonic() - killed:.2f} s "
          f"after the kill (ttl 3 s, delta 0.56 s, requeue delay 0.2 s)")  # fmt: skip
    assert nxt.term > victim.term
    assert not any(r.task.startswith("end") and r.label == "1000" for r in c.rows(c.runs))


@pytest.mark.tier2
def test_a_paused_holders_key_is_taken_and_it_finds_its_term_superseded(
    cluster: Cluster,
) -> None:
    c = cluster
    send(c, "paused", 2000, 4.0, queue=c.own_queue("w1"))
    first = wait_until(lambda: started(c, 2000), 30, "the execution to pause")
    pid = int(first.worker.rsplit(":", 1)[1])
    os.kill(pid, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        send(c, "paused", 2001, 0.05, queue=c.own_queue("w2"))
        nxt = wait_until(lambda: started(c, 2001), 90, "the next instance of a paused key")
        print(f"\nnext instance of a SIGSTOPped holder's key started "
              f"{time.monotonic() - stopped:.2f} s after the stop")  # fmt: skip
        assert nxt.term > first.term
    finally:
        os.kill(pid, signal.SIGCONT)

    def end() -> Any:
        return next((r for r in c.rows(c.runs) if r.label == "2000"), None)

    resumed = wait_until(end, 30, "the resumed execution's end")
    assert resumed.task == "end:superseded" and resumed.term == first.term


@pytest.mark.tier2
def test_one_waiting_runs_the_running_one_and_one_more(cluster: Cluster) -> None:
    """``one_waiting=True``: five instances sent while one runs make one more run, not five."""
    from celery_election.keys.singleton import waiting_key

    c = cluster
    one = "tests.e2e.proj.exclusive_one"
    c.app.send_task(one, ["burst", 3000, 3.0], queue=c.own_queue("w1"))
    first = wait_until(lambda: started(c, 3000), 30, "the running instance")
    for label in range(3001, 3006):
        c.app.send_task(one, ["burst", label, 0.05], queue=f"q.{c.namespace}")
    key = f'{one}:{{"key":"burst"}}'
    wait_until(lambda: (h := c.backend.keys.get(c.namespace, waiting_key(key))) and h.held,
               30, "one instance waiting")  # fmt: skip

    def ended(n: int) -> list[Any] | None:
        rows = [r for r in executions(c) if r.entry == "burst" and r.ended_at is not None]
        return rows if len(rows) >= n else None

    wait_until(lambda: ended(2), 30, "the running one and the waiting one")
    c.app.send_task(one, ["burst", 3006, 0.05], queue=f"q.{c.namespace}")  # nobody waits now
    wait_until(lambda: started(c, 3006) and ended(3), 30, "a later instance")
    rows = [r for r in executions(c) if r.entry == "burst"]
    labels = sorted(r.run for r in rows)
    assert len(rows) == 3 and labels[0] == 3000 and labels[-1] == 3006, labels
    assert 3001 <= labels[1] <= 3005 and first.term < min(r.term for r in rows if r.run != 3000)
    check_one_at_a_time(rows)
    slot = c.backend.keys.get(c.namespace, waiting_key(key))
    assert slot is not None and not slot.held  # the waiting one's run freed it
