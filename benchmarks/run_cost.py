"""What a beat run costs the database, per side, and what the run-once check costs a worker.

    .venv/bin/python benchmarks/run_cost.py                 # 200 entries every 2 s, 3 rounds
    .venv/bin/python benchmarks/run_cost.py --json out.json

Real processes on PostgreSQL and RabbitMQ: a ``celery beat`` with the LeaderScheduler
(``entries`` entries every ``every`` seconds) and a prefork ``celery worker -c 2``. The
election's tables are in a database of their own, so PostgreSQL's count of committed
transactions there (``pg_stat_database.xact_commit``, read once the processes exited and
their counts were flushed) is what they cost, every statement included: claims, confirms,
starts, ends, lease renewals, liveness, history, start-up and shut-down.

Each round, side by side:

* **together** (the load as users run it): the beat and the worker for ``seconds``, once
  with ``--election`` and once without: the runs executed per second in the second half
  (the worker keeps up, or not), what is left queued, and the commits per executed run;
* **per side**: the beat alone sends for ``seconds`` (commits per run sent: the beat's
  side), then the worker with ``--election`` drains what it sent (commits per run
  executed: the workers' side), and its **capacity**: runs per second from its first
  execution to its last, beside the same worker's without ``--election`` on a queue
  filled the same way. The task does nothing: the capacity's ratio is the check's whole
  cost (one start written and committed per run, its end riding on the next start).

Executions are counted from what the task wrote (a line per execution, in a file: no
database write), never from logs.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import _root  # puts the repository on sys.path
import sqlalchemy as sa
from _machine import machine_info

PG = os.environ.get(
    "CELERY_ELECTION_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
AMQP = os.environ.get("CELERY_ELECTION_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")
DATABASE = "celery_election_cost"

APP = """
import os, time
from celery import Celery
from celery_election import init_app

app = Celery("costapp", broker=os.environ["COST_BROKER"])
app.conf.update(
    election_url=os.environ["COST_DB"],
    election_namespace=os.environ["COST_NS"],
    election_auto_install=True,
    task_default_queue=os.environ["COST_QUEUE"],
    broker_connection_retry_on_startup=True,
    beat_schedule={
        f"e{i}": {"task": "costapp.run", "schedule": float(os.environ["COST_EVERY"])}
        for i in range(int(os.environ["COST_ENTRIES"]))
    },
)
init_app(app)
_out = os.environ["COST_RUNS"]


@app.task(name="costapp.run")
def run():
    fd = os.open(_out, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{time.time():.6f}\\n".encode())
    finally:
        os.close(fd)
"""


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class Cost:
    def __init__(self, tmp: Path, args: argparse.Namespace) -> None:
        self.tmp, self.args = tmp, args
        server = sa.engine.make_url(PG)
        self.admin = sa.create_engine(
            server, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool
        )
        self.url = server.set(database=DATABASE)
        with self.admin.connect() as conn:
            conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")
            conn.exec_driver_sql(f"CREATE DATABASE {DATABASE}")
        self.db = sa.create_engine(self.url, poolclass=sa.pool.NullPool)
        (tmp / "costapp.py").write_text(APP)
        self.runs = tmp / "runs.txt"
        self.ns = f"cost{uuid.uuid4().hex[:6]}"
        self.env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(tmp), str(_root.ROOT)]),
            "COST_BROKER": AMQP, "COST_DB": self.url.render_as_string(hide_password=False),
            "COST_NS": self.ns, "COST_QUEUE": f"cost-{self.ns}", "COST_RUNS": str(self.runs),
            "COST_EVERY": str(args.every), "COST_ENTRIES": str(args.entries),
        }  # fmt: skip

    def close(self) -> None:
        self.db.dispose()
        with self.admin.connect() as conn:
            conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")
        self.admin.dispose()

    def commits(self) -> int:
        """The database's committed transactions so far."""
        with self.admin.connect() as conn:
            conn.exec_driver_sql("SELECT pg_stat_clear_snapshot()")
            return int(conn.exec_driver_sql(
                f"SELECT xact_commit FROM pg_stat_database WHERE datname = '{DATABASE}'"
            ).scalar_one())  # fmt: skip

    def spawn(self, name: str, *argv: str) -> subprocess.Popen[bytes]:
        out = open(self.tmp / f"{name}.log", "ab")  # noqa: SIM115  (closed with the process)
        return subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "costapp", *argv],
            cwd=self.tmp, env=self.env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip

    def beat(self) -> subprocess.Popen[bytes]:
        return self.spawn("beat", "beat", "-S", "celery_election.beat:LeaderScheduler",
                          "-s", str(self.tmp / "schedule"), "--loglevel", "WARNING")  # fmt: skip

    def worker(self, election: bool) -> subprocess.Popen[bytes]:
        flag = "--election" if election else "--no-election"
        return self.spawn("worker", "worker", flag, "-P", "prefork", "-c", "2",
                          "--loglevel", "WARNING", "-n", f"w{uuid.uuid4().hex[:6]}@%h")  # fmt: skip

    def stop(self, proc: subprocess.Popen[bytes]) -> None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        time.sleep(1.5)  # the server counts a backend's commits once it exits

    def executed(self) -> list[float]:
        return [float(x) for x in self.runs.read_text().split()] if self.runs.exists() else []

    def sent_rows(self) -> int:
        if not sa.inspect(self.db).has_table("celery_election_task_start"):
            return 0
        with self.db.connect() as conn:
            return int(conn.exec_driver_sql(
                "SELECT count(*) FROM celery_election_task_start WHERE kind = 'run'"
            ).scalar_one())  # fmt: skip

    def together(self, election: bool) -> dict[str, float]:
        """The beat and a worker for ``seconds``: the worker's rate in the second half,
        the runs left queued at the end, commits per executed run."""
        self.runs.unlink(missing_ok=True)
        rows, before = self.sent_rows(), self.commits()
        worker = self.worker(election)
        time.sleep(3)  # the worker is up before the first send
        beat = self.beat()
        started = time.time()
        time.sleep(self.args.seconds)
        half, ended = started + self.args.seconds / 2, time.time()
        done = self.executed()
        self.stop(beat)
        sent = self.sent_rows() - rows
        time.sleep(self.args.every + 2)  # the last sends executed, their ends written
        self.stop(worker)
        executed = len(self.executed())
        return {
            "rate": sum(1 for t in done if half <= t < ended) / (ended - half),
            "left": max(0, sent - len(done)),
            "commits_per_run": (self.commits() - before) / max(1, executed),
        }

    def fill(self) -> tuple[int, int]:
        """The beat alone for ``seconds``: (runs it sent, commits)."""
        rows, before = self.sent_rows(), self.commits()
        beat = self.beat()
        time.sleep(self.args.seconds)
        self.stop(beat)
        return self.sent_rows() - rows, self.commits() - before

    def drain(self, runs: int, election: bool) -> tuple[float, int]:
        """A prefork worker (-c 2) executes ``runs`` queued runs: (runs per second, commits)."""
        self.runs.unlink(missing_ok=True)
        before = self.commits()
        worker = self.worker(election)
        deadline = time.monotonic() + 600
        while len(self.executed()) < runs and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(2.0)  # an end waiting for a start is written alone after a second
        self.stop(worker)
        spent = self.commits() - before
        done = sorted(self.executed())
        if len(done) != runs:
            raise SystemExit(f"{len(done)} of {runs} runs executed (--election: {election})")
        return (len(done) - 1) / (done[-1] - done[0]), spent


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--entries", type=int, default=200)
    p.add_argument("--every", type=float, default=2.0)
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        cost = Cost(Path(scratch), args)
        try:
            for r in range(args.rounds):
                on, off = cost.together(True), cost.together(False)
                sent, beat = cost.fill()
                capacity_on, worker = cost.drain(sent, election=True)
                sent_off, _ = cost.fill()
                capacity_off, plain = cost.drain(sent_off, election=False)
                row = {
                    "round": r + 1, "rate_election": on["rate"], "rate_plain": off["rate"],
                    "ratio": on["rate"] / off["rate"], "left_election": on["left"],
                    "left_plain": off["left"], "together_commits_per_run": on["commits_per_run"],
                    "runs": sent, "beat_commits_per_run": beat / sent,
                    "worker_commits_per_run": worker / sent,
                    "sides_commits_per_run": (beat + worker) / sent,
                    "plain_worker_commits_per_run": plain / sent_off,
                    "capacity_election": capacity_on, "capacity_plain": capacity_off,
                    "capacity_ratio": capacity_on / capacity_off,
                }  # fmt: skip
                log(json.dumps(row))
                rows.append(row)
        finally:
            cost.close()
    print(f"{args.entries} entries every {args.every:g} s ({args.entries / args.every:g} runs/s), "
          f"{args.seconds:g} s a phase; a prefork worker (-c 2) running a task that does "
          "nothing; PostgreSQL and RabbitMQ on loopback\n")  # fmt: skip
    print("Together, the beat and the worker at once:\n")
    print("| round | runs/s with --election | without | ratio | left queued (with/without) "
          "| commits per executed run, beat and worker |")  # fmt: skip
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    for x in rows:
        print(f"| {x['round']} | {x['rate_election']:.1f} | {x['rate_plain']:.1f} | "
              f"{x['ratio']:.2f} | {x['left_election']}/{x['left_plain']} | "
              f"{x['together_commits_per_run']:.3f} |")  # fmt: skip
    print("\nPer side; the worker's capacity on a queue of one beat phase's runs:\n")
    print("| round | runs | beat commits/run | worker commits/run | both | plain worker "
          "commits/run | capacity with --election | without | ratio |")  # fmt: skip
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for x in rows:
        print(f"| {x['round']} | {x['runs']} | {x['beat_commits_per_run']:.3f} | "
              f"{x['worker_commits_per_run']:.3f} | {x['sides_commits_per_run']:.3f} | "
              f"{x['plain_worker_commits_per_run']:.3f} | {x['capacity_election']:.0f}/s | "
              f"{x['capacity_plain']:.0f}/s | {x['capacity_ratio']:.2f} |")  # fmt: skip

    def median(key: str) -> float:
        return statistics.median(float(x[key]) for x in rows)

    total, ratio = median("together_commits_per_run"), median("ratio")
    print(
        f"\nmedians: {total:.3f} commits per executed run (beat and worker together), "
        f"{median('sides_commits_per_run'):.3f} by side; under the load --election runs at "
        f"{ratio:.2f} x the plain worker's rate; its capacity at {median('capacity_ratio'):.2f} x"
    )
    if args.json:
        args.json.write_text(json.dumps({"machine": machine_info(), "rows": rows}, indent=2))
    return 0 if total <= 2.0 and ratio >= 0.8 else 1


if __name__ == "__main__":
    sys.exit(main())
