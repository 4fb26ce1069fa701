"""A rolling upgrade with release preference: leadership never goes back to an older release.

Three ``celery worker --election -B`` registering release 0.1.0 (``election_release``;
this code, so that the older ones know the rule: the real 0.1.0 does not, see
docs/deployment.md) are replaced one by one by workers of this release: first a
follower, then the leader (the first new leader is elected then), which is then
SIGKILLed, then the last old one. From the first new leader on, every term is a new
worker's (the old one left holds back while a new one lives); the history checker finds
no overlap, and the beat's every-second runs are sent once. On PostgreSQL and MariaDB
(RabbitMQ broker) with their liveness locks, and on SQLite (its file lock).
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from harness.checker import check, load
from harness.cluster import Cluster, wait_until

pytestmark = [
    pytest.mark.slow,
    pytest.mark.tier2,
    pytest.mark.timeout(240),
    pytest.mark.parametrize(
        "cluster",
        [
            pytest.param({"kind": k, "beat": True}, id=k)
            for k in ("rabbitmq+postgresql", "rabbitmq+mariadb", "sqla+sqlite")
        ],
        indirect=True,
    ),
]

OLD = {"E2E_RELEASE": "0.1.0"}


def test_a_rolling_upgrade_never_returns_leadership_to_an_older_release(
    cluster: Cluster, tmp_path: Path
) -> None:
    c = cluster
    histories: list[Path] = []

    def start(name: str, old: bool) -> None:
        histories.append(tmp_path / f"{name}.jsonl")
        c.start(name, "-B", env={"E2E_HISTORY": str(histories[-1]), **(OLD if old else {})})

    def ticks(more: int) -> None:
        sent = len(c.rows(c.ticks))
        wait_until(lambda: len(c.rows(c.ticks)) >= sent + more, 60, f"{more} beat runs")

    def replace(old: str, new: str, sig: int = signal.SIGTERM) -> None:
        c.signal(old, sig)
        c.wait_exit(old, timeout=30)
        start(new, old=False)

    def new_ones(n: int) -> None:
        def registered() -> bool:
            live = c.backend.candidates(c.namespace)
            return sum(x.release == "0.2.0" for x in live) >= n

        wait_until(registered, 30, f"{n} workers of the new release registered")

    start("o1", old=True)
    c.wait_candidates(1)  # the sqla transport creates its queue rows without a lock
    start("o2", old=True)
    start("o3", old=True)
    c.wait_candidates(3)
    leader = c.wait_leader(30)
    ticks(2)
    follower = next(n for n in ("o1", "o2", "o3") if n != leader)
    replace(follower, "n1")  # a follower first: the old leader goes on leading
    new_ones(1)
    # n1 settles before the leader goes (its lock wait set up): a deploy's pace. A newer
    # one that is not waiting on the lock yet learns of a vacancy only at its next look,
    # and the older one takes it after ttl (docs/deployment.md: rolling upgrades).
    wait_until(lambda: c.hot_standby("n1"), 30, "n1 waiting on the liveness lock")
    replace(leader, "n2")  # the old leader goes: the vacancy is the new one's
    first_new = c.wait_leader(30, other_than=leader)
    assert first_new == "n1", f"{first_new} took the vacancy while n1 (newer) lived"
    new_ones(2)
    wait_until(lambda: c.hot_standby("n2"), 30, "n2 waiting on the liveness lock")
    ticks(2)
    c.signal("n1", signal.SIGKILL)  # the first new leader dies without a word
    c.wait_exit("n1", timeout=30)
    assert c.wait_leader(30, other_than="n1") == "n2"
    ticks(2)
    last = next(n for n in ("o1", "o2", "o3") if n not in (leader, follower))
    replace(last, "n3")
    ticks(3)
    owners = c.term_owners()
    first_term = min(t for t, who in owners.items() if who == {"n1"})
    later = {t: who for t, who in owners.items() if t >= first_term}
    assert all(who <= {"n1", "n2", "n3"} for who in later.values()), later
    written = [h for h in histories if h.exists()]  # a process that never led may write none
    report = check(load(written), tick_every={"every-second-a": 1.0, "every-second-b": 1.0})
    print(f"\nrolling upgrade with release preference ({c.kind}): "  # type: ignore[attr-defined]
          f"terms {sorted(owners.items())}, {report.summary()}")  # fmt: skip
    assert report.ok, report.violations
    assert report.overlap_seconds == 0.0 and report.duplicate_ticks == 0
