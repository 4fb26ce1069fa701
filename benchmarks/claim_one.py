"""One entry's claim as a batch of one, beside the single statement it replaced (issue 53).

    git worktree add /tmp/before 266cf96 && cd /tmp/before
    PYTHONPATH=$PWD .venv/bin/python /path/to/benchmarks/claim_one.py        # both, interleaved
    .venv/bin/python benchmarks/claim_one.py                                 # now: the batch alone

One entry claimed run after run under one lease (a tick's one due run), on SQLite,
PostgreSQL and MariaDB on loopback. At 266cf96 the store had both ways, so both run
interleaved in one process on the same backend: ``claim_run`` (one conditional statement
of its own) and ``claim_runs`` of one request (the batch's statements, which now serve a
single run too). Statements are counted on the backend's engine.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid
from typing import Any

import sqlalchemy as sa

from celery_election.backends import backend_from_url
from celery_election.backends.base import RunRequest
from celery_election.core.lease import Bid

URLS = {
    "sqlite": f"sqlite:///{tempfile.mkdtemp()}/claim-one.db",
    "postgresql": "postgresql+psycopg://postgres@127.0.0.1:5432/test",
    "mariadb": "mysql+pymysql://root@127.0.0.1:3306/test",
}


def measure(url: str, n: int) -> dict[str, tuple[float, float]]:
    """Per way: (median ms per claim, statements per claim)."""
    b = backend_from_url(url, table_prefix=f"co{uuid.uuid4().hex[:6]}_")
    b.install()
    try:
        token = uuid.uuid4().hex
        lease = b.elect(Bid("claim-one", token, "bench", 300.0)).lease
        assert lease is not None
        statements = [0]

        def count(*_: Any) -> None:
            statements[0] += 1

        sa.event.listen(b.engine, "before_cursor_execute", count)
        ways: dict[str, Any] = {
            "batch of one": lambda st, at: b.beat.claim_runs(
                "claim-one", token, lease.term, [RunRequest("batch", st, at)]
            )[0],
        }
        if hasattr(b.beat, "claim_run"):  # 266cf96
            ways["single"] = lambda st, at: b.beat.claim_run(
                "claim-one", token, lease.term, "single", st, at
            )
        state: dict[str, Any] = dict.fromkeys(ways)
        times: dict[str, list[float]] = {w: [] for w in ways}
        counted = dict.fromkeys(ways, 0)
        for i in range(1, n + 1):
            for way, claim in ways.items():
                before, started = statements[0], time.perf_counter()
                result = claim(state[way], i * 1000)
                times[way].append(time.perf_counter() - started)
                counted[way] += statements[0] - before
                assert result.won, (way, result)
                state[way] = result.state
        return {w: (statistics.median(times[w]) * 1e3, counted[w] / n) for w in ways}
    finally:
        b.uninstall()
        b.close()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("-n", type=int, default=300, help="claims per way and backend")
    args = p.parse_args()
    print(f"{args.n} claims each, interleaved; p50 ms per claim (statements per claim)")
    for name, url in URLS.items():
        got = measure(url, args.n)
        cells = "  ".join(f"{w}: {ms:.3f} ({s:.0f})" for w, (ms, s) in got.items())
        ratio = ""
        if "single" in got:
            ratio = f"  ratio {got['batch of one'][0] / got['single'][0]:.2f}"
        print(f"{name:11} {cells}{ratio}")


if __name__ == "__main__":
    main()
