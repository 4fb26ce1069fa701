"""Leader-only beat with real processes: each run is executed once, through kills and pauses.

Entries fire every second. Faults: SIGKILL of the leading beat twice, SIGSTOP of it past
its lease once (then SIGCONT: it must not send as a stale leader). Every execution records
(entry, run key: the stored time of the run it follows); the check is 0 duplicates per
(entry, run), and no run missing (two consecutive keys more than a period apart) except
inside a failover window (where missed runs collapse into one catch-up, as in Celery).
The workers run with ``--election``: a run a killed beat sent and had not marked is sent
again by the next leader under its task id, and the worker's start record runs it once.
"""

from __future__ import annotations

import collections
import itertools
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from harness.cluster import Cluster, wait_until

pytestmark = [
    pytest.mark.slow,
    pytest.mark.parametrize("cluster", [{"beat": True}], indirect=True, ids=["beat"]),
]
ENTRIES = ("every-second-a", "every-second-b")


def wait_ticks(c: Cluster, more: int, timeout: float = 30) -> None:
    """Until ``more`` further executions per entry have been recorded."""
    start = collections.Counter(r.entry for r in c.rows(c.ticks))
    wait_until(
        lambda: all(
            collections.Counter(r.entry for r in c.rows(c.ticks))[e] >= start[e] + more
            for e in ENTRIES
        ),
        timeout,
        f"{more} more ticks of each entry",
    )


def check_history(c: Cluster, faults: list[float]) -> dict[str, int]:
    """0 duplicates; every missing run inside a failover window. Returns counts."""
    rows = c.rows(c.ticks)
    assert rows, "no tick was executed"
    window = c.ttl + 3.0
    missing_total = 0
    for entry in ENTRIES:
        runs = [r.run for r in rows if r.entry == entry]
        assert all(k is not None for k in runs), "a run without its key"
        dup = [k for k, n in collections.Counter(runs).items() if n > 1]
        assert dup == [], f"{entry}: runs executed twice: {dup}"
        keys = sorted(k for k in runs if k)  # 0 keys an entry's very first run
        for before, after in itertools.pairwise(keys):
            if after - before > 1_900_000:  # the run due a second after `before` is missing
                at = before / 1e6 + 1.0
                assert any(f - 1.5 <= at <= f + window for f in faults), (
                    f"{entry}: run due {at:.3f} missing outside any failover window {faults}"
                )
                missing_total += 1
    terms = {r.term for r in rows}
    assert None not in terms
    return {"executions": len(rows), "missing_in_windows": missing_total, "terms": len(terms)}


def run_faults(c: Cluster, leader: Callable[[str | None], str]) -> list[float]:
    """Kill, pause, kill the leader; returns the wall-clock time of each fault."""
    faults = []
    first = leader(None)
    wait_ticks(c, 3)
    faults.append(time.time())
    c.signal(first, signal.SIGKILL)
    second = leader(first)
    wait_ticks(c, 3)
    faults.append(time.time())
    c.signal(second, signal.SIGSTOP)  # paused past its lease...
    third = leader(second)
    wait_ticks(c, 3)
    c.signal(second, signal.SIGCONT)  # ...and back: it must not send as a stale leader
    wait_ticks(c, 3)
    faults.append(time.time())
    c.signal(third, signal.SIGKILL)
    leader(third)
    wait_ticks(c, 4)
    return faults


def test_three_standalone_beats(cluster: Cluster) -> None:
    c = cluster
    c.start("w")  # --election: a run sent again (its task id) runs once
    for b in ("b1", "b2", "b3"):
        c.start_beat(b)
    faults = run_faults(c, lambda other: c.wait_beat_leader(30, other_than=other))
    stats = check_history(c, faults)
    print(f"\nbeat history: {stats}")
    assert stats["terms"] >= 3


def test_three_workers_with_embedded_beat(cluster: Cluster) -> None:
    c = cluster
    c.start("w1", "-B")
    c.wait_candidates(1)
    c.start("w2", "-B")
    c.start("w3", "-B")
    c.wait_candidates(3)
    faults = run_faults(c, lambda other: c.wait_leader(30, other_than=other))
    stats = check_history(c, faults)
    print(f"\nbeat history: {stats}")
    assert stats["terms"] >= 3


def children(pid: int) -> set[int]:
    """The live child processes of ``pid`` (a beat's publishers)."""
    try:
        return {int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()}
    except FileNotFoundError:
        return set()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has ended


def test_three_standalone_beats_with_publishers(cluster: Cluster) -> None:
    """The same faults with every send going out through a publisher process
    (``election_beat_publishers = 1``): each run once, and a SIGKILLed beat's publisher
    ends with it (no orphan keeps a broker connection open)."""
    c = cluster
    c.start("w")  # --election: a run sent again (its task id) runs once
    for b in ("b1", "b2", "b3"):
        c.start_beat(b, env={"E2E_PUBLISHERS": "1"})
    publishers: dict[str, set[int]] = {}

    def leader(other: str | None) -> str:
        name = c.wait_beat_leader(30, other_than=other)
        pid = c.workers[name].popen.pid  # type: ignore[union-attr]
        publishers[name] = wait_until(lambda: children(pid) or None, 10, f"{name}'s publisher")
        return name

    faults = run_faults(c, leader)
    stats = check_history(c, faults)
    print(f"\nbeat history with publishers: {stats}")
    assert stats["terms"] >= 3
    killed = [name for name, proc in c.workers.items() if proc.returncode == -signal.SIGKILL]
    assert len(killed) == 2
    for name in killed:
        wait_until(
            lambda name=name: not any(alive(p) for p in publishers[name]) or None,  # type: ignore[misc]
            10,
            f"the publisher of the SIGKILLed {name} to end",
        )


def test_an_embedded_beat_forks_its_publisher_and_sends_each_run_once(cluster: Cluster) -> None:
    """``worker -B --election`` with ``election_beat_publishers = 1``: the beat (a child of
    the worker) forks its publisher, fenced by the worker's own shared record."""
    c = cluster
    c.start("w1", "-B", env={"E2E_PUBLISHERS": "1"})
    c.wait_leader(30)
    wait_ticks(c, 4)
    worker = c.workers["w1"].popen.pid  # type: ignore[union-attr]
    beats = [p for p in children(worker) if children(p)]  # the pool's children have none
    assert len(beats) == 1, "the embedded beat and its publisher"
    stats = check_history(c, [])
    assert stats["terms"] == 1
