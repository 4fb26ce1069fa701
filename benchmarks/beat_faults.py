"""Each beat run once under faults: what a user counts when the leading beat fails mid-burst.

    .venv/bin/python benchmarks/beat_faults.py --fault kill            # one fault, ~1 min
    .venv/bin/python benchmarks/beat_faults.py --fault all --out F.md  # every fault, a table

Set-up, as a user runs it: ``--entries`` entries (default 1,000) all due at every
``--every``-second boundary (10; ``tests.support.beat.Boundary``), three standalone
``celery beat`` processes with the LeaderScheduler on PostgreSQL, RabbitMQ, and two real
``celery worker --election`` processes that record every execution in the database
(``tests.e2e.proj.tick``: entry, worker, task id, the database clock at its start). The
beats reach RabbitMQ and PostgreSQL through TCP proxies of their own (harness/proxy.py),
so the broker or the database can be cut for the beats alone; the workers and this
script reach both directly.

After a boundary to warm up, one has no fault (each of its runs must arrive once: the
set-up is sound). At the next boundary the fault:

* ``kill``: the leading beat SIGKILLed once ``--after`` runs (100) of the burst arrived;
* ``stop``: the leading beat SIGSTOPped at the same point, past its lease, then SIGCONT;
* ``broker``: the beats' broker link refused from 1 s before the boundary to 8 s after;
* ``db``: the beats' database link cut once ``--after`` runs arrived, for 3 s;
* ``none``: no fault at that boundary either.

Before the boundary after, the beats are stopped and the workers drained; then it counts
each entry's executions of the fault boundary's run (known by the run it follows, see
``Run.count``): an entry with none is a **lost** run, one with two or more a run **run
twice**; and how late the last one started. The runs are counted from the workers'
records, never from the beat's logs.
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.cluster import Cluster, wait_until
from harness.proxy import Proxy

FAULTS = ("none", "kill", "stop", "broker", "db")
PG = os.environ.get(
    "CELERY_ELECTION_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
AMQP = os.environ.get("CELERY_ELECTION_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def next_boundary(every: float, margin: float) -> float:
    """The first boundary at least ``margin`` seconds away."""
    return (math.floor((time.time() + margin) / every) + 1) * every


def sleep_until(t: float) -> None:
    while (left := t - time.time()) > 0:
        time.sleep(min(left, 0.5))


class Run:
    """One cluster: beats behind proxies, workers direct."""

    def __init__(self, tmp: Path, args: argparse.Namespace) -> None:
        self.args = args
        self.cluster = Cluster(tmp, AMQP, PG, f"db+{PG}", beat=True)
        self.broker_proxy, broker_via = Proxy.for_url(AMQP)
        self.db_proxy, db_via = Proxy.for_url(PG)
        burst = {"E2E_BURST": str(args.entries), "E2E_BURST_EVERY": str(args.every)}
        self.beat_env = {**burst, "E2E_BROKER": broker_via, "E2E_ELECTION": db_via,
                         "E2E_RECORD": PG}  # fmt: skip
        self.worker_env = {**burst, "E2E_BEAT": ""}
        self.ticks = self.cluster.ticks

    def start(self) -> None:
        c = self.cluster
        for i in range(self.args.workers):
            c.start(f"w{i}", "-c", "4", env=self.worker_env)
        for i in range(self.args.beats):
            c.start_beat(f"b{i}", env=self.beat_env)
        c.wait_beat_leader(60)

    def close(self) -> None:
        self.broker_proxy.resume()
        self.db_proxy.resume()
        self.cluster.close()

    def arrived(self, since: float) -> int:
        with self.cluster.engine.connect() as conn:
            q = sa.select(sa.func.count()).where(self.ticks.c.started_at >= int(since * 1e6))
            return int(conn.execute(q).scalar_one())

    def count(self, follows: tuple[float, float], due: float) -> dict[str, Any]:
        """Executions per entry of the runs due at ``due``: lost, run twice, lateness.

        A run is known by the run it follows (the beat's ``election_run`` header: the
        stored last run of its entry when it was claimed), so the runs due at ``due`` are
        those that follow a claim made in ``follows`` (the burst before, or 0: the first
        runs): a run that is late, even past the next boundary, is still counted as its
        own boundary's.
        """
        t = self.ticks
        lo, hi = int(follows[0] * 1e6), int(follows[1] * 1e6)
        with self.cluster.engine.connect() as conn:
            rows = list(conn.execute(
                sa.select(t.c.entry, t.c.started_at).where(t.c.run >= lo, t.c.run < hi)
            ))  # fmt: skip
        per = Counter(r.entry for r in rows)
        names = [f"burst-{i:05d}" for i in range(self.args.entries)]
        lost = sum(1 for n in names if per[n] == 0)
        twice = sum(c - 1 for c in per.values() if c > 1)
        late = max((r.started_at / 1e6 - due for r in rows), default=math.nan)
        return {"runs": len(rows), "lost": lost, "twice": twice, "late_s": late}

    def drain(self) -> None:
        """Stop the beats, then wait until the workers have run what was sent."""
        for name in list(self.cluster.workers):
            if name.startswith("b"):
                self.cluster.signal(name, signal.SIGTERM)
        seen, still = -1, 0
        for _ in range(120):
            now = self.arrived(0)
            still = still + 1 if now == seen else 0
            if still >= 6:
                return
            seen = now
            time.sleep(0.5)

    def fault(self, kind: str, boundary: float) -> str:
        """Apply ``kind`` at ``boundary``; what was done, for the table."""
        c, every = self.cluster, self.args.every
        if kind == "broker":
            sleep_until(boundary - 1)
            self.broker_proxy.cut(refuse_new=True)
            sleep_until(boundary + 8)
            self.broker_proxy.resume()
            return "broker refused to the beats from -1 s to +8 s"
        sleep_until(boundary)
        if kind == "none":
            return "no fault"
        leader = c.wait_beat_leader(5)
        wait_until(lambda: self.arrived(boundary) >= self.args.after or None, every, "the burst")
        if kind == "kill":
            c.signal(leader, signal.SIGKILL)
            return f"{leader} SIGKILLed after {self.args.after} arrived"
        if kind == "stop":
            c.signal(leader, signal.SIGSTOP)
            time.sleep(c.ttl + 2)
            c.signal(leader, signal.SIGCONT)
            return f"{leader} SIGSTOPped {c.ttl + 2:.0f} s after {self.args.after} arrived"
        self.db_proxy.cut()
        time.sleep(3)
        self.db_proxy.resume()
        return f"database cut for the beats 3 s after {self.args.after} arrived"

    def one(self, kind: str) -> dict[str, Any]:
        every = self.args.every
        warm = next_boundary(every, 1)  # the beats' first burst is at this one or before
        first = warm + every  # a quiet boundary: its runs follow the claims of warm's burst
        boundary = first + every  # the fault's
        what = self.fault(kind, boundary)
        sleep_until(boundary + every - 1)
        self.drain()
        before = self.count((warm, first), first)
        after = self.count((first, boundary), boundary)
        log(f"first boundary: {before}; {kind}: {what}: {after}")
        return {"fault": kind, "what": what, "quiet": before, **after}


def render(rows: list[dict[str, Any]], entries: int) -> str:
    out = [
        f"{entries} entries due at one boundary, 3 beats (LeaderScheduler, PostgreSQL, "
        "RabbitMQ), 2 workers recording each execution.",
        "",
        "| fault | what | first boundary (lost/twice) | runs | lost | run twice | last started |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        q = r["quiet"]
        out.append(
            f"| {r['fault']} | {r['what']} | {q['lost']}/{q['twice']} | {r['runs']} | "
            f"{r['lost']} | {r['twice']} | {r['late_s']:.1f} s |"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--fault", choices=(*FAULTS, "all"), default="kill")
    p.add_argument("--entries", type=int, default=1000)
    p.add_argument("--every", type=float, default=10.0)
    p.add_argument("--after", type=int, default=100)
    p.add_argument("--beats", type=int, default=3)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--out", type=Path)
    p.add_argument("--keep", type=Path, help="keep each run's logs in a folder under this one")
    args = p.parse_args(argv)
    kinds = [f for f in FAULTS if f != "none"] if args.fault == "all" else [args.fault]
    rows = []
    for kind in kinds:  # a fresh cluster per fault: a stopped beat leaves nothing behind
        with tempfile.TemporaryDirectory() as scratch:
            tmp = Path(tempfile.mkdtemp(dir=args.keep)) if args.keep else Path(scratch)
            run = Run(tmp, args)
            try:
                run.start()
                rows.append(run.one(kind))
            finally:
                run.close()
    table = render(rows, args.entries)
    print(table)
    if args.out:
        args.out.write_text(table + "\n")
    return 0 if all(r["lost"] == 0 and r["twice"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
