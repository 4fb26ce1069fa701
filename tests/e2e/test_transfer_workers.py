"""``celery election transfer NODE``: real workers hand leadership to a named worker.

Three ``celery worker --election -B`` on RabbitMQ, electing in PostgreSQL or in MariaDB,
each writing its history (``election_history_file``). The leader is asked, through the
CLI, to hand its term to a named follower: the next term is that worker's (nobody else
won in between), harness/checker.py finds no overlap in the histories, and the beat's
every-second runs go on across the hand-over, each sent once. The hand-over's gap (the
giver's trust end to the taker's trust start, from the histories) is printed, not
asserted: benchmarks/transfer.py measures it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from celery_election.core.transfer import node_of
from harness.checker import check, intervals, load
from harness.cluster import ROOT, Cluster, wait_until

from ..conftest import server_url

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

TICKS = {"every-second-a": 1.0, "every-second-b": 1.0}


def transfer_cli(c: Cluster, node: str) -> str:
    """``celery -A tests.e2e.proj election transfer NODE``, as an operator types it."""
    done = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "tests.e2e.proj", "election", "transfer", node],
        cwd=ROOT, env=c.env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.strip()


def node_named(c: Cluster, worker: str) -> str:
    """The node part of worker ``worker``'s candidate id (``w2@host.ns``)."""
    ids = [x.candidate_id for x in c.backend.candidates(c.namespace)]
    [node] = [node_of(i) for i in ids if i.startswith(f"{worker}@")]
    return node


@pytest.mark.parametrize("db", ["postgresql", "mysql"])
def test_a_transfer_to_a_named_worker_with_no_overlap_and_each_beat_run_once(
    tmp_path: Path, db: str
) -> None:
    url = server_url(db)
    c = Cluster(tmp_path, server_url("amqp"), url, f"db+{url}", ttl=3.0, beat=True)
    histories = [tmp_path / f"{w}.jsonl" for w in ("w1", "w2", "w3")]
    try:
        c.start("w1", "-B", env={"E2E_HISTORY": str(histories[0])})
        c.wait_candidates(1)
        leader = c.wait_leader(30)
        for name, history in zip(("w2", "w3"), histories[1:], strict=True):
            c.start(name, "-B", env={"E2E_HISTORY": str(history)})
        c.wait_candidates(3)
        sent = len(c.rows(c.ticks))
        wait_until(lambda: len(c.rows(c.ticks)) >= sent + 4, 30, "beat runs before")
        before = c.lease()
        assert before is not None and c.leader() == leader
        taker = "w2" if leader != "w2" else "w3"
        print(f"\n{db}: {transfer_cli(c, node_named(c, taker))}")
        assert c.wait_leader(10) == taker
        sent = len(c.rows(c.ticks))
        wait_until(lambda: len(c.rows(c.ticks)) >= sent + 4, 30, "beat runs after")
        after = c.lease()
        assert after is not None and after.term > before.term
        owners = c.term_owners()
        assert owners[after.term] == {taker}
        # nobody won in between: no term between the giver's and the taker's
        assert [t for t in owners if before.term < t < after.term] == []
    except BaseException:
        print(c.logs())
        raise
    finally:
        c.close()
    records = load(histories)
    report = check(records, tick_every=TICKS)
    print(f"{db}: {report.summary()}")
    assert report.ok, report.violations
    assert report.overlap_seconds == 0.0 and report.duplicate_ticks == 0
    ivs = sorted(intervals(records), key=lambda i: i.start)
    given = next(i for i in ivs if i.term == before.term)
    taken = next(i for i in ivs if i.term == after.term)
    gap = (taken.start - given.end) * 1000
    print(f"{db}: hand-over gap {gap:.1f} ms (the giver's trust end to the taker's start)")
    assert taken.start >= given.end
