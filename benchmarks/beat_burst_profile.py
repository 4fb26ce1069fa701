"""Where a leader's burst spends its CPU: cProfile across one N-entry burst, in process.

    .venv/bin/python benchmarks/beat_burst_profile.py                 # N = 10,000
    .venv/bin/python benchmarks/beat_burst_profile.py --entries 1000 --top 40
    .venv/bin/python benchmarks/beat_burst_profile.py --floor         # Celery's publish alone

``beat_burst.py`` measures real ``celery beat`` processes; this drives one
``LeaderScheduler`` in this process the way beat's loop does (``tick``, then sleep for what
it answered), on the same services: PostgreSQL for the election and the shared run state,
RabbitMQ as the broker (a queue of the run's own, deleted afterwards), N entries
``crontab(minute="*")`` for a task name no process has (sent by name, as beat does).

It times the promotion (the first leading tick: loading and recording the shared state),
syncs after ticks that waited as beat's ``Service`` loop does, then waits for the next
minute boundary at least 3 s away and profiles the ticks from 0.3 s before it until all
N sends went out (the scheduler's count of sends confirmed or, from its publishers, replied;
the floor's: ``after_task_publish``). It prints the wall time, the CPU
time (``time.process_time``), the top functions by own time and by cumulative time, and
writes the profile to ``--out`` (pstats format). ``--no-profile``: the times alone;
``--spy FILE``: py-spy's samples of the burst (collapsed stacks), e.g. with --no-profile.

``--floor``: no scheduler; N calls of Celery's ``Scheduler.apply_entry`` for the same
entries through one producer (what stock beat does per send, without its O(N) schedule
comparison): the cost of Celery's own publish that any beat pays.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import _root  # noqa: F401  (puts the project on sys.path)
import sqlalchemy as sa
from beat import PG_DEFAULT, log
from celery import Celery
from celery.beat import Scheduler
from celery.schedules import crontab
from celery.signals import after_task_publish

from celery_election.beat import LeaderScheduler
from celery_election.beat.sender import Sender

AMQP_DEFAULT = "amqp://guest:guest@127.0.0.1:5672//"
SENT = [0]
_LOCK = threading.Lock()


def _count(**kwargs: Any) -> None:
    with _LOCK:
        SENT[0] += 1


_sent = Sender.sent


def _count_sent(self: Sender, *args: Any, **kwargs: Any) -> None:
    """A send the scheduler counts as gone out (confirmed; a publisher's, replied)."""
    _count()
    _sent(self, *args, **kwargs)


def make_app(args: argparse.Namespace, queue: str, prefix: str, ns: str) -> Celery:
    # the current app, as in `celery -A proj beat` (entries loaded from the shelve read
    # their clock from the current app)
    app = Celery("burstprof", broker=args.broker)
    app.conf.update(
        beat_schedule={
            f"e{i:05d}": {"task": "burst.noop", "schedule": crontab(minute="*")}
            for i in range(args.entries)
        },
        task_default_queue=queue,
        broker_connection_retry_on_startup=True,
        election_url=args.pg,
        election_table_prefix=prefix,
        election_namespace=ns,
        election_beat_publishers=args.publishers,
    )
    return app


def report(prof: cProfile.Profile, top: int, out: str) -> str:
    prof.dump_stats(out)
    buf = io.StringIO()
    stats = pstats.Stats(prof, stream=buf).strip_dirs()
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)
    return buf.getvalue()


def floor(args: argparse.Namespace, app: Celery, tmp: Path) -> None:
    """Celery's publish alone: N apply_entry calls through one producer."""
    after_task_publish.connect(_count, weak=False)
    s = Scheduler(app=app, lazy=True)
    s.setup_schedule()
    entries = list(s.schedule.values())
    producer = s.producer
    prof = cProfile.Profile()
    cpu0, t0 = time.process_time(), time.perf_counter()
    if not args.no_profile:
        prof.enable()
    for entry in entries:
        s.apply_entry(entry, producer=producer)
    prof.disable()
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    print(f"floor: {len(entries)} apply_entry in {wall:.2f} s wall, {cpu:.2f} s CPU "
          f"({cpu / len(entries) * 1e3:.3f} ms CPU per send); sent {SENT[0]}")  # fmt: skip
    if not args.no_profile:
        print(report(prof, args.top, args.out))


def burst(args: argparse.Namespace, app: Celery, tmp: Path) -> None:
    Sender.sent = _count_sent  # type: ignore[method-assign]
    s = LeaderScheduler(app=app, schedule_filename=str(tmp / "schedule"))
    try:
        assert s.wait_for_leadership(30), "not leading in 30 s"
        prof = cProfile.Profile() if args.promotion else None
        cpu0, t0 = time.process_time(), time.perf_counter()
        if prof is not None:
            prof.enable()
        next_in = s.tick()  # promotes: loads and records the shared state
        if prof is not None:
            prof.disable()
        log(f"promotion tick: {time.perf_counter() - t0:.2f} s wall, "
            f"{time.process_time() - cpu0:.2f} s CPU; sent {SENT[0]}")  # fmt: skip
        if prof is not None:
            print(report(prof, args.top, args.out + ".promotion"))
        boundary = (int(time.time() + 3) // 60 + 1) * 60
        while time.time() < boundary - 0.3:
            time.sleep(max(0.0, min(next_in, boundary - 0.3 - time.time())))
            if s.should_sync():  # as beat's Service loop: after a tick that waited
                s._do_sync()
            next_in = s.tick()
        spy = None
        if args.spy:  # a sampling profile of the burst alone (py-spy, from PyPI)
            spy = subprocess.Popen([str(Path(sys.executable).with_name("py-spy")), "record",
                                    "-r", "250", "-f", "raw", "-o", args.spy,
                                    "--pid", str(os.getpid())])  # fmt: skip
            time.sleep(max(0.0, boundary - 0.3 - time.time()))
        start_sent = SENT[0]
        prof = cProfile.Profile()
        cpu0, t0, main0 = time.process_time(), time.perf_counter(), time.thread_time()
        ticks = 0
        if not args.no_profile:
            prof.enable()
        deadline = boundary + args.window
        while SENT[0] - start_sent < args.entries and time.time() < deadline:
            next_in = s.tick()
            ticks += 1
            if next_in > 0:  # as beat's Service loop: a tick may answer a hair below 0
                time.sleep(min(next_in, 0.05))
                if s.should_sync():
                    s._do_sync()
        prof.disable()
        last = time.time() - boundary
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            spy.wait(30)
        cpu, main = time.process_time() - cpu0, time.thread_time() - main0
        sent = SENT[0] - start_sent
        print(f"burst: {sent} sent, last {last:.2f} s after the boundary, "
              f"{time.perf_counter() - t0:.2f} s wall profiled, {cpu:.2f} s CPU "
              f"({cpu / max(sent, 1) * 1e3:.3f} ms CPU per send; the tick thread {main:.2f} s), "
              f"{ticks} ticks")  # fmt: skip
        if not args.no_profile:
            print(report(prof, args.top, args.out))
    finally:
        s.close()


def cleanup(args: argparse.Namespace, app: Celery, queue: str, prefix: str) -> None:
    try:
        with app.connection_for_write() as conn:
            conn.default_channel.queue_delete(queue)
    except Exception as exc:
        log(f"queue {queue} not deleted: {exc}")
    engine = sa.create_engine(args.pg, poolclass=sa.pool.NullPool)
    try:
        with engine.begin() as conn:
            for name in sa.inspect(conn).get_table_names():
                if name.startswith(prefix):
                    conn.exec_driver_sql(f"DROP TABLE IF EXISTS {name} CASCADE")
    finally:
        engine.dispose()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--entries", type=int, default=10_000)
    parser.add_argument("--broker", default=AMQP_DEFAULT)
    parser.add_argument("--pg", default=PG_DEFAULT)
    parser.add_argument("--window", type=float, default=120.0)
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--out", default="burst.prof")
    parser.add_argument("--floor", action="store_true", help="Celery's publish alone.")
    parser.add_argument(
        "--publishers",
        type=int,
        default=0,
        help="election_beat_publishers (their sends are counted by the replies).",
    )
    parser.add_argument("--promotion", action="store_true", help="Profile the promotion too.")
    parser.add_argument("--no-profile", action="store_true", help="Time the burst only.")
    parser.add_argument("--spy", help="Also sample the burst with py-spy into this file (raw).")
    args = parser.parse_args(argv)
    tag = secrets.token_hex(3)
    queue, prefix, ns = f"burstprof-{tag}", f"bp{tag}_", f"burstprof{tag}"
    app = make_app(args, queue, prefix, ns)
    log(f"load average before: {os.getloadavg()}")
    with tempfile.TemporaryDirectory(prefix="beat-burst-prof-") as tmpdir:
        try:
            (floor if args.floor else burst)(args, app, Path(tmpdir))
        finally:
            cleanup(args, app, queue, prefix)
    log(f"load average after: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
