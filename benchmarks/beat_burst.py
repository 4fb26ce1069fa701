"""A burst: N crontab entries all due at one minute boundary, stock beat against the leader.

    .venv/bin/python benchmarks/beat_burst.py                  # N = 1,000 and 10,000
    .venv/bin/python benchmarks/beat_burst.py --entries 1000   # one size

Issue 37: stock ``Scheduler.tick`` sends one entry per call and compares the whole schedule
first (O(N^2) for a burst); the leader added a claim round trip per send. For each N, one
real ``celery beat`` process per scheduler, one after the other (they would share the 2
cores if run at once): stock ``PersistentScheduler`` and ``LeaderScheduler`` on PostgreSQL,
broker RabbitMQ, a queue of the run's own (deleted afterwards), N entries
``crontab(minute="*")`` for a task name no worker has.

Each beat is started, waited for (stock: its process is up; leader: it has recorded all N
entries in the shared state at its promotion), and the next minute boundary at least 3 s
later is the one measured. The beat process itself stamps every publish
(``after_task_publish``: wall time and its count of SQL statements so far) into a file.

* ``last send``: seconds from the boundary to the last of the N sends (or, if not all N
  went out within ``--window`` seconds, how many did).
* ``sends/s``: N / last send.
* ``CPU s``: the beat process's user + system CPU, and its publishers', from just before
  the boundary to the last send (/proc/PID/stat).
* ``stmt/send``: SQL statements the beat process executed (a SQLAlchemy
  ``before_cursor_execute`` listener on every Engine in that process; BEGIN / COMMIT are
  not statements), from half a second before the boundary (the process writes its count
  every 0.1 s) to the last send, per send. It includes the elector's renewals, the
  schedule's looks and the history writer in that span.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import secrets
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import _root
import sqlalchemy as sa
from _machine import machine_info
from beat import PG_DEFAULT, db_version, log
from celery import Celery

HERE = Path(__file__).resolve().parent
DEFAULT_JSON = HERE / "results" / "beat_burst.json"
AMQP_DEFAULT = "amqp://guest:guest@127.0.0.1:5672//"
CLK_TCK = os.sysconf("SC_CLK_TCK")

APP = textwrap.dedent(
    '''
    """The benchmark's Celery app: N crontab entries; every publish stamped to a file."""
    import os
    import threading
    import time
    from pathlib import Path

    import sqlalchemy as sa
    from celery import Celery
    from celery.schedules import crontab
    from celery.signals import after_task_publish

    E = os.environ
    app = Celery("burst", broker=E["BURST_BROKER"])
    app.conf.update(
        beat_schedule={
            f"e{i:05d}": {"task": "burst.noop", "schedule": crontab(minute="*")}
            for i in range(int(E["BURST_N"]))
        },
        task_default_queue=E["BURST_QUEUE"],
        broker_connection_retry_on_startup=True,
    )
    if E.get("BURST_URL"):
        app.conf.update(
            election_url=E["BURST_URL"],
            election_table_prefix=E["BURST_PREFIX"],
            election_namespace=E["BURST_NS"],
            election_beat_publishers=int(E.get("BURST_PUBLISHERS") or 0),
        )

    STATEMENTS = [0]
    OUT = os.open(E["BURST_OUT"], os.O_WRONLY | os.O_CREAT | os.O_APPEND)


    @sa.event.listens_for(sa.engine.Engine, "before_cursor_execute")
    def _count(conn, cursor, statement, *args):
        if statement.split(None, 1)[0].upper() not in ("BEGIN", "COMMIT", "ROLLBACK"):
            STATEMENTS[0] += 1


    @after_task_publish.connect
    def _stamp(**kwargs):
        os.write(OUT, f"{time.time():.6f} {STATEMENTS[0]}\\n".encode())


    def _counts():  # the count before the burst (the promotion's claims are not in it)
        while True:
            Path(E["BURST_OUT"] + ".count").write_text(str(STATEMENTS[0]))
            time.sleep(0.1)


    threading.Thread(target=_counts, daemon=True).start()

    if E.get("BURST_URL"):  # the leader: when the broker confirmed each send (the run ledger)
        from celery_election.beat.sender import Sender

        CONFIRMED = os.open(E["BURST_OUT"] + ".confirmed", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        _sent = Sender.sent

        def _confirmed(self, *args, **kwargs):
            _sent(self, *args, **kwargs)
            os.write(CONFIRMED, f"{time.time():.6f} 0\\n".encode())

        Sender.sent = _confirmed
    '''
)


def cpu_seconds(pid: int) -> float:
    """User + system CPU of ``pid`` and of its children (a leader's publishers)."""
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    total = 0.0
    for p in [pid, *map(int, children)]:
        with contextlib.suppress(FileNotFoundError):
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime
    return total


def statements(count: Path) -> int:
    """The beat's count of statements (its thread rewrites the file every 0.1 s: a read
    between the truncation and the write finds it empty, and is read again)."""
    for _ in range(50):
        text = count.read_text() if count.exists() else ""
        if text:
            return int(text)
        time.sleep(0.01)
    return 0


def publishers_of(kind: str) -> int:
    """``leader-p2``: LeaderScheduler with election_beat_publishers = 2."""
    return int(kind.split("-p", 1)[1]) if kind.startswith("leader-p") else 0


def stamps(path: Path) -> list[tuple[float, int]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(ValueError):
            at, count = line.split()
            out.append((float(at), int(count)))
    return out


def confirmed_since(out: Path, boundary: float) -> list[float]:
    """When the leader learnt each send was confirmed (its ``Sender.sent``), in order."""
    return sorted(at for at, _ in stamps(Path(f"{out}.confirmed")) if at >= boundary)


def beat_rows(url: str, prefix: str) -> int:
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            return int(conn.exec_driver_sql(f"SELECT count(*) FROM {prefix}beat_run").scalar() or 0)
    except sa.exc.DBAPIError:
        return 0
    finally:
        engine.dispose()


def run_one(kind: str, n: int, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """One beat process, one measured boundary."""
    tag = secrets.token_hex(3)
    queue, out = f"burst-{kind}-{tag}", tmp / f"{kind}-{n}-{tag}.stamps"
    prefix, ns = f"bb{tag}_", f"burst{tag}"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp), str(_root.ROOT)]),
        "BURST_BROKER": args.broker,
        "BURST_N": str(n),
        "BURST_QUEUE": queue,
        "BURST_OUT": str(out),
    }
    scheduler = "celery.beat:PersistentScheduler"
    leader = kind.startswith("leader")
    if leader:
        env.update(BURST_URL=args.pg, BURST_PREFIX=prefix, BURST_NS=ns)
        env.update(BURST_PUBLISHERS=str(publishers_of(kind)))
        scheduler = "celery_election.beat:LeaderScheduler"
    argv = [sys.executable, "-m", "celery", "-A", "burstapp", "beat", "-S", scheduler,
            "-s", str(tmp / f"schedule-{tag}"), "--loglevel", "WARNING"]  # fmt: skip
    logfile = open(tmp / f"{kind}-{n}-{tag}.log", "w")  # noqa: SIM115
    started = time.time()
    proc = subprocess.Popen(argv, cwd=tmp, env=env, stdout=logfile, stderr=subprocess.STDOUT)
    try:
        deadline = started + args.ready_timeout
        while time.time() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"{kind} beat exited: {(tmp / logfile.name).read_text()[-2000:]}"
                )
            if kind == "stock" and time.time() - started > 3:
                break
            if leader and beat_rows(args.pg, prefix) >= n:
                break
            time.sleep(0.5)
        else:
            raise RuntimeError(f"{kind} beat not ready in {args.ready_timeout} s")
        ready = time.time() - started
        boundary = (int(time.time() + 3) // 60 + 1) * 60
        log(f"[{kind} N={n}] ready after {ready:.1f} s; measuring the boundary at "
            f"{datetime.datetime.fromtimestamp(boundary):%H:%M:%S}")  # fmt: skip
        while time.time() < boundary - 0.5:
            time.sleep(min(0.5, boundary - 0.5 - time.time()))
        cpu0 = cpu_seconds(proc.pid)
        count = Path(f"{out}.count")
        stmt0 = statements(count)
        end = boundary + args.window
        while time.time() < end:
            if len([s for s in stamps(out) if s[0] >= boundary]) >= n:
                break
            time.sleep(0.2)
        cpu1 = cpu_seconds(proc.pid)
        # publishers stamp their sends with the count they forked with: read the beat's
        stmt1 = statements(count)
        burst = sorted(s for s in stamps(out) if s[0] >= boundary)
        if leader:  # the confirms of the last sends come after their publish
            while time.time() < end and len(confirmed_since(out, boundary)) < len(burst):
                time.sleep(0.2)
        confirmed = confirmed_since(out, boundary)
    finally:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(30)
        if proc.poll() is None:
            proc.kill()
        logfile.close()
        cleanup(args, queue, prefix if leader else None)
    complete = len(burst) >= n and (not leader or len(confirmed) >= n)
    last = burst[-1][0] - boundary if burst else None
    done = max(last, confirmed[-1] - boundary) if last is not None and confirmed else last
    stmts = None
    if burst and leader:
        stmts = (stmt1 if publishers_of(kind) else burst[-1][1]) - stmt0
    return {
        "kind": kind,
        "entries": n,
        "sent": len(burst),
        "complete": complete,
        "first_send_s": None if not burst else burst[0][0] - boundary,
        "last_send_s": last,
        # the leader counts a run sent once the broker confirmed it: its burst ends there
        "sends_per_s": None if not burst or not done else len(burst) / done,
        "last_confirm_s": confirmed[-1] - boundary if confirmed else None,
        "cpu_s": cpu1 - cpu0,
        "statements_per_send": None if stmts is None or not burst else stmts / len(burst),
        "ready_s": ready,
        "window_s": args.window,
    }


def cleanup(args: argparse.Namespace, queue: str, prefix: str | None) -> None:
    app = Celery("burst-cleanup", broker=args.broker, set_as_current=False)
    with contextlib.suppress(Exception), app.connection_for_write() as conn:
        conn.default_channel.queue_delete(queue)
    if prefix is None:
        return
    engine = sa.create_engine(args.pg, poolclass=sa.pool.NullPool)
    try:
        with engine.begin() as conn:
            names = sa.inspect(conn).get_table_names()
            for name in names:
                if name.startswith(prefix):
                    conn.exec_driver_sql(f"DROP TABLE IF EXISTS {name} CASCADE")
    finally:
        engine.dispose()


def render(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| N | scheduler | sent | last send after the boundary | last confirmed | sends/s "
        "| beat CPU s | stmt/send |",
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        last = "-" if r["last_send_s"] is None else f"{r['last_send_s']:.2f} s"
        if not r["complete"]:
            last += f" (not all within {r['window_s']:.0f} s)"
        rate = "-" if r["sends_per_s"] is None else f"{r['sends_per_s']:,.0f}"
        confirmed = r.get("last_confirm_s")
        conf = "-" if confirmed is None else f"{confirmed:.2f} s"
        stmt = "-" if r["statements_per_send"] is None else f"{r['statements_per_send']:.3f}"
        name = (
            "stock PersistentScheduler" if r["kind"] == "stock" else "LeaderScheduler (PostgreSQL)"
        )
        if publishers_of(r["kind"]):
            name += f", {publishers_of(r['kind'])} publisher(s)"
        lines.append(f"| {r['entries']:,} | {name} | {r['sent']:,} | {last} | {conf} | {rate} | "
                     f"{r['cpu_s']:.2f} | {stmt} |")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--entries", default="1000,10000", help="Comma-separated sizes.")
    parser.add_argument("--schedulers", default="stock,leader,leader-p1",
                        help="stock, leader, leader-pN (election_beat_publishers = N)")  # fmt: skip
    parser.add_argument("--broker", default=AMQP_DEFAULT)
    parser.add_argument("--pg", default=PG_DEFAULT)
    parser.add_argument("--window", type=float, default=55.0,
                        help="Seconds after the boundary to wait for the last send.")  # fmt: skip
    parser.add_argument("--ready-timeout", type=float, default=180.0)
    parser.add_argument("--json", default=str(DEFAULT_JSON))
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="beat-burst-") as tmpdir:
        tmp = Path(tmpdir)
        (tmp / "burstapp.py").write_text(APP)
        for n in [int(x) for x in args.entries.split(",")]:
            for kind in args.schedulers.split(","):
                row = run_one(kind, n, args, tmp)
                log(f"[{kind} N={n}] {json.dumps(row)}")
                rows.append(row)
    table = render(rows)
    print(table)
    result = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "machine": machine_info(),
        "postgresql": db_version("postgresql", args.pg),
        "broker": args.broker,
        "runs": rows,
        "table": table,
    }
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
