"""Each beat run once under faults: a real cluster, a fault at a boundary, the runs counted.

``Run`` starts ``entries`` entries all due at every ``every``-second boundary
(``tests.support.beat.Boundary``), standalone ``celery beat`` processes with the
LeaderScheduler on PostgreSQL and RabbitMQ, and real ``celery worker --election``
processes that record every execution in the database (``tests.e2e.proj.tick``: entry,
run key, worker, task id, the database clock at its start). The beats reach RabbitMQ and
PostgreSQL through TCP proxies of their own (``harness.proxy``), so the broker or the
database can be cut for the beats alone. The faults (:data:`FAULTS`), each at a boundary:

* ``kill``: the leading beat SIGKILLed once ``after`` runs of the burst arrived;
* ``stop``: the leading beat SIGSTOPped at the same point, past its lease, then SIGCONT;
* ``broker``: the beats' broker link refused from 1 s before the boundary to 8 s after;
* ``db``: the beats' database link cut once ``after`` runs arrived, for 3 s;
* ``worker``: a worker SIGKILLed (with its pool) once ``after`` runs arrived, and started
  again: the runs it had taken come back (``acks_late``), and each runs again only if it
  never finished (run once, docs/workers.md);
* ``redeliver``: once the boundary's runs all finished, each is delivered again (its
  message published again: same task id, same run headers): each copy is skipped;
* ``none``: no fault.

Each run takes ``seconds`` (0.05 s) and records its start and its end. Then the beats are
stopped and the workers drained, and each entry's finished executions of a boundary's run
are counted (known by the run key each carries, :meth:`Run.count`): an entry with none is
a **lost** run, one with two or more a run **run twice**; a start with no end (its worker
was killed) is counted apart, as **interrupted**. Counted from the workers' records, never
from the beat's logs. Used by
``benchmarks/beat_faults.py`` and ``tests/e2e/test_beat_faults.py``.
"""

from __future__ import annotations

import math
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from harness.cluster import Cluster, wait_until
from harness.proxy import Proxy

__all__ = ["FAULTS", "Run", "Settings"]

FAULTS = ("none", "kill", "stop", "broker", "db", "worker", "redeliver")
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


@dataclass(frozen=True)
class Settings:
    """A set-up: ``entries`` due at every ``every`` s; a kill or stop after ``after``."""

    entries: int = 1000
    every: float = 10.0
    after: int = 100
    beats: int = 3
    workers: int = 2
    seconds: float = 0.05


class Run:
    """One cluster: beats behind proxies, workers direct."""

    def __init__(self, tmp: Path, args: Settings) -> None:
        self.args = args
        self.cluster = Cluster(tmp, AMQP, PG, f"db+{PG}", beat=True)
        self.broker_proxy, broker_via = Proxy.for_url(AMQP)
        self.db_proxy, db_via = Proxy.for_url(PG)
        burst = {"E2E_BURST": str(args.entries), "E2E_BURST_EVERY": str(args.every),
                 "E2E_BURST_SECONDS": str(args.seconds)}  # fmt: skip
        self.beat_env = {**burst, "E2E_BROKER": broker_via, "E2E_ELECTION": db_via,
                         "E2E_RECORD": PG}  # fmt: skip
        self.worker_env = {**burst, "E2E_BEAT": ""}
        #: the worker the ``worker`` fault killed, and when (epoch s)
        self.killed: tuple[str, float] | None = None
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
        """Executions started since ``since`` (epoch s)."""
        with self.cluster.engine.connect() as conn:
            q = sa.select(sa.func.count()).where(self.ticks.c.started_at >= int(since * 1e6))
            return int(conn.execute(q).scalar_one())

    def of_boundary(self, boundary: float) -> int:
        """Executions of the runs due at ``boundary`` so far (see :meth:`count`)."""
        t, every = self.ticks, self.args.every
        lo, hi = int((boundary - every) * 1e6), int(boundary * 1e6)
        with self.cluster.engine.connect() as conn:
            q = sa.select(sa.func.count()).where(t.c.run >= lo, t.c.run < hi)
            return int(conn.execute(q).scalar_one())

    def count(self, follows: tuple[float, float], due: float) -> dict[str, Any]:
        """Finished executions per entry of the runs due at ``due``: lost, run twice,
        interrupted (started, never finished), lateness.

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
                sa.select(t.c.entry, t.c.started_at, t.c.ended_at, t.c.worker)
                .where(t.c.run >= lo, t.c.run < hi)
            ))  # fmt: skip
        ends = bool(self.args.seconds)  # a run of 0 s records no end: its start is all
        done = [r for r in rows if r.ended_at is not None or not ends]
        by_entry: dict[str, list[Any]] = {}
        for r in sorted(done, key=lambda r: r.started_at):
            by_entry.setdefault(r.entry, []).append(r)
        names = [f"burst-{i:05d}" for i in range(self.args.entries)]
        lost = sum(1 for n in names if n not in by_entry)
        again = sum(len(runs) - 1 for runs in by_entry.values() if self._died_after(runs[0]))
        twice = sum(len(runs) - 1 for runs in by_entry.values()) - again
        late = max((r.started_at / 1e6 - due for r in rows), default=math.nan)
        return {"runs": len(done), "lost": lost, "twice": twice, "again_after_kill": again,
                "interrupted": len(rows) - len(done), "late_s": late}  # fmt: skip

    def _died_after(self, first: Any) -> bool:
        """Whether ``first`` (a finished execution) was the killed worker's, ended within a
        second before the kill: its end was in the tick's row, not yet in its start record,
        so under acks_late its run came back and ran again (docs/workers.md), as a task
        whose worker dies mid-way does."""
        if self.killed is None:
            return False
        victim, at = self.killed
        ended = first.ended_at / 1e6
        return bool(first.worker.startswith(f"{victim}@") and at - 1.0 <= ended <= at)

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
        # mid-burst: once the first runs of this boundary ran (a backlog of the boundary
        # before may still be running)
        wait_until(
            lambda: self.of_boundary(boundary) >= self.args.after or None, every, "the burst"
        )
        if kind == "kill":
            c.signal(leader, signal.SIGKILL)
            return f"{leader} SIGKILLed after {self.args.after} arrived"
        if kind == "worker":
            victim = "w0"
            self.killed = (victim, time.time())
            c.workers[victim].signal_group(signal.SIGKILL)  # the worker and its pool
            c.workers[victim].wait(10)
            c.start(victim, "-c", "4", env=self.worker_env)
            return f"worker {victim} SIGKILLed after {self.args.after} arrived, started again"
        if kind == "redeliver":
            return self.redeliver(boundary)
        if kind == "stop":
            c.signal(leader, signal.SIGSTOP)
            time.sleep(c.ttl + 2)
            c.signal(leader, signal.SIGCONT)
            return f"{leader} SIGSTOPped {c.ttl + 2:.0f} s after {self.args.after} arrived"
        self.db_proxy.cut()
        time.sleep(3)
        self.db_proxy.resume()
        return f"database cut for the beats 3 s after {self.args.after} arrived"

    def redeliver(self, boundary: float) -> str:
        """Once every run of ``boundary`` finished, deliver each again (same task id and
        run headers, as a broker's redelivery or the beat's re-send brings it)."""
        t, every, n = self.ticks, self.args.every, self.args.entries
        lo, hi = int((boundary - every) * 1e6), int(boundary * 1e6)
        mine = sa.and_(t.c.run >= lo, t.c.run < hi)

        def finished() -> list[Any] | None:
            with self.cluster.engine.connect() as conn:
                rows = list(conn.execute(
                    sa.select(t.c.entry, t.c.task_id, t.c.run, t.c.term)
                    .where(mine, t.c.ended_at.is_not(None))
                ))  # fmt: skip
            return rows if len(rows) >= n else None

        rows = wait_until(finished, every, "the boundary's runs to finish")
        c = self.cluster
        before = self.skips()
        # the headers a redelivery brings: the run's key, its term, where its row is
        rows_ns = f"{c.namespace}-beat"
        for r in rows:
            headers = {"election_run": r.run, "election_term": r.term, "election_rows": rows_ns}
            c.app.send_task("tests.e2e.proj.tick", [r.entry, self.args.seconds],
                            task_id=r.task_id, queue=f"q.{c.namespace}",
                            headers=headers)  # fmt: skip
        wait_until(lambda: self.skips() >= before + len(rows), 3 * every, "every copy skipped")
        return f"{len(rows)} finished runs delivered again (same task ids and run headers)"

    def skips(self) -> int:
        """Deliveries the workers skipped as runs delivered before (their logs say so)."""
        return sum(
            p.read_text(errors="replace").count("skipped: this run was delivered before")
            for p in self.cluster.tmp.glob("w*.log")
        )

    def one(self, kind: str) -> dict[str, Any]:
        """A warm-up boundary, a quiet one, then ``kind`` at the next: its counts."""
        (quiet, row) = self.several([kind])
        return {**row, "quiet": quiet}

    def several(self, kinds: list[str]) -> list[dict[str, Any]]:
        """After a warm-up boundary, a quiet one (``none``), then each fault at the next
        boundary in turn; each boundary's counts (see :meth:`count`)."""
        every = self.args.every
        warm = next_boundary(every, 1)  # the beats' first burst is at this one or before
        kinds = ["none", *kinds]
        done = []
        for i, kind in enumerate(kinds):
            boundary = warm + every * (i + 1)
            done.append((kind, boundary, self.fault(kind, boundary)))
        sleep_until(warm + every * (len(kinds) + 1) - 1)
        self.drain()
        rows = []
        for kind, boundary, what in done:
            counts = self.count((boundary - every, boundary), boundary)
            log(f"{kind}: {what}: {counts}")
            rows.append({"fault": kind, "what": what, **counts})
        return rows
