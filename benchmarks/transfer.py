"""A hand-over to a named worker (``celery election transfer NODE``), timed, side by side.

    PYTHONPATH=. .venv/bin/python benchmarks/transfer.py              # 5 hand-overs per setup
    PYTHONPATH=. .venv/bin/python benchmarks/transfer.py --rounds 10

Three real ``celery worker --election -B`` (RabbitMQ; the test project tests/e2e/proj.py,
ttl 3 s) elect in PostgreSQL or MariaDB, with the liveness lock (the default) or without
(``election_liveness = False``: the lease alone, and LISTEN/NOTIFY on PostgreSQL). Each
round asks the leader, through the CLI, to hand its term to the next worker round the
ring. Measured from the workers' own histories (``election_history_file``, boot-time
clock, comparable across processes on one host):

* ``gap``: from the giver's trust end (its belief ends before its write) to the taker's
  trust start (after it renewed the term handed to it): how long nobody leads;
* ``cli``: what the CLI printed: from its request on the lease row until the row names the
  taker (the leader acts at its next renewal, within renew_interval = 1.2 s here).

The history checker (harness/checker.py) judges every run: overlap must be 0.
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import _root  # noqa: F401  (the repository root on sys.path)

from celery_election.core.transfer import node_of
from harness.checker import check, intervals, load
from harness.cluster import ROOT, Cluster, wait_until

WORKERS = ("w1", "w2", "w3")
#: the servers of DESIGN.md, unless CELERY_ELECTION_TEST_{PG,MYSQL,AMQP}_URL say otherwise
PG = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
MYSQL = "mysql+pymysql://root@127.0.0.1:3306/test"
AMQP = "amqp://guest:guest@127.0.0.1:5672//"


def _transfer(c: Cluster, worker: str) -> float:
    ids = [x.candidate_id for x in c.backend.candidates(c.namespace)]
    [node] = [node_of(i) for i in ids if i.startswith(f"{worker}@")]
    done = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "tests.e2e.proj", "election", "transfer", node],
        cwd=ROOT, env=c.env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(done.stdout + done.stderr)
    return float(re.findall(r"in ([\d.]+) s", done.stdout)[-1])


def run(
    db: str, url: str | None, amqp: str | None, liveness: bool, rounds: int
) -> dict[str, object]:
    """One setup: ``rounds`` hand-overs round the ring; the gaps and the checker's verdict."""
    if url is None or amqp is None:
        raise SystemExit(f"{db} and RabbitMQ are needed (CELERY_ELECTION_TEST_*_URL)")
    with tempfile.TemporaryDirectory() as tmp:
        c = Cluster(Path(tmp), amqp, url, f"db+{url}", ttl=3.0, beat=True)
        histories = [Path(tmp) / f"{w}.jsonl" for w in WORKERS]
        extra = {} if liveness else {"E2E_LIVENESS": "0"}
        cli: list[float] = []
        try:
            for w, h in zip(WORKERS, histories, strict=True):
                c.start(w, "-B", env={"E2E_HISTORY": str(h), **extra})
            c.wait_candidates(3)
            leader = c.wait_leader(30)
            for _ in range(rounds):
                taker = WORKERS[(WORKERS.index(leader) + 1) % len(WORKERS)]
                cli.append(_transfer(c, taker))
                leader = c.wait_leader(10, other_than=leader)
                assert leader == taker, (leader, taker)
                sent = len(c.rows(c.ticks))
                wait_until(lambda n=sent: len(c.rows(c.ticks)) >= n + 2, 30, "beat runs")
        finally:
            c.close()
        records = load(histories)
        report = check(records, tick_every={"every-second-a": 1.0, "every-second-b": 1.0})
        ivs = sorted(intervals(records), key=lambda i: i.start)
        gaps = [(b.start - a.end) * 1000 for a, b in itertools.pairwise(ivs) if b.term > a.term]
        return {
            "setup": f"{db}, {'liveness lock' if liveness else 'lease alone'}",
            "gaps": gaps[-rounds:],
            "cli": cli,
            "ok": report.ok and report.overlap_seconds == 0 and report.duplicate_ticks == 0,
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    urls = {
        "postgresql": os.environ.get("CELERY_ELECTION_TEST_PG_URL", PG),
        "mysql": os.environ.get("CELERY_ELECTION_TEST_MYSQL_URL", MYSQL),
        "amqp": os.environ.get("CELERY_ELECTION_TEST_AMQP_URL", AMQP),
    }
    rows = [
        run(db, urls[db], urls["amqp"], liveness, args.rounds)
        for db in ("postgresql", "mysql")
        for liveness in (True, False)
    ]
    print(f"\n{'setup':32} {'gap p50':>9} {'gap max':>9} {'cli p50':>9}  checker")
    for r in rows:
        gaps, cli = r["gaps"], r["cli"]
        assert isinstance(gaps, list) and isinstance(cli, list)
        print(
            f"{r['setup']:32} {statistics.median(gaps):7.1f}ms {max(gaps):7.1f}ms "
            f"{statistics.median(cli):8.3f}s  {'0 overlap, sent once' if r['ok'] else 'FAILED'}"
        )


if __name__ == "__main__":
    main()
