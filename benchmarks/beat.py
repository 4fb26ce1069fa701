"""Leader-only beat throughput and added latency per tick, against Celery's stock beat.

    .venv/bin/python benchmarks/beat.py --quick       # smoke run, about 30 s
    .venv/bin/python benchmarks/beat.py               # 3 repetitions x 10 s windows

The project's issue asks: with 1,000 entries at 1 s intervals on one leader, how many ticks
per second can the leader claim and send on PostgreSQL and SQLite, and what latency does
the claim add per tick compared with Celery's stock ``PersistentScheduler`` in the same run.

Set-up (one scheduler at a time, in this process):

* A fresh Celery app per run, broker ``memory://`` by default so the broker is not what is
  measured (``--broker amqp://guest:guest@127.0.0.1:5672//`` for RabbitMQ), whose
  ``beat_schedule`` has ``--entries`` entries (default 1000), each ``schedule: 1.0`` for a
  no-op task name (the task is not registered: beat sends it by name, as for a task that
  lives only in the workers). Messages go to a queue of the run's own, deleted afterwards.
* Configurations: ``stock`` (``celery.beat.PersistentScheduler``), ``sqlite``
  (``LeaderScheduler`` on a SQLite file in a temporary directory), ``postgresql``
  (``LeaderScheduler`` on PostgreSQL), and optionally ``mariadb``. Each leader run uses a
  unique ``election_table_prefix``; its tables are dropped afterwards. (The ``-norebuild``
  diagnostics of the ledger design are gone: the mixin now restores a sent entry's
  options itself, so a send never makes Celery rebuild its heap.)
* For a leader, the scheduler's own elector is waited for (``wait_for_leadership``), then
  ``tick()`` runs in a tight loop with no sleeping (the shelve is synced when Celery's own
  ``should_sync()`` says so, as ``celery beat``'s loop does). The first ``--warmup``
  seconds (default 2) are not measured: by then every entry has fallen due at least once,
  so the measured window sees the steady state, 1,000 ticks due per second.

Two send modes, both measured in every repetition:

* ``send`` (the headline): the real ``apply_async``, i.e. Celery builds the message and
  publishes it to the (memory) broker.
* ``count``: ``send_task`` (where the message goes out, after the leader's fence) counts
  the send and returns None (no message), which leaves the scheduler's own cost and the
  claim.

Metrics, per run (the table shows the median over the repetitions; every run is in the
JSON):

* ``sends/s``: ticks sent per second of the measured window. 1,000/s means it keeps up.
* ``capacity/s``: sends divided by the time spent inside ``tick()`` calls that sent (plus
  any heap rebuilds in ticks that did not), i.e. the rate it could sustain if always busy.
  When ``busy`` is near 100 % the scheduler is saturated and ``sends/s`` is its capacity.
* ``late p95``: how long after ``last_run_at + 1 s`` each tick was sent (the same rule for
  stock and leader: both are Celery's own schedule now). A scheduler that cannot keep up
  falls behind and drifts (each entry's next run is counted from its send time).
* ``pair p50/p95/max``: the time of each ``reserve()`` + ``apply_entry()`` pair, the part
  of a tick that the leader extends with its claim. ``+p50`` is the leader's p50 minus
  stock's in the same repetition and mode: the added latency of the claim.
* ``tick p50``: the whole ``tick()`` that sent (adds Celery's ``schedules_equal`` check,
  the heap, and any heap rebuild).
* ``claim p50``: ``backend.beat.claim_runs()`` alone (timed by wrapping the store's
  method; a tick's one due entry is a batch of one).
* ``stmt/tick``: SQL statements the scheduler thread sent per sent tick, counted with a
  SQLAlchemy ``before_cursor_execute`` listener on the backend's engine; BEGIN / COMMIT /
  ROLLBACK are not statements here (SQLite's backend sends ``BEGIN IMMEDIATE`` through
  the cursor, the other drivers begin implicitly). ``tx/tick``: committed transactions
  (engine ``commit`` events). The elector thread's statements (renewals) are counted
  apart, in the JSON.
* ``rebuild/s``: calls of ``populate_heap`` per second of the window. Celery rebuilds the
  heap whenever ``schedules_equal(old, new)`` finds an entry's editable fields changed;
  note that ``schedules_equal`` itself walks every entry on every tick (stock included).

The machine is small (2 cores): anything else running at the time shows in the numbers.
Each run records the load average before and after it, and its own CPU time, in the JSON.

Output: a table on stdout and a JSON file (default benchmarks/results/beat.json) with every
run's numbers, latency percentiles, the settings, the machine (nproc, CPU, Python, Celery,
kombu, SQLAlchemy and driver versions), the database versions and the date.

Clean-up: schedulers are closed, leader tables dropped, the run's queue deleted and the
temporary directory removed, also on Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import logging
import os
import secrets
import shutil
import signal
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _root  # noqa: F401  (the repository root on sys.path: harness)
import sqlalchemy as sa
from _machine import machine_info
from celery import Celery
from celery.beat import PersistentScheduler

from celery_election.beat import LeaderScheduler
from harness import stats

HERE = Path(__file__).resolve().parent
DEFAULT_JSON = HERE / "results" / "beat.json"
PG_DEFAULT = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
MYSQL_DEFAULT = "mysql+pymysql://root@127.0.0.1:3306/test"
AMQP_DEFAULT = "amqp://guest:guest@127.0.0.1:5672//"
ALL_CONFIGS = ("stock", "sqlite", "postgresql", "mariadb")
DEFAULT_CONFIGS = "stock,sqlite,postgresql"
MODES = ("send", "count")
TX_VERBS = {"BEGIN", "COMMIT", "ROLLBACK", "START", "END", "SAVEPOINT", "RELEASE"}
PCTS = (1, 5, 10, 25, 50, 75, 90, 95, 99, 99.9)

perf = time.perf_counter


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# =========================================================================================
# instrumented schedulers
# =========================================================================================


@dataclass
class Probe:
    """What one run records; only while ``active`` (the measured window)."""

    count_only: bool
    interval: float
    active: bool = False
    sends: int = 0
    unsent_pairs: int = 0
    lateness: list[float] = field(default_factory=list)
    pair: list[float] = field(default_factory=list)
    reserve: list[float] = field(default_factory=list)
    apply: list[float] = field(default_factory=list)
    claim: list[float] = field(default_factory=list)
    claims_refused: int = 0
    populate_calls: int = 0
    populate_time: float = 0.0
    _sending: Any = None
    stmts_main: int = 0
    stmts_other: int = 0
    tx_main: int = 0
    verbs: dict[str, int] = field(default_factory=dict)
    _pair_start: float = 0.0


class Instrumented:
    """Times reserve/apply_entry/populate_heap and counts sends; goes first in the MRO."""

    probe: Probe

    def populate_heap(self, *args: Any, **kwargs: Any) -> None:
        t0 = perf()
        super().populate_heap(*args, **kwargs)  # type: ignore[misc]
        if self.probe.active:
            self.probe.populate_calls += 1
            self.probe.populate_time += perf() - t0

    def reserve(self, entry: Any) -> Any:
        t0 = perf()
        new_entry = super().reserve(entry)  # type: ignore[misc]
        if self.probe.active:
            self.probe.reserve.append(perf() - t0)
        self.probe._pair_start = t0
        return new_entry

    def apply_entry(self, entry: Any, producer: Any = None) -> None:
        p = self.probe
        before = p.sends
        t0 = perf()
        super().apply_entry(entry, producer=producer)  # type: ignore[misc]
        end = perf()
        if p.active:
            p.apply.append(end - t0)
            p.pair.append(end - p._pair_start)
            if p.sends == before:
                p.unsent_pairs += 1

    def apply_async(self, entry: Any, producer: Any = None, advance: bool = True, **kw: Any) -> Any:
        # the entry Celery sends: its lateness is measured from last_run_at + interval
        self.probe._sending = entry
        return super().apply_async(entry, producer=producer, advance=advance, **kw)  # type: ignore[misc]

    def send_task(self, *args: Any, **kwargs: Any) -> Any:
        """Where the message really goes out: the leader's fence has already decided."""
        p = self.probe
        if p.active:
            entry = p._sending
            due = entry.last_run_at.timestamp() + entry.schedule.run_every.total_seconds()
            p.lateness.append(time.time() - due)
            p.sends += 1
        if p.count_only:
            return None
        return super().send_task(*args, **kwargs)  # type: ignore[misc]


class StockBench(Instrumented, PersistentScheduler):
    pass


class LeaderBench(Instrumented, LeaderScheduler):
    pass


def instrument_backend(backend: Any, probe: Probe) -> Any:
    """Count statements on the backend's engine and time claim_runs. Returns a remover."""
    main = threading.get_ident()
    engine = backend.engine

    def before(conn: Any, cursor: Any, statement: str, params: Any, context: Any, many: Any):
        if not probe.active:
            return
        verb = statement.lstrip().split(None, 1)[0].upper() if statement.strip() else "?"
        probe.verbs[verb] = probe.verbs.get(verb, 0) + 1
        if verb in TX_VERBS:
            return
        if threading.get_ident() == main:
            probe.stmts_main += 1
        else:
            probe.stmts_other += 1

    def on_commit(conn: Any) -> None:
        if probe.active and threading.get_ident() == main:
            probe.tx_main += 1

    sa.event.listen(engine, "before_cursor_execute", before)
    sa.event.listen(engine, "commit", on_commit)

    store = backend.beat
    original = store.claim_runs

    def timed_claim(*args: Any, **kwargs: Any) -> Any:
        t0 = perf()
        claims = original(*args, **kwargs)
        if probe.active:
            probe.claim.append(perf() - t0)
            probe.claims_refused += sum(not claim.won for claim in claims)
        return claims

    store.claim_runs = timed_claim

    def remove() -> None:
        with contextlib.suppress(Exception):
            sa.event.remove(engine, "before_cursor_execute", before)
            sa.event.remove(engine, "commit", on_commit)

    return remove


# =========================================================================================
# one run
# =========================================================================================


@dataclass
class Settings:
    entries: int
    seconds: float
    warmup: float
    interval: float
    broker: str
    urls: dict[str, str]
    tmpdir: Path


def database(cfg: str) -> str:
    """The database a configuration runs on ("stock" has none)."""
    return cfg.split("-", 1)[0]


def make_app(cfg: str, st: Settings, queue: str, prefix: str) -> Celery:
    app = Celery(f"beatbench_{cfg}", broker=st.broker, set_as_current=False)
    schedule = {
        f"e{i:05d}": {"task": "beatbench.noop", "schedule": st.interval} for i in range(st.entries)
    }
    app.conf.update(
        beat_schedule=schedule,
        task_default_queue=queue,
        broker_connection_retry_on_startup=True,
    )
    if cfg != "stock":
        app.conf.update(
            election_url=st.urls[database(cfg)],
            election_table_prefix=prefix,
            election_namespace=f"bb{secrets.token_hex(3)}",
        )
    return app


def percentiles(xs: list[float], scale: float = 1000.0) -> dict[str, float | None]:
    """Percentiles (ms by default) of a sample, plus max, mean and n."""
    return stats.percentiles(xs, PCTS, scale)


def run_once(cfg: str, mode: str, st: Settings, rep: int) -> dict[str, Any]:
    queue = f"beatbench-{os.getpid()}-{secrets.token_hex(4)}"
    prefix = f"bb{os.getpid()}_{secrets.token_hex(3)}_"
    app = make_app(cfg, st, queue, prefix)
    probe = Probe(count_only=(mode == "count"), interval=st.interval)
    cls: type[Any] = StockBench if cfg == "stock" else LeaderBench
    sched_file = st.tmpdir / f"schedule-{cfg}-{mode}-{rep}"
    s: Any = None
    remove_listeners = None
    result: dict[str, Any] = {"config": cfg, "mode": mode, "rep": rep}
    try:
        t_setup = perf()
        # Instrumented.* read self.probe; setup_schedule (in __init__) may populate the heap
        cls.probe = probe
        s = cls(app=app, schedule_filename=str(sched_file))
        s.probe = probe
        election_wait = None
        if cfg != "stock":
            el = s._fence.election
            assert el is not None and el.elector is not None
            t0 = perf()
            if not el.elector.wait_for_leadership(30):
                raise RuntimeError(f"{cfg}: no leadership within 30 s")
            election_wait = perf() - t0
            remove_listeners = instrument_backend(el.backend, probe)
        _ = s.producer  # connect to the broker before the clock starts
        result["setup_s"] = perf() - t_setup
        result["loadavg_before"] = os.getloadavg()
        result["election_wait_s"] = election_wait

        ticks_sent: list[float] = []  # durations of ticks that reserved and applied an entry
        idle_ticks = 0
        idle_time = 0.0
        idle_rebuild = 0.0  # heap rebuilds in ticks that applied nothing: work, not idling
        t_start = perf()
        warm_end = t_start + st.warmup
        end = warm_end + st.seconds
        window_start = None
        cpu0 = 0.0
        while True:
            now = perf()
            if now >= end:
                break
            if window_start is None and now >= warm_end:
                window_start = now
                cpu0 = time.process_time()
                probe.active = True
            pairs = len(probe.pair)
            rebuilt = probe.populate_time
            s.tick()
            dt = perf() - now
            if s.should_sync():
                s._do_sync()
            if probe.active:
                if len(probe.pair) > pairs:
                    ticks_sent.append(dt)
                else:
                    idle_ticks += 1
                    idle_time += dt
                    idle_rebuild += probe.populate_time - rebuilt
        probe.active = False
        window = perf() - (window_start or end)
        cpu = time.process_time() - cpu0
        busy = sum(ticks_sent) + idle_rebuild
        leading = None
        if cfg != "stock":
            leading = s._fence.election.leadership() is not None
        result.update(
            window_s=window,
            sends=probe.sends,
            sends_per_s=probe.sends / window if window > 0 else None,
            offered_per_s=st.entries / st.interval,
            ticks_due_in_window=st.entries * window / st.interval,
            shortfall=st.entries * window / st.interval - probe.sends,
            busy_s=busy,
            busy_fraction=busy / window if window > 0 else None,
            capacity_per_s=probe.sends / busy if busy > 0 else None,
            cpu_s=cpu,
            loadavg_after=os.getloadavg(),
            idle_ticks=idle_ticks,
            idle_tick_time_s=idle_time,
            unsent_pairs=probe.unsent_pairs,
            claims=len(probe.claim),
            claims_refused=probe.claims_refused,
            heap_rebuilds=probe.populate_calls,
            heap_rebuild_time_s=probe.populate_time,
            still_leading=leading,
            stmts_main=probe.stmts_main,
            stmts_elector=probe.stmts_other,
            tx_main=probe.tx_main,
            verbs=probe.verbs,
            stmts_per_tick=probe.stmts_main / probe.sends if probe.sends else None,
            tx_per_tick=probe.tx_main / probe.sends if probe.sends else None,
            pair_ms=percentiles(probe.pair),
            reserve_ms=percentiles(probe.reserve),
            apply_ms=percentiles(probe.apply),
            claim_ms=percentiles(probe.claim),
            tick_ms=percentiles(ticks_sent),
            lateness_ms=percentiles(probe.lateness),
        )
        return result
    finally:
        if remove_listeners is not None:
            remove_listeners()
        teardown(s, cfg, app, queue)
        for suffix in ("", ".db", ".dat", ".bak", ".dir"):
            with contextlib.suppress(OSError):
                os.remove(f"{sched_file}{suffix}")


def teardown(s: Any, cfg: str, app: Celery, queue: str) -> None:
    if s is not None:
        el = getattr(s, "_election", None)
        if el is not None:
            if el.elector is not None:
                with contextlib.suppress(Exception):
                    el.elector.stop()
            try:
                el.backend.uninstall()
            except Exception as exc:
                log(f"[{cfg}] could not drop the tables: {exc!r}")
        try:
            s.close()
        except Exception as exc:
            log(f"[{cfg}] close failed: {exc!r}")
    with contextlib.suppress(Exception), app.connection_for_write() as conn:
        conn.default_channel.queue_delete(queue)
    with contextlib.suppress(Exception):
        app.close()


# =========================================================================================
# reporting
# =========================================================================================


def med(values: list[Any]) -> float | None:
    xs = [v for v in values if v is not None]
    return statistics.median(xs) if xs else None


def fmt(v: float | None, spec: str = ".0f") -> str:
    return "-" if v is None else format(v, spec)


def summarise(runs: list[dict[str, Any]], configs: list[str]) -> list[dict[str, Any]]:
    rows = []
    for mode in MODES:
        stock_p50 = {
            r["rep"]: r["pair_ms"]["p50"]
            for r in runs
            if r["config"] == "stock" and r["mode"] == mode and "pair_ms" in r
        }
        for cfg in configs:
            rs = [r for r in runs if r["config"] == cfg and r["mode"] == mode and "pair_ms" in r]
            if not rs:
                continue
            added = [
                r["pair_ms"]["p50"] - stock_p50[r["rep"]]
                for r in rs
                if r["pair_ms"]["p50"] is not None and stock_p50.get(r["rep"]) is not None
            ]
            rows.append(
                {
                    "mode": mode,
                    "config": cfg,
                    "runs": len(rs),
                    "sends_per_s": med([r["sends_per_s"] for r in rs]),
                    "capacity_per_s": med([r["capacity_per_s"] for r in rs]),
                    "busy_fraction": med([r["busy_fraction"] for r in rs]),
                    "late_p95_ms": med([r["lateness_ms"]["p95"] for r in rs]),
                    "pair_p50_ms": med([r["pair_ms"]["p50"] for r in rs]),
                    "pair_p95_ms": med([r["pair_ms"]["p95"] for r in rs]),
                    "pair_max_ms": max(r["pair_ms"]["max"] or 0 for r in rs),
                    "added_p50_ms": med(added) if cfg != "stock" else None,
                    "tick_p50_ms": med([r["tick_ms"]["p50"] for r in rs]),
                    "claim_p50_ms": med([r["claim_ms"]["p50"] for r in rs]),
                    "stmts_per_tick": med([r["stmts_per_tick"] for r in rs]),
                    "tx_per_tick": med([r["tx_per_tick"] for r in rs]),
                    "heap_rebuilds_per_s": med(
                        [r["heap_rebuilds"] / r["window_s"] for r in rs if r["window_s"]]
                    ),
                    "unsent_pairs": sum(r["unsent_pairs"] for r in rs),
                }
            )
    return rows


def render(rows: list[dict[str, Any]], entries: int, interval: float) -> str:
    head = (
        f"{'mode':<5} {'config':<20} {'sends/s':>8} {'capacity/s':>10} {'busy':>5} "
        f"{'late p95':>9} {'pair p50':>8} {'p95':>7} {'max':>7} {'+p50':>7} "
        f"{'tick p50':>8} {'claim p50':>9} {'stmt/tick':>9} {'tx/tick':>7} {'rebuild/s':>9}"
    )
    lines = [
        f"{entries} entries every {interval:g} s: {entries / interval:.0f} ticks due per second."
        " Times in ms; median of the repetitions (pair max: the largest of any).",
        head,
        "-" * len(head),
    ]
    for r in rows:
        busy = r["busy_fraction"]
        lines.append(
            f"{r['mode']:<5} {r['config']:<20} {fmt(r['sends_per_s']):>8} "
            f"{fmt(r['capacity_per_s']):>10} {fmt(None if busy is None else busy * 100):>4}% "
            f"{fmt(r['late_p95_ms'], '.1f'):>9} "
            f"{fmt(r['pair_p50_ms'], '.3f'):>8} {fmt(r['pair_p95_ms'], '.3f'):>7} "
            f"{fmt(r['pair_max_ms'], '.1f'):>7} {fmt(r['added_p50_ms'], '+.3f'):>7} "
            f"{fmt(r['tick_p50_ms'], '.3f'):>8} {fmt(r['claim_p50_ms'], '.3f'):>9} "
            f"{fmt(r['stmts_per_tick'], '.2f'):>9} {fmt(r['tx_per_tick'], '.2f'):>7} "
            f"{fmt(r['heap_rebuilds_per_s'], '.0f'):>9}"
        )
    return "\n".join(lines)


# =========================================================================================
# environment
# =========================================================================================


def db_version(cfg: str, url: str) -> str:
    if cfg == "sqlite":
        return f"SQLite {sqlite3.sqlite_version}"
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            return str(conn.exec_driver_sql("SELECT version()").scalar())
    finally:
        engine.dispose()


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


# =========================================================================================
# main
# =========================================================================================


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--entries", type=int, default=1000, help="beat entries (default 1000)")
    p.add_argument("--interval", type=float, default=1.0, help="each entry's schedule, s")
    p.add_argument("--seconds", type=float, help="measured window per run (default 10; quick 3)")
    p.add_argument("--warmup", type=float, help="unmeasured ticking first (default 2; quick 1.5)")
    p.add_argument("--reps", type=int, help="repetitions, interleaved (default 3; quick 1)")
    p.add_argument(
        "--backends",
        default=DEFAULT_CONFIGS,
        help=f"configurations, in order (default {DEFAULT_CONFIGS}); all: {','.join(ALL_CONFIGS)}",
    )
    p.add_argument("--modes", default=",".join(MODES), help="send modes (default send,count)")
    p.add_argument("--quick", action="store_true", help="smoke run, about 30 s")
    p.add_argument("--broker", default="memory://", help="broker URL (default memory://)")
    p.add_argument("--pg-url", default=os.environ.get("CELERY_ELECTION_TEST_PG_URL", PG_DEFAULT))
    p.add_argument(
        "--mysql-url", default=os.environ.get("CELERY_ELECTION_TEST_MYSQL_URL", MYSQL_DEFAULT)
    )
    p.add_argument("--json", type=Path, default=DEFAULT_JSON, help="results file")
    a = p.parse_args(argv)
    a.seconds = a.seconds if a.seconds is not None else (3.0 if a.quick else 10.0)
    a.warmup = a.warmup if a.warmup is not None else (1.5 if a.quick else 2.0)
    a.reps = a.reps if a.reps is not None else (1 if a.quick else 3)
    a.configs = [c.strip() for c in a.backends.split(",") if c.strip()]
    bad = [c for c in a.configs if c not in ALL_CONFIGS]
    if bad:
        p.error(f"unknown configuration(s) {bad}; choose from {ALL_CONFIGS}")
    a.mode_list = [m.strip() for m in a.modes.split(",") if m.strip()]
    if any(m not in MODES for m in a.mode_list):
        p.error(f"modes are {MODES}")
    return a


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    tmpdir = Path(tempfile.mkdtemp(prefix="beatbench-"))
    urls = {
        "sqlite": f"sqlite:///{tmpdir}/election.db",
        "postgresql": args.pg_url,
        "mariadb": args.mysql_url,
    }
    st = Settings(
        entries=args.entries,
        seconds=args.seconds,
        warmup=args.warmup,
        interval=args.interval,
        broker=args.broker,
        urls=urls,
        tmpdir=tmpdir,
    )
    started = datetime.datetime.now(datetime.timezone.utc)
    runs: list[dict[str, Any]] = []
    failures: list[dict[str, Any]] = []
    versions: dict[str, str] = {}
    interrupted = False
    try:
        with sigterm_as_interrupt():
            for db in dict.fromkeys(database(c) for c in args.configs if c != "stock"):
                try:
                    versions[db] = db_version(db, urls[db])
                except Exception as exc:
                    log(f"[{db}] unreachable, skipped: {exc!r}"[:300])
                    failures.append({"config": db, "error": repr(exc)[:500]})
            configs = [c for c in args.configs if c == "stock" or database(c) in versions]
            total = len(configs) * len(args.mode_list) * args.reps
            log(
                f"{total} runs of {args.warmup:g}+{args.seconds:g} s: {args.entries} entries "
                f"every {args.interval:g} s, broker {args.broker}"
            )
            for rep in range(args.reps):
                for mode in args.mode_list:
                    for cfg in configs:
                        try:
                            r = run_once(cfg, mode, st, rep)
                        except KeyboardInterrupt:
                            raise
                        except Exception as exc:
                            log(f"[{cfg}/{mode}/{rep}] failed: {exc!r}")
                            failures.append(
                                {"config": cfg, "mode": mode, "rep": rep, "error": repr(exc)}
                            )
                            continue
                        runs.append(r)
                        log(
                            f"[rep {rep} {mode:<5} {cfg:<20}] sends/s {r['sends_per_s']:.0f}"
                            f"  capacity/s {fmt(r['capacity_per_s'])}"
                            f"  busy {r['busy_fraction'] * 100:.0f}%"
                            f"  pair p50 {fmt(r['pair_ms']['p50'], '.3f')} ms"
                            f"  rebuilds {r['heap_rebuilds']}"
                        )
    except KeyboardInterrupt:
        interrupted = True
        log("interrupted: cleaned up; writing what was measured")
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)

    configs_seen = [c for c in args.configs if any(r["config"] == c for r in runs)]
    rows = summarise(runs, configs_seen)
    table = render(rows, args.entries, args.interval)
    print(table)
    out = {
        "benchmark": "beat",
        "date": started.isoformat(timespec="seconds"),
        "duration_s": (datetime.datetime.now(datetime.timezone.utc) - started).total_seconds(),
        "interrupted": interrupted,
        "settings": {
            "entries": args.entries,
            "interval_s": args.interval,
            "seconds": args.seconds,
            "warmup_s": args.warmup,
            "reps": args.reps,
            "configs": args.configs,
            "modes": args.mode_list,
            "broker": args.broker,
            "quick": args.quick,
            "headline_mode": "send",
        },
        "machine": machine_info(),
        "db_versions": versions,
        "summary": rows,
        "runs": runs,
        "failures": failures,
        "table": table.splitlines(),
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=1) + "\n")
    log(f"wrote {args.json}")
    return 1 if failures or interrupted else 0


if __name__ == "__main__":
    sys.exit(main())
