"""The operable schedule at size: 10,000 dynamic entries on one leader, history at 1,000,000 rows.

    .venv/bin/python benchmarks/beat_dynamic.py                      # PostgreSQL, 150 s
    .venv/bin/python benchmarks/beat_dynamic.py --entries 2000 --seconds 60 --url sqlite:///x.db

Part 1, the leader (issue 24: "10,000 dynamic entries, each sent within 1 s of its due
time on PostgreSQL, leader CPU and statements per second reported"):

* ``--entries`` dynamic entries (default 10,000) every ``--period`` seconds (default 60),
  seeded straight into ``schedule_entry`` (one bulk INSERT, as 10,000 ``schedule add``
  would leave it) with creation times spread over one period, so that their due times
  spread evenly: ``entries / period`` sends per second in the steady state (167/s).
* One ``LeaderScheduler`` in this process, driven as ``celery beat`` drives it (``tick()``,
  then sleep what it returns), publishing to ``--broker`` (memory by default: the broker is
  not what is measured). The window starts one period after it leads and has loaded the
  entries (the first period holds each entry's first run, made late by the load itself).
* ``late``: for each send, the scheduler's clock at the send minus the run's due time
  (``last_run_at + period``); p50 / p95 / max and the share within 1 s.
* ``CPU``: this process's CPU time over the window (the scheduler, its elector thread and
  the broker client), as a share of one core. ``statements/s``: every statement the
  backend's engines sent in the window (SQLAlchemy ``before_cursor_execute``), the
  elector's renewals included; per send too.

Part 2, history queries with ``--history-rows`` rows (default 1,000,000: 1,000 entries x
1,000 runs) in ``schedule_run``: each query of the API run 20 times, p50 and max in ms.
Target: under 50 ms.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import _root  # noqa: F401  (puts the repository on sys.path)
import sqlalchemy as sa
from celery import Celery

from celery_election.backends import SQLBackend, backend_from_url
from celery_election.backends.schema import entry_key
from celery_election.beat import LeaderScheduler
from celery_election.core.runstate import run_key
from celery_election.schedule.store import schedule_store

DEFAULT_URL = os.environ.get(
    "CELERY_ELECTION_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)


class Measured(LeaderScheduler):
    """Records how late each send is against its due time."""

    late: list[float]
    period: float

    def apply_entry(self, entry: Any, producer: Any = None) -> None:
        if entry.last_run_at is not None:
            due = entry.last_run_at + timedelta(seconds=self.period)
            self.late.append((self.app.now() - due).total_seconds())
        super().apply_entry(entry, producer=producer)


def count_statements(backend: SQLBackend) -> list[int]:
    counter = [0]
    lock = threading.Lock()

    def seen(*_: Any) -> None:
        with lock:
            counter[0] += 1

    sa.event.listen(backend.engine, "before_cursor_execute", seen)
    return counter


def seed_entries(backend: SQLBackend, namespace: str, n: int, period: float) -> None:
    """``n`` dynamic entries every ``period`` s, due times spread over the next period."""
    now = schedule_store(backend).db_now()
    spec = json.dumps({"schedule": {"every": period}, "args": [], "kwargs": {}, "options": {},
                       "catch_up": "latest", "catch_up_max": 10, "grace": None,
                       "overlap": "allow", "overlap_timeout": 3600.0})  # fmt: skip
    rows = [
        {
            "namespace": namespace,
            "entry_key": entry_key(f"e{i}"),
            "name": f"e{i}",
            "task": "bench.noop",
            "spec": spec,
            "enabled": True,
            "deleted": False,
            "version": i + 1,
            "created_at": now - round(period * 1e6) + round(i * period * 1e6 / n) + 5_000_000,
            "updated_at": now,
            "updated_by": "benchmark",
        }
        for i in range(n)
    ]
    with backend.engine.begin() as conn:
        conn.execute(sa.insert(schedule_store(backend).entry), rows)
        conn.execute(sa.insert(schedule_store(backend).rev).values(namespace=namespace, version=n))


def leader_run(args: argparse.Namespace) -> dict[str, Any]:
    prefix = f"b{uuid.uuid4().hex[:8]}_"
    ns = f"bench{uuid.uuid4().hex[:6]}"
    app = Celery("bench", broker=args.broker, set_as_current=False)
    app.conf.update(
        election_url=args.url, election_table_prefix=prefix, election_namespace=ns,
        beat_schedule={}, task_default_queue=f"bench.{ns}",
    )  # fmt: skip
    backend = backend_from_url(args.url, table_prefix=prefix)
    assert isinstance(backend, SQLBackend)
    backend.install()
    tmp = Path(f"/tmp/beat-dynamic-{ns}")
    tmp.mkdir(exist_ok=True)
    s = Measured(app=app, schedule_filename=str(tmp / "schedule"))
    s.late, s.period = [], args.period
    try:
        seed_entries(backend, f"{ns}-beat", args.entries, args.period)
        assert s.wait_for_leadership(30)
        election = s._fence.election
        assert election is not None and isinstance(election.backend, SQLBackend)
        statements = count_statements(election.backend)
        while len(s.schedule) < args.entries:  # promoted and loaded
            time.sleep(max(0.0, min(0.5, s.tick())))
        warm = time.monotonic() + args.period  # the first period: every entry's first run
        while time.monotonic() < warm:
            time.sleep(max(0.0, min(1.0, s.tick())))
        s.late.clear()
        cpu0, wall0, stmt0 = time.process_time(), time.monotonic(), statements[0]
        end = wall0 + args.seconds
        while time.monotonic() < end:
            time.sleep(max(0.0, min(1.0, s.tick())))
        cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
        stmts = statements[0] - stmt0
        late = sorted(s.late)
        sends = len(late)
        return {
            "url": backend.description,
            "entries": args.entries,
            "period_s": args.period,
            "window_s": round(wall, 1),
            "sends": sends,
            "sends_per_s": round(sends / wall, 1),
            "late_p50_s": round(statistics.median(late), 4) if late else None,
            "late_p95_s": round(late[int(0.95 * (sends - 1))], 4) if late else None,
            "late_max_s": round(late[-1], 4) if late else None,
            "within_1s": round(sum(1 for x in late if x <= 1.0) / sends, 4) if late else None,
            "cpu_share_of_one_core": round(cpu / wall, 3),
            "statements_per_s": round(stmts / wall, 1),
            "statements_per_send": round(stmts / sends, 2) if sends else None,
        }
    finally:
        s.close()
        backend.uninstall()
        backend.close()


def history_run(args: argparse.Namespace) -> dict[str, Any]:
    prefix = f"h{uuid.uuid4().hex[:8]}_"
    backend = backend_from_url(args.url, table_prefix=prefix)
    assert isinstance(backend, SQLBackend)
    backend.install()
    store = schedule_store(backend)
    ns = "history-bench"
    entries, per = 1000, max(1, args.history_rows // 1000)
    try:
        t0 = time.monotonic()
        _bulk_history(backend, ns, entries, per)
        loaded = time.monotonic() - t0
        if backend.dialect == "postgresql":
            with backend.engine.connect() as conn:
                conn.exec_driver_sql(f"ANALYZE {store.run.name}")
        some = store.history([ns], "e500", limit=per)
        middle = some[len(some) // 2].sent_at
        queries = {
            "history (latest 20)": lambda: store.history([ns], "e500", limit=20),
            "history (a page in the middle)": lambda: store.history(
                [ns], "e500", limit=20, before=middle
            ),
            "last sent (overlap check)": lambda: store.last_sent([ns], "e500"),
            "prune 5,000 old rows": lambda: backend.runs.prune(ns, 0, batch=5000, history=True),
        }
        out: dict[str, Any] = {"rows": entries * per, "load_s": round(loaded, 1)}
        for name, query in queries.items():
            times = []
            for _ in range(20):
                start = time.perf_counter()
                query()
                times.append((time.perf_counter() - start) * 1000)
            out[name] = {
                "p50_ms": round(statistics.median(times), 2),
                "max_ms": round(max(times), 2),
            }
        return out
    finally:
        backend.uninstall()
        backend.close()


def _bulk_history(backend: SQLBackend, ns: str, entries: int, per: int) -> None:
    """``entries`` x ``per`` finished runs, sent_at 1 s apart per entry (a year of hourly
    runs is 8,760 per entry; these are 1,000)."""
    table = schedule_store(backend).run
    columns = ["namespace", "run_key", "task_id", "task_name", "hostname", "pid", "attempt",
               "started_at", "finished_at", "outcome", "state", "term", "entry_name", "due",
               "entry_key", "kind", "due_at", "count", "began_at"]  # fmt: skip

    def rows(e: int) -> list[tuple[Any, ...]]:
        key, name = entry_key(f"e{e}"), f"e{e}"
        out = []
        for i in range(per):
            at, last = 1_000_000 + i * 1_000_000, i == per - 1
            tid = f"t-{e}-{i}"
            out.append((ns, run_key(tid), tid, "t.x", "h", 1, 1, at, None if last else at + 500_000,
                        None if last else "SUCCESS", "started" if last else "ended", 1, name, i,
                        key, "run", at, 1, at))  # fmt: skip
        return out

    if backend.dialect == "postgresql":
        # a plain engine: the backend's own bounds every statement (statement_timeout)
        plain = sa.create_engine(backend.engine.url, poolclass=sa.pool.NullPool)
        raw = plain.raw_connection()
        try:
            with raw.cursor() as cur:  # type: ignore[attr-defined]
                sql = f"COPY {table.name} ({', '.join(columns)}) FROM STDIN"
                with cur.copy(sql) as copy:
                    for e in range(entries):
                        for row in rows(e):
                            copy.write_row(row)
            raw.commit()
        finally:
            raw.close()
            plain.dispose()
        return
    with backend.engine.begin() as conn:
        for e in range(entries):
            conn.execute(sa.insert(table), [dict(zip(columns, r, strict=True)) for r in rows(e)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", default=DEFAULT_URL)
    parser.add_argument("--broker", default="memory://")
    parser.add_argument("--entries", type=int, default=10_000)
    parser.add_argument("--period", type=float, default=60.0)
    parser.add_argument("--seconds", type=float, default=150.0)
    parser.add_argument("--history-rows", type=int, default=1_000_000)
    parser.add_argument("--skip-leader", action="store_true")
    parser.add_argument("--json", help="Also write the results here.")
    args = parser.parse_args()
    results: dict[str, Any] = {}
    if not args.skip_leader:
        results["leader"] = leader_run(args)
        print(json.dumps(results["leader"], indent=2))
    if args.history_rows:
        results["history"] = history_run(args)
        print(json.dumps(results["history"], indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
