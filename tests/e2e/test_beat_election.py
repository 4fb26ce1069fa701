"""Leader-only beat with real processes: each tick is executed once, through kills and pauses.

Entries fire every second. Faults: SIGKILL of the leading beat twice, SIGSTOP of it past
its lease once (then SIGCONT: it must not send as a stale leader). Every execution records
(entry, nominal due time); the check is 0 duplicates per (entry, due), and no due time
missing except inside a failover window (where missed ticks collapse into one send).
"""

from __future__ import annotations

import collections
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ..conftest import failed, server_url
from .cluster import Cluster, wait_until

pytestmark = pytest.mark.slow
ENTRIES = ("every-second-a", "every-second-b")


@pytest.fixture
def cluster(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Cluster]:
    db = server_url("postgresql")
    c = Cluster(tmp_path, server_url("amqp"), db, f"db+{db}", beat=True)
    try:
        yield c
    finally:
        if failed(request):
            print(c.logs())
        c.close()


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
    """0 duplicates; every missing due time inside a failover window. Returns counts."""
    rows = c.rows(c.ticks)
    assert rows, "no tick was executed"
    window = c.ttl + 3.0
    missing_total = 0
    for entry in ENTRIES:
        dues = [r.due for r in rows if r.entry == entry]
        assert all(d is not None for d in dues), "a tick without its nominal due time"
        dup = [d for d, n in collections.Counter(dues).items() if n > 1]
        assert dup == [], f"{entry}: ticks executed twice: {dup}"
        expected = range(min(dues), max(dues) + 1, 1_000_000)
        missing = sorted(set(expected) - set(dues))
        for d in missing:
            at = d / 1e6
            assert any(f - 1.5 <= at <= f + window for f in faults), (
                f"{entry}: tick due {at:.3f} missing outside any failover window {faults}"
            )
        missing_total += len(missing)
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
    c.start("w", election=False)
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
