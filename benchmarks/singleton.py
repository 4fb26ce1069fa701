"""Singleton tasks side by side: a plain task, ``singleton_task`` per database, celery-singleton.

    PYTHONPATH=. .venv/bin/python benchmarks/singleton.py            # about 2 minutes
    PYTHONPATH=. .venv/bin/python benchmarks/singleton.py --quick    # a smoke run

celery-singleton (a Redis lock taken at publish and dropped when the task ends) is not a
project dependency: ``pip install --no-deps celery-singleton`` into the venv for this run.

In one run, for each kind:

(a) Time per task: ``apply_async`` of one no-op task, eagerly (``task_always_eager``: the
    same Celery path for every kind, no broker), keys cycling over 10 values, so every call
    takes a free key and gives it back. Interleaved chunks (``--chunk`` calls of each kind
    in turn, ``--repeat`` rounds) so load from other processes falls on all kinds alike;
    reported: the median over rounds of microseconds per task, and that less the plain
    task's (what holding a key adds).
(b) Statements per task: SQL statements the key holder's engine ran during the timed
    calls (its background renewals included; its session's pings are on a connection of
    their own, about 4 a second per process whatever the load, and not counted), or
    Redis commands celery-singleton sent, per task.
(c) Seconds until a crashed holder's key is free: a child process holds a key (the key
    holder ``singleton_task`` uses, with the lease's default timings: ttl 10 s, liveness
    1 s; or a celery-singleton ``apply_async`` whose worker never finishes it), is
    SIGKILLed, and this process asks for the key until it gets it. celery-singleton's
    lock has no expiry unless ``singleton_lock_expiry`` is set: measured with it unset
    (given up after ``--give-up`` seconds) and with it set to 5 s.

Results: benchmarks/results/singleton.json (and .md); RESULTS.md has the summary.
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _root  # noqa: F401  (the repository root on sys.path)
import sqlalchemy as sa
from _machine import machine_info
from celery import Celery

from celery_election import singleton_task
from celery_election.backends import backend_from_url
from celery_election.keys.singleton import key_holder

ROOT = Path(__file__).resolve().parents[1]
REDIS = os.environ.get("BENCH_REDIS", "redis://127.0.0.1:6379/13")
PREFIX = f"bsing{uuid.uuid4().hex[:6]}_"


@dataclass
class Kind:
    name: str
    task: Any
    count: Any  # () -> statements / commands so far
    us: list[float] = field(default_factory=list)
    ops: int = 0
    calls: int = 0
    freed_after: float | None = None
    note: str = ""


def _app(name: str, **conf: Any) -> Celery:
    app = Celery(f"bench-{name}", broker="memory://", set_as_current=False)
    app.conf.update(task_always_eager=True, task_store_eager_result=False, **conf)
    return app


def plain_kind() -> Kind:
    app = _app("plain")

    @app.task(name="bench.plain")
    def noop(key: int) -> int:
        return key

    return Kind("plain task", noop, lambda: 0)


def election_kind(label: str, url: str) -> Kind:
    app = _app(label, election_url=url, election_table_prefix=PREFIX, election_namespace="bench")
    backend_from_url(url, table_prefix=PREFIX).install()

    @singleton_task(app=app, name=f"bench.single_{label}")
    def noop(key: int) -> int:
        return key

    holder = key_holder(app)
    seen = [0]
    sa.event.listen(holder.backend.engine, "before_cursor_execute",
                    lambda *a, **k: seen.__setitem__(0, seen[0] + 1))  # fmt: skip
    return Kind(f"singleton_task, {label}", noop, lambda: seen[0])


def _cs_task(expiry: float | None = None) -> Any:
    from celery_singleton import Singleton

    app = _app("cs", singleton_backend_url=REDIS, singleton_key_prefix=f"{PREFIX}cs_",
               **({"singleton_lock_expiry": expiry} if expiry else {}))  # fmt: skip

    @app.task(base=Singleton, name="bench.celery_singleton")
    def noop(key: int) -> int:
        return key

    return noop


def celery_singleton_kind() -> Kind:
    from redis import Redis

    noop = _cs_task()
    seen = [0]
    real = Redis.execute_command

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        seen[0] += 1
        return real(self, *args, **kwargs)

    Redis.execute_command = counted  # type: ignore[method-assign]
    return Kind("celery-singleton, Redis", noop, lambda: seen[0])


def timed_rounds(kinds: list[Kind], chunk: int, repeat: int) -> None:
    """``repeat`` rounds; in each, ``chunk`` calls of every kind in turn (order rotating)."""
    for k in kinds:  # warm up: connections, tables, the holder's session
        for i in range(20):
            k.task.apply_async((i % 10,))
    for r in range(repeat):
        order = kinds[r % len(kinds) :] + kinds[: r % len(kinds)]
        for k in order:
            before = k.count()
            t0 = time.perf_counter()
            for i in range(chunk):
                k.task.apply_async((i % 10,))
            k.us.append((time.perf_counter() - t0) / chunk * 1e6)
            k.ops += k.count() - before
            k.calls += chunk


CHILD = """
import os, sys, time
sys.path.insert(0, {root!r})
from celery import Celery
kind, url, prefix, expiry = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
if kind == "election":
    from celery_election.keys.singleton import key_holder
    app = Celery("bench-child", set_as_current=False)
    app.conf.update(election_url=url, election_table_prefix=prefix, election_namespace="bench")
    held = key_holder(app).acquire("crash")
    assert held is not None
else:
    from celery_singleton import Singleton
    app = Celery("bench-child", broker="memory://", set_as_current=False)
    app.conf.update(singleton_backend_url=url, singleton_key_prefix=prefix + "cs_")
    if expiry:
        app.conf.singleton_lock_expiry = int(expiry)
    @app.task(base=Singleton, name="bench.celery_singleton")
    def noop(key): return key
    noop.apply_async(("crash",))  # the lock is taken; no worker ever ends the task
print("held", flush=True)
time.sleep(600)
"""


def crash_child(kind: str, url: str, expiry: float | None = None) -> float:
    """SIGKILL a child holding key "crash"; return when it died (monotonic)."""
    code = CHILD.format(root=str(ROOT))
    argv = [kind, url, PREFIX, str(int(expiry)) if expiry else ""]
    child = subprocess.Popen([sys.executable, "-c", code, *argv],
                             stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert child.stdout is not None
    line = child.stdout.readline().strip()
    assert line == "held", f"the child did not hold the key: {line!r}"
    child.send_signal(signal.SIGKILL)
    died = time.monotonic()
    child.wait()
    return died


def election_free_after(url: str, give_up: float) -> float | None:
    app = Celery("bench-crash", set_as_current=False)
    app.conf.update(election_url=url, election_table_prefix=PREFIX, election_namespace="bench")
    holder = key_holder(app)
    died = crash_child("election", url)
    while time.monotonic() - died < give_up:
        held = holder.acquire("crash")  # waits out a dead holder's delta itself
        if held is not None:
            took = time.monotonic() - died
            holder.release(held)
            return took
        time.sleep(0.01)
    return None


def celery_singleton_free_after(expiry: float | None, give_up: float) -> float | None:
    from redis import Redis

    task = _cs_task(expiry)
    redis = Redis.from_url(REDIS)
    died = crash_child("celery-singleton", REDIS, expiry)
    key = task.generate_lock(task.name, ["crash"], {})
    try:
        while time.monotonic() - died < give_up:
            if redis.set(key, "bench", nx=True):
                return time.monotonic() - died
            time.sleep(0.01)
        return None
    finally:
        redis.delete(key)


def report(kinds: list[Kind], crash: list[tuple[str, float | None, str]]) -> str:
    plain = statistics.median(kinds[0].us)
    lines = ["| kind | us per task (median) | added to a plain task | statements per task |",
             "|---|---:|---:|---:|"]  # fmt: skip
    for k in kinds:
        med = statistics.median(k.us)
        ops = f"{k.ops / k.calls:.2f}" if k.calls and k.name != "plain task" else "0"
        lines.append(f"| {k.name} | {med:.0f} | {med - plain:+.0f} | {ops} |")
    lines += ["", "| a crashed holder's key | free after |", "|---|---:|"]
    for name, took, note in crash:
        lines.append(f"| {name} | {f'{took:.2f} s' if took is not None else note} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--chunk", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--give-up", type=float, default=20.0)
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/singleton"))
    args = parser.parse_args()
    if args.quick:
        args.chunk, args.repeat, args.give_up = 50, 2, 8.0
    tmp = tempfile.mkdtemp(prefix="bench-singleton-")
    urls = {
        "SQLite": f"sqlite:///{tmp}/election.db",
        "PostgreSQL": os.environ.get("BENCH_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/test"),
        "MariaDB": os.environ.get("BENCH_MYSQL", "mysql+pymysql://root@127.0.0.1:3306/test"),
    }  # fmt: skip
    info = machine_info()
    kinds = [plain_kind(), *(election_kind(n, u) for n, u in urls.items()), celery_singleton_kind()]
    timed_rounds(kinds, args.chunk, args.repeat)
    crash: list[tuple[str, float | None, str]] = []
    for name, url in urls.items():
        crash.append((f"singleton_task, {name}", election_free_after(url, args.give_up), "never"))
    gave_up = f"not free after {args.give_up:.0f} s (no expiry: never)"
    crash.append(("celery-singleton, Redis, no lock_expiry (its default)",
                  celery_singleton_free_after(None, args.give_up), gave_up))  # fmt: skip
    crash.append(("celery-singleton, Redis, singleton_lock_expiry=5",
                  celery_singleton_free_after(5.0, args.give_up), gave_up))  # fmt: skip
    table = report(kinds, crash)
    print(table)
    data = {"machine": info, "chunk": args.chunk, "repeat": args.repeat,
            "kinds": [{"name": k.name, "us": k.us, "ops": k.ops, "calls": k.calls} for k in kinds],
            "crash": crash}  # fmt: skip
    for url in urls.values():
        backend_from_url(url, table_prefix=PREFIX).uninstall()
    if not args.quick:
        Path(args.out + ".json").write_text(json.dumps(data, indent=1))
        Path(args.out + ".md").write_text(table + "\n")
        print(f"results: {args.out}.json, .md")


if __name__ == "__main__":
    main()
