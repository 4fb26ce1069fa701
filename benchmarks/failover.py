"""Leader election failover and steady-state database load, per database.

    .venv/bin/python benchmarks/failover.py --quick          # smoke run, ~30 s per database
    .venv/bin/python benchmarks/failover.py                  # full run (see --help)

For each configuration (``pg-notify``: PostgreSQL with LISTEN/NOTIFY wakeups, ``pg-poll``:
PostgreSQL with ``listen=False``, ``sqlite``, ``mariadb``) it starts N elector processes
(default 3) on a fresh table prefix and measures:

(a) clean handoff: SIGTERM to the leader's process. The child calls ``elector.stop()``,
    which drops its belief (the ``revoked`` transition, reason ``stopped``), then resigns
    the term in the database. Reported: time from that revoke to the next ``elected``
    transition in another process, and, for context, from the SIGTERM to it. Each sample
    in the JSON also breaks the handoff down (all from the revoke): when the old leader's
    resign statement was sent and returned, when the winner's elect was sent, and when
    the old leader's ``stop()`` returned.
(b) crash failover: SIGKILL to the leader's process. Right after the kill the parent reads
    the lease (``backend.current()``); ``lease.remaining`` is what was left of it on the
    database's clock. Reported: (next ``elected`` - kill) - remaining, i.e. how long past
    the lease's expiry the takeover came. This is an upper bound: the remaining lease is
    read a little after the kill (the query latency, about a millisecond), and we charge
    that to the takeover. The total time from the kill is reported too.
(c) steady state: database statements per minute for the leader and for each follower,
    at N = 3 (one process per elector) and N = 50. Startup is excluded: every child is
    snapshotted after a warm-up, again after ``--steady-seconds``, and the rate is the
    difference. A window in which the leader changed is flagged and left out.

All timestamps that cross processes are CLOCK_BOOTTIME readings
(``celery_election.core.clock.boottime``). ``elected``/``revoked`` times are the elector's own
``Transition.at`` (taken when the belief changed, read from ``elector.subscribe()``), not
the time a callback happened to run. A killed or stopped process is replaced, and the
replacement has made its first election step before the next trial starts, so N stays
constant. Trials start at a random point of the leader's renew cycle.

How statements are counted
--------------------------
Each child counts statements with a SQLAlchemy ``before_cursor_execute`` listener on the
backend's engine. Transaction control (``BEGIN``, ``COMMIT``, ``ROLLBACK``) is not a
statement here: SQLite's backend sends ``BEGIN IMMEDIATE`` through the cursor while the
other drivers begin and commit implicitly, so counting it would make SQLite look twice as
chatty for the same work. Per-verb counts (including BEGIN) and committed transactions
are in the JSON. On PostgreSQL, statements the LISTEN connection sends are added when the
backend exposes an int attribute ``listener_statements``.

Every elector sees its backend through a small counting proxy that counts calls of
elect/renew/resign/register/unregister/prune/current/candidates and, while a call runs,
marks the thread as that elector's: the engine listener charges each statement to the
elector whose call issued it. What one call costs depends on the database and is in the
JSON (calls and statements per verb, per minute): e.g. a losing elect is one statement on
PostgreSQL (a CTE that also reads the row) but an UPDATE plus a SELECT on SQLite and
MariaDB, and on MariaDB (no UPDATE ... RETURNING) a winning renew also reads the row back.

N = 50 cannot be 50 processes on PostgreSQL (max_connections = 100, and each elector
process may hold a lease connection plus a LISTEN connection). So a cluster of N >
``--max-procs`` (default 5) electors runs as threads in ``--max-procs`` processes that each
share ONE backend (``engine_options`` pool_size=2, max_overflow=2) among their electors;
each elector still has its own proxy, so statements are charged to the elector that sent
them, exactly. Statements sent outside any elector call (a LISTEN connection, say) and the
process's ``listener_statements`` are charged in full to every elector of that process, as
if each had its own listener: an upper bound for a one-elector-per-process deployment.
Failover trials always use one process per elector.

Output: a table on stdout (rows: configuration x metric; columns: n, p50, p95, max, unit,
and the target where the project's issue gives one) and a JSON file (default
benchmarks/results/failover.json) with every raw sample, the settings, the elector
timings, machine info (nproc, Python, driver and database versions) and the date.

Clean-up: children run in their own sessions (Ctrl-C reaches only this process), read
commands on stdin (EOF makes them stop), and are terminated, then killed, in a finally
block. Tables are created under a unique ``table_prefix`` and dropped at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import json
import os
import random
import secrets
import signal
import sqlite3
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _root  # noqa: F401  (the repository root on sys.path: harness)
import sqlalchemy as sa
from _machine import machine_info
from failover_child import child_main

from celery_election import backend_from_url
from celery_election.core.clock import boottime
from celery_election.core.config import ElectionConfig
from harness import events as _events
from harness.events import BenchError, Child, Collector, log
from harness.stats import percentile as pct

HERE = Path(__file__).resolve().parent
DEFAULT_JSON = HERE / "results" / "failover.json"
PG_DEFAULT = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
MYSQL_DEFAULT = "mysql+pymysql://root@127.0.0.1:3306/test"
#: Each with the liveness session at its default; "<config>-lease" runs it with liveness
#: off (the lease alone), side by side in the same run.
BASE_CONFIGS = ("pg-notify", "pg-poll", "sqlite", "mariadb")
ALL_CONFIGS = (*BASE_CONFIGS, *(f"{c}-lease" for c in BASE_CONFIGS))


# =========================================================================================
# parent: clusters of children
# =========================================================================================


@dataclass
class Proc(Child):
    electors: int = 1
    cands: list[str] = field(default_factory=list)
    ready: bool = False


class Cluster(Collector[Proc]):
    """Elector processes of one configuration, and the ordered stream of their reports."""

    def __init__(self, run: BackendRun, ns: str) -> None:
        super().__init__()
        self.run = run
        self.ns = ns
        self._req = 0

    # -- processes ------------------------------------------------------------------------

    def spawn(self, electors: int = 1, hold: bool = False) -> Proc:
        self._seq += 1
        name = f"{self.ns}-p{self._seq}"
        options = [
            "--url",
            self.run.url,
            "--prefix",
            self.run.prefix,
            "--ns",
            self.ns,
            "--ttl",
            repr(self.run.ttl),
            "--electors",
            str(electors),
            "--backend-options",
            json.dumps(self.run.options),
            *(["--hold"] if hold else []),
        ]
        proc = Proc(name, self.launch(__file__, name, options), electors=electors)
        self.procs[name] = proc
        return proc

    def start(self, n: int, max_procs: int | None = None) -> None:
        """N electors: one per process, or spread as threads over ``max_procs`` processes."""
        nprocs = n if max_procs is None else min(n, max_procs)
        sizes = [n // nprocs + (1 if i < n % nprocs else 0) for i in range(nprocs)]
        started = [self.spawn(size) for size in sizes]
        for proc in started:
            self.wait_ready(proc, timeout=60)

    def wait_ready(self, proc: Proc, timeout: float) -> None:
        event = self.wait_for(
            lambda e: e["event"] == "ready" and e["proc"] == proc.name, 0, timeout
        )
        if event is None:
            raise BenchError(f"{proc.name} did not report ready within {timeout}s")
        if not event.get("ok", True):
            log(f"  warning: {proc.name} is ready but an elector had no answer yet")

    # -- reports --------------------------------------------------------------------------

    def _take(self, event: dict[str, Any]) -> None:
        super()._take(event)
        proc = self.procs.get(event["proc"])
        if event["event"] == "ready" and proc is not None:
            proc.ready = True
            proc.cands = event["cands"]

    def snapshot(self, timeout: float = 15) -> dict[str, dict[str, Any]]:
        """One statement-count snapshot from every live process."""
        self._req += 1
        req = str(self._req)
        mark = len(self.events)
        live = [p for p in self.procs.values() if p.alive]
        for proc in live:
            assert proc.popen.stdin is not None
            proc.popen.stdin.write(f"snap {req}\n")
            proc.popen.stdin.flush()
        out: dict[str, dict[str, Any]] = {}
        for proc in live:
            event = self.wait_for(
                lambda e, p=proc.name: e["event"] == "snap" and e["proc"] == p and e["req"] == req,
                mark,
                timeout,
            )
            if event is None:
                raise BenchError(f"{proc.name} did not answer a snapshot request")
            out[proc.name] = event
        return out

    def overlaps(self) -> list[str]:
        """Pairs of leadership beliefs from different electors that overlap in time."""
        return [f"{a.cand} term {a.term} and {b.cand} term {b.term}" for a, b in self.overlapping()]


# =========================================================================================
# one configuration
# =========================================================================================


@dataclass
class BackendRun:
    config: str
    url: str
    prefix: str
    ttl: float
    options: dict[str, Any]
    admin: Any = None  # the parent's own backend: install, current(), uninstall
    notes: list[str] = field(default_factory=list)


def make_admin(config: str, url: str, prefix: str) -> tuple[Any, dict[str, Any], list[str]]:
    """The parent's backend, and the options the children must use; TypeError if n/a."""
    notes: list[str] = []
    if config.endswith("-lease"):
        admin, options, notes = make_admin(config.removesuffix("-lease"), url, prefix)
        return admin, {**options, "liveness": False}, notes
    if config == "pg-notify":
        options: dict[str, Any] = {"listen": True}
        admin = backend_from_url(url, table_prefix=prefix, listen=False)  # TypeError: n/a
    elif config == "pg-poll":
        options = {"listen": False}
        try:
            admin = backend_from_url(url, table_prefix=prefix, listen=False)
        except TypeError as exc:
            options = {}
            admin = backend_from_url(url, table_prefix=prefix)
            notes.append(
                f"PostgresBackend does not accept listen= ({exc}); it has no NOTIFY "
                f"wakeups, so the default backend was run, which polls"
            )
    else:
        options = {}
        admin = backend_from_url(url, table_prefix=prefix)
    return admin, options, notes


def db_version(admin: Any) -> str:
    if admin.dialect == "sqlite":
        return f"SQLite {sqlite3.sqlite_version}"
    with admin.engine.connect() as conn:
        return str(conn.exec_driver_sql("SELECT version()").scalar())


def random_phase(run: BackendRun, cfg: ElectionConfig) -> float:
    """A random point of the leader's renew cycle (and the followers' poll cycle)."""
    return random.uniform(0.05, max(cfg.renew_interval, cfg.poll_interval))


def handoff_trial(cluster: Cluster, cfg: ElectionConfig) -> dict[str, Any]:
    proc, cand, term = cluster.single_leader(timeout=cfg.ttl * 3 + 10)
    cluster.pump(random_phase(cluster.run, cfg))
    proc, cand, term = cluster.single_leader(timeout=cfg.ttl * 3 + 10)
    mark = len(cluster.events)
    t_sig = cluster.signal(proc, signal.SIGTERM)
    new = cluster.next_elected(proc, t_sig, mark, cfg.ttl * 2 + 10)
    if new is None:
        raise BenchError(f"no new leader after SIGTERM of {cand}")
    revoked = cluster.wait_for(lambda e: e["event"] == "revoked" and e["cand"] == cand, mark, 10)
    stopped = cluster.wait_for(
        lambda e: e["event"] == "stopped" and e["proc"] == proc.name, mark, 15
    )
    proc.popen.wait(15)
    if revoked is None:
        raise BenchError(f"{cand} reported no revoke after SIGTERM")
    resign = cluster.wait_for(
        lambda e: e["event"] == "call" and e["name"] == "resign" and e["proc"] == proc.name,
        mark,
        1,
    )
    take = cluster.wait_for(
        lambda e: e["event"] == "call" and e["name"] == "elect" and e["proc"] == new["proc"],
        mark,
        1,
    )

    def since_revoke(event: dict[str, Any] | None, key: str) -> float | None:
        return None if event is None else (event[key] - revoked["at"]) * 1000

    sample = {
        "old": cand,
        "old_term": term,
        "new": new["cand"],
        "new_term": new["term"],
        "revoke_reason": revoked["reason"],
        "from_revoke_ms": (new["at"] - revoked["at"]) * 1000,
        "from_signal_ms": (new["at"] - t_sig) * 1000,
        "signal_to_revoke_ms": (revoked["at"] - t_sig) * 1000,
        # breakdown, each from the revoke: the old leader's resign statement started and
        # returned, the winner's elect was sent; and the old leader's stop() returned
        "resign_sent_ms": since_revoke(resign, "start"),
        "resign_done_ms": since_revoke(resign, "end"),
        "winning_elect_sent_ms": since_revoke(take, "start"),
        "stop_returned_ms": since_revoke(stopped, "at"),
    }
    if new["term"] <= term:
        sample["error"] = "term did not increase"
    replace(cluster, proc)
    return sample


def crash_trial(cluster: Cluster, cfg: ElectionConfig) -> dict[str, Any]:
    proc, cand, term = cluster.single_leader(timeout=cfg.ttl * 3 + 10)
    cluster.pump(random_phase(cluster.run, cfg))
    proc, cand, term = cluster.single_leader(timeout=cfg.ttl * 3 + 10)
    mark = len(cluster.events)
    t_kill = cluster.signal(proc, signal.SIGKILL)
    t_q0 = boottime()
    lease = cluster.run.admin.current(cluster.ns, timeout=5)
    t_q1 = boottime()
    proc.popen.wait(10)
    proc.ended_at = t_kill  # its belief ended with the process
    remaining = lease.remaining if lease is not None else 0.0
    new = cluster.next_elected(proc, t_kill, mark, remaining + cfg.ttl + 10)
    if new is None:
        raise BenchError(f"no new leader after SIGKILL of {cand}")
    total = new["at"] - t_kill
    sample = {
        "old": cand,
        "old_term": term,
        "new": new["cand"],
        "new_term": new["term"],
        "lease_holder_at_kill": None if lease is None else lease.leader_id,
        "lease_term_at_kill": None if lease is None else lease.term,
        "remaining_s": remaining,
        "read_lease_ms": (t_q1 - t_q0) * 1000,
        "kill_to_read_ms": (t_q0 - t_kill) * 1000,
        "total_s": total,
        "past_expiry_ms": (total - remaining) * 1000,
        # The database read its clock somewhere inside [t_q0, t_q1]: the exact value lies
        # between these two (past_expiry_ms, from the kill, is above both).
        "past_expiry_bounds_ms": [
            (new["at"] - t_q1 - remaining) * 1000,
            (new["at"] - t_q0 - remaining) * 1000,
        ],
    }
    if lease is None or lease.leader_id != cand or lease.term != term:
        sample["error"] = "the lease read after the kill was not the killed leader's"
    if new["term"] <= term:
        sample["error"] = "term did not increase"
    replace(cluster, proc)
    return sample


def replace(cluster: Cluster, old: Proc) -> None:
    new = cluster.spawn(old.electors)
    cluster.wait_ready(new, timeout=60)


def steady_window(cluster: Cluster, cfg: ElectionConfig, seconds: float) -> dict[str, Any]:
    """Statements per minute per elector between two snapshots ``seconds`` apart."""
    cluster.single_leader(timeout=cfg.ttl * 3 + 10)
    cluster.pump(max(1.0, min(cfg.renew_interval, 3.0)))  # past the first steps
    s1 = cluster.snapshot()
    cluster.pump(seconds)
    s2 = cluster.snapshot()
    electors = []
    procs = []
    for pname, b in s2.items():
        a = s1.get(pname)
        if a is None:
            continue
        dt = b["at"] - a["at"]
        per_min = 60.0 / dt
        listener = 0
        if a["listener"] is not None and b["listener"] is not None:
            listener = b["listener"] - a["listener"]
        ua, ub = a["unattributed"], b["unattributed"]
        extra = ub["stmts"] - ua["stmts"]
        procs.append(
            {
                "proc": pname,
                "electors": len(b["electors"]),
                "seconds": dt,
                "cpu_percent": 100 * (b["cpu"] - a["cpu"]) / dt,
                "listener_per_min": listener * per_min,
                "listener_counter": b["listener"] is not None,
                "listener_healthy": [a.get("listener_healthy"), b.get("listener_healthy")],
                "unattributed_per_min": extra * per_min,
                "unattributed_verbs": diff_counter(ua["verbs"], ub["verbs"], per_min),
            }
        )
        for ea, eb in zip(a["electors"], b["electors"], strict=True):
            changed = ea["elected"] != eb["elected"] or ea["revoked"] != eb["revoked"]
            if changed or ea["leader"] != eb["leader"]:
                role = "changed"
            else:
                role = "leader" if eb["leader"] else "follower"
            own = (eb["stmts"] - ea["stmts"]) * per_min
            electors.append(
                {
                    "cand": eb["cand"],
                    "proc": pname,
                    "role": role,
                    "stmts_per_min": own + (listener + extra) * per_min,
                    "own_stmts_per_min": own,
                    "tx_per_min": (eb["tx"] - ea["tx"]) * per_min,
                    "calls_per_min": diff_counter(ea["calls"], eb["calls"], per_min),
                    "verbs_per_min": diff_counter(ea["verbs"], eb["verbs"], per_min),
                }
            )
    return {"n": len(electors), "seconds": seconds, "electors": electors, "procs": procs}


def diff_counter(a: dict[str, int], b: dict[str, int], scale: float) -> dict[str, float]:
    return {k: round((b.get(k, 0) - a.get(k, 0)) * scale, 3) for k in sorted(b)}


def new_result(config: str, url: str, prefix: str, **fields: Any) -> dict[str, Any]:
    """A configuration's result as both modes start it (``fields``: the mode's own)."""
    return {
        "config": config,
        "url": sa.make_url(url).render_as_string(hide_password=True),
        "table_prefix": prefix,
        "status": "ok",
        "notes": [],
        **fields,
        "overlaps": [],
        "failures": [],
    }


def run_config(
    config: str, url: str, args: argparse.Namespace, cfg: ElectionConfig, into: list[Any]
) -> None:
    """Measure one configuration; its result is appended to ``into`` first, then filled."""
    prefix = f"fobench{os.getpid() % 100000}_{secrets.token_hex(3)}_"
    result = new_result(config, url, prefix, handoff=[], crash=[], steady={})
    into.append(result)
    try:
        admin, options, notes = make_admin(config, url, prefix)
    except TypeError as exc:
        result["status"] = "n/a"
        result["notes"].append(f"backend_from_url(..., listen=...) raised TypeError: {exc}")
        log(f"[{config}] n/a: {exc}")
        return
    except Exception as exc:  # no driver, bad URL
        result["status"] = "error"
        result["notes"].append(f"{type(exc).__name__}: {exc}")
        log(f"[{config}] error: {exc}")
        return
    result["notes"] += notes
    run = BackendRun(config, url, prefix, cfg.ttl, options, admin, result["notes"])
    clusters: list[Cluster] = []
    started = time.monotonic()
    try:
        with _events.outcome(result, config):
            result["db_version"] = db_version(admin)
            admin.install()
            log(f"[{config}] {result['db_version']}; tables {prefix}*")

            cluster = Cluster(run, "bench")
            clusters.append(cluster)
            log(f"[{config}] starting {args.n} elector processes")
            cluster.start(args.n)
            wake = [
                w for e in cluster.events if e["event"] == "ready" for w in e.get("wakeups", [])
            ]
            result["children_have_wakeups"] = wake
            if config == "pg-notify" and not all(wake):
                result["notes"].append("listen=True accepted, but subscribe_wakeups gave None")
            if args.n in args.steady_n:
                log(f"[{config}] steady state, N={args.n}, {args.steady_seconds:g}s")
                result["steady"][str(args.n)] = steady_window(cluster, cfg, args.steady_seconds)
            for kind, trial, key in (
                ("SIGTERM handoff", handoff_trial, "handoff"),
                ("SIGKILL failover", crash_trial, "crash"),
            ):
                log(f"[{config}] {args.trials} x {kind}")
                for i in range(args.trials):
                    sample = trial(cluster, cfg)
                    result[key].append(sample)
                    log(f"  {i + 1:>3}: {describe(key, sample)}")
            result["overlaps"] += cluster.overlaps()
            cluster.close()

            for n in args.steady_n:
                if n == args.n:
                    continue
                big = Cluster(run, f"bench{n}")
                clusters.append(big)
                nprocs = min(n, args.max_procs)
                log(
                    f"[{config}] steady state, N={n} ({nprocs} processes), {args.steady_seconds:g}s"
                )
                big.start(n, max_procs=args.max_procs)
                result["steady"][str(n)] = steady_window(big, cfg, args.steady_seconds)
                result["overlaps"] += big.overlaps()
                big.close()
    finally:
        for c in clusters:
            c.close()
        with contextlib.suppress(Exception):
            admin.uninstall()
        admin.close()
        result["seconds"] = round(time.monotonic() - started, 1)


def describe(key: str, s: dict[str, Any]) -> str:
    if key == "handoff":
        text = (
            f"{s['old']} -> {s['new']}: {s['from_revoke_ms']:.1f} ms after the revoke, "
            f"{s['from_signal_ms']:.1f} ms after SIGTERM"
        )
    else:
        text = (
            f"{s['old']} -> {s['new']}: {s['total_s']:.3f} s after SIGKILL, lease had "
            f"{s['remaining_s']:.3f} s left: {s['past_expiry_ms']:.1f} ms past expiry"
        )
    return text + (f"  [{s['error']}]" if "error" in s else "")


# =========================================================================================
# summary
# =========================================================================================


@dataclass
class Row:
    config: str
    metric: str
    samples: list[float]
    unit: str
    target: str = ""
    check: Callable[[float, float, float], bool] | None = None  # (p50, p95, max) -> ok

    def as_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"config": self.config, "metric": self.metric, "unit": self.unit}
        d["n"] = len(self.samples)
        if self.samples:
            d.update(p50=pct(self.samples, 0.5), p95=pct(self.samples, 0.95), max=max(self.samples))
        d["target"] = self.target
        if self.check is not None and self.samples:
            d["meets_target"] = self.check(d["p50"], d["p95"], d["max"])
        return d


def summary_rows(results: list[dict[str, Any]], cfg: ElectionConfig) -> list[Row]:
    rows: list[Row] = []
    for r in results:
        c = r["config"]
        if r["status"] != "ok" and not (r["handoff"] or r["crash"] or r["steady"]):
            rows.append(Row(c, r["status"], [], "", "; ".join(r["notes"] + r["failures"])[:60]))
            continue
        notify = c == "pg-notify"
        poll = cfg.poll_interval * (1 + cfg.jitter) * 1000
        h_target = "p50<=20 p95<=100" if notify else f"max<={poll:.0f} (1 poll)"

        def h_check(
            p50: float, p95: float, mx: float, notify: bool = notify, poll: float = poll
        ) -> bool:
            return p50 <= 20 and p95 <= 100 if notify else mx <= poll

        ok = [s for s in r["handoff"] if "error" not in s]
        rows.append(
            Row(
                c, "handoff from revoke", [s["from_revoke_ms"] for s in ok], "ms", h_target, h_check
            )
        )
        rows.append(Row(c, "handoff from SIGTERM", [s["from_signal_ms"] for s in ok], "ms"))
        ok = [s for s in r["crash"] if "error" not in s]
        rows.append(
            Row(
                c,
                "crash: past lease expiry",
                [s["past_expiry_ms"] for s in ok],
                "ms",
                "p95<=100",
                lambda p50, p95, mx: p95 <= 100,
            )
        )
        rows.append(Row(c, "crash: from SIGKILL", [s["total_s"] for s in ok], "s"))
        for n, st in r["steady"].items():
            for role, limit in (("leader", 20), ("follower", 4)):
                xs = [e["stmts_per_min"] for e in st["electors"] if e["role"] == role]
                if not notify:  # the issue sets statement targets for PostgreSQL + NOTIFY
                    rows.append(Row(c, f"{role} stmts/min N={n}", xs, "1/min"))
                    continue
                rows.append(
                    Row(
                        c,
                        f"{role} stmts/min N={n}",
                        xs,
                        "1/min",
                        f"<={limit}",
                        lambda p50, p95, mx, limit=limit: mx <= limit,
                    )
                )
    return rows


def format_table(rows: list[Row]) -> str:
    def num(x: float | None) -> str:
        if x is None:
            return "-"
        return f"{x:.0f}" if abs(x) >= 100 else f"{x:.1f}" if abs(x) >= 10 else f"{x:.2f}"

    head = (
        f"{'config':<10} {'metric':<26} {'n':>4} {'p50':>8} {'p95':>8} {'max':>8}  "
        f"{'unit':<6} target"
    )
    lines = [head, "-" * len(head)]
    last = None
    for row in rows:
        d = row.as_dict()
        if last is not None and row.config != last:
            lines.append("")
        last = row.config
        verdict = ""
        if "meets_target" in d:
            verdict = "  ok" if d["meets_target"] else "  MISSED"
        lines.append(
            f"{row.config:<10} {row.metric:<26} {d['n']:>4} {num(d.get('p50')):>8} "
            f"{num(d.get('p95')):>8} {num(d.get('max')):>8}  {row.unit:<6} {row.target}{verdict}"
        )
    return "\n".join(lines)


# =========================================================================================
# --matrix: crash failover by how the leader got its term, and how long it has led
# =========================================================================================

AFTERS = ("election", "handoff", "takeover")
MATRIX_DELAYS = (0.5, 2.0, 5.0, 15.0, 65.0)
DEFAULT_MATRIX_JSON = HERE / "results" / "failover_matrix.json"


class Aborted(BenchError):
    """Ctrl-C reached the main thread: a configuration's thread stops at its next wait."""


class Quiet:
    """Keeps process start-ups out of the other configurations' measurement windows.

    With ``--parallel`` > 1 several configurations share the machine, and starting an
    elector process costs about a second of CPU (imports), enough to delay another
    configuration's takeover by more than the 150 ms the bound allows. A measurement
    window runs from its kill (registered ahead with ``plan``) to the next ``elected``
    transition; a spawn waits (at most ``patience`` seconds, then goes ahead) while a
    window is open or a planned kill is due within ``lead`` seconds. Kills never wait:
    the delay after the election is what is measured.
    """

    def __init__(self, enabled: bool, lead: float = 3.0, patience: float = 30.0) -> None:
        self.enabled = enabled
        self.lead = lead
        self.patience = patience
        self.abort = threading.Event()
        self.waited = 0.0  # seconds spent waiting, all configurations together
        self._cond = threading.Condition()
        self._kills: dict[int, float] = {}  # token -> planned kill (boot time)
        self._open = 0
        self._token = 0

    def plan(self, at: float) -> int:
        with self._cond:
            self._token += 1
            self._kills[self._token] = at
            return self._token

    def done(self, token: int) -> None:
        with self._cond:
            self._kills.pop(token, None)
            self._cond.notify_all()

    @contextlib.contextmanager
    def window(self, token: int) -> Iterator[None]:
        with self._cond:
            self._kills.pop(token, None)
            self._open += 1
        try:
            yield
        finally:
            with self._cond:
                self._open -= 1
                self._cond.notify_all()

    def before_spawn(self) -> None:
        if not self.enabled:
            return
        t0 = time.monotonic()
        with self._cond:
            while time.monotonic() < t0 + self.patience and not self.abort.is_set():
                now = boottime()
                if not self._open and all(at - now > self.lead for at in self._kills.values()):
                    break
                self._cond.wait(0.1)
            self.waited += time.monotonic() - t0


def wait_until(cluster: Cluster, at: float, abort: threading.Event) -> None:
    """Collect reports until boot time ``at``."""
    while (left := at - boottime()) > 0:
        if abort.is_set():
            raise Aborted("interrupted")
        cluster.pump(min(left, 0.5))


def winning_call(cluster: Cluster, proc: str, mark: int) -> str | None:
    """How ``proc`` won its term: "elect" or "take_over" (the liveness lock), from its
    call report (sent when the call returns, just before the transition)."""
    call = cluster.wait_for(
        lambda e: e["event"] == "call" and e["proc"] == proc and e["name"] != "resign", mark, 1
    )
    return None if call is None else str(call["name"])


def top_up(cluster: Cluster, n: int, quiet: Quiet) -> None:
    """Start processes until ``n`` are alive, each having made its first election step."""
    missing = n - sum(1 for p in cluster.procs.values() if p.alive)
    if missing <= 0:
        return
    quiet.before_spawn()
    started = [cluster.spawn() for _ in range(missing)]
    for proc in started:
        cluster.wait_ready(proc, timeout=60)


def wait_tagged(cluster: Cluster, cand: str, term: int, timeout: float) -> float:
    """Wait until the lease row says term ``term`` is bound by the liveness lock (tagged);
    returns when, in boot time. A crash of an untagged leader waits out its lease."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lease = cluster.run.admin.current(cluster.ns, timeout=5)
        if lease is None or lease.leader_id != cand or lease.term != term:
            raise BenchError(f"{cand} lost term {term} while waiting for its tag")
        if lease.liveness_us is not None:
            return boottime()
        cluster.pump(0.1)
    raise BenchError(f"term {term} of {cand} was not tagged within {timeout:g}s")


def kill_after(
    cluster: Cluster, elected: dict[str, Any], delay: float, cfg: ElectionConfig, quiet: Quiet
) -> dict[str, Any]:
    """SIGKILL the process that reported ``elected``, ``delay`` s after its transition; the
    failover is the next ``elected`` of another process, minus the kill."""
    leader = cluster.procs[elected["proc"]]
    cand, term = elected["cand"], elected["term"]
    token = quiet.plan(elected["at"] + delay)
    try:
        wait_until(cluster, elected["at"] + delay, quiet.abort)
        cluster.drain()
        if cluster.leading.get(cand) != (leader.name, term) or not leader.alive:
            raise BenchError(f"{cand} no longer led term {term} at the planned kill")
        with quiet.window(token):
            mark = len(cluster.events)
            t_kill = cluster.signal(leader, signal.SIGKILL)
            lease = cluster.run.admin.current(cluster.ns, timeout=5)
            t_read = boottime()
            leader.popen.wait(10)
            leader.ended_at = t_kill  # its belief ended with the process
            remaining = lease.remaining if lease is not None else 0.0
            new = cluster.next_elected(leader, t_kill, mark, remaining + cfg.ttl + 10)
    finally:
        quiet.done(token)
    if new is None:
        raise BenchError(f"no new leader after SIGKILL of {cand}")
    sample: dict[str, Any] = {
        "leader": cand,
        "term": term,
        "elected_at": elected["at"],
        "kill_at": t_kill,
        "led_s": t_kill - elected["at"],  # the delay as it happened
        "failover_s": new["at"] - t_kill,
        "new": new["cand"],
        "new_term": new["term"],
        "new_via": winning_call(cluster, new["proc"], mark),
        "tagged_at_kill": None if lease is None else lease.liveness_us is not None,
        "remaining_at_kill_s": remaining,
        "kill_to_read_ms": (t_read - t_kill) * 1000,
        "lease_holder_at_kill": None if lease is None else lease.leader_id,
        "loadavg_at_kill": os.getloadavg()[0],
    }
    if lease is None or lease.leader_id != cand or lease.term != term:
        sample["error"] = "the lease read after the kill was not the killed leader's"
    if new["term"] <= term:
        sample["error"] = "term did not increase"
    return sample


def election_trial(
    cluster: Cluster, delay: float, args: argparse.Namespace, cfg: ElectionConfig, quiet: Quiet
) -> dict[str, Any]:
    """A fresh namespace: N processes are built, then all start at once; the winner of
    the vacant lease is killed ``delay`` after its election."""
    quiet.before_spawn()
    procs = [cluster.spawn(hold=True) for _ in range(args.n)]
    for proc in procs:
        held = cluster.wait_for(
            lambda e, p=proc.name: e["event"] == "held" and e["proc"] == p, 0, 60
        )
        if held is None:
            raise BenchError(f"{proc.name} was not built within 60s")
    mark = len(cluster.events)
    t_go = boottime()
    for proc in procs:
        assert proc.popen.stdin is not None
        proc.popen.stdin.write("go\n")
        proc.popen.stdin.flush()
    elected = cluster.wait_for(lambda e: e["event"] == "elected", mark, cfg.ttl * 3 + 10)
    if elected is None:
        raise BenchError("nobody won the vacant lease")
    prev = {"go_to_elected_ms": (elected["at"] - t_go) * 1000}
    return {**kill_after(cluster, elected, delay, cfg, quiet), "prev": prev}


def succession_trial(
    cluster: Cluster,
    after: str,
    delay: float,
    args: argparse.Namespace,
    cfg: ElectionConfig,
    quiet: Quiet,
) -> dict[str, Any]:
    """N + 1 processes; the leader is SIGTERMed (handoff: it resigns) or, once its term
    is tagged, SIGKILLed (takeover: the next one takes over through the liveness lock).
    That leaves N, whose new leader is killed ``delay`` after its election."""
    top_up(cluster, args.n + 1, quiet)
    proc, cand, term = cluster.single_leader(timeout=cfg.ttl * 3 + 10)
    tagged_at = None
    if after == "takeover":
        tagged_at = wait_tagged(cluster, cand, term, timeout=cfg.ttl * 2)
    cluster.pump(random_phase(cluster.run, cfg))
    proc, cand, term = cluster.single_leader(timeout=cfg.ttl * 3 + 10)
    mark = len(cluster.events)
    sig = signal.SIGTERM if after == "handoff" else signal.SIGKILL
    t_sig = cluster.signal(proc, sig)
    if sig == signal.SIGKILL:
        proc.popen.wait(10)
        proc.ended_at = t_sig
    new = cluster.next_elected(proc, t_sig, mark, cfg.ttl * 2 + 10)
    if new is None:
        raise BenchError(f"no new leader after {sig.name} of {cand}")
    prev = {
        "old": cand,
        "old_term": term,
        "signal": sig.name,
        "signal_to_elected_ms": (new["at"] - t_sig) * 1000,
        "via": winning_call(cluster, new["proc"], mark),
        "old_tagged_s_before_signal": None if tagged_at is None else t_sig - tagged_at,
    }
    sample = {**kill_after(cluster, new, delay, cfg, quiet), "prev": prev}
    if sig == signal.SIGTERM:
        proc.popen.wait(15)
    return sample


def matrix_trials(args: argparse.Namespace, delay: float) -> int:
    return int(args.long_trials if delay >= args.long_delay else args.trials)


def matrix_after(
    run: BackendRun,
    after: str,
    args: argparse.Namespace,
    cfg: ElectionConfig,
    quiet: Quiet,
    result: dict[str, Any],
) -> None:
    """Every delay's trials for one "after", interleaved (trial 1 of each delay, then
    trial 2, ...) so that a change in the machine's load spreads over all delays."""
    most = max(matrix_trials(args, d) for d in args.delays)
    plan = [(i, d) for i in range(most) for d in args.delays if i < matrix_trials(args, d)]
    label = f"[{run.config} {after}]"
    cluster: Cluster | None = None
    seq = errors = 0

    def finish(c: Cluster) -> None:
        c.close()
        result["overlaps"] += [f"{after} {c.ns}: {o}" for o in c.overlaps()]

    try:
        for i, delay in plan:
            if quiet.abort.is_set():
                raise Aborted("interrupted")
            try:
                if after == "election":
                    seq += 1
                    c = Cluster(run, f"{after}{seq}")
                    try:
                        sample = election_trial(c, delay, args, cfg, quiet)
                    finally:
                        finish(c)
                else:
                    if cluster is None:
                        seq += 1
                        cluster = Cluster(run, f"{after}{seq}")
                    sample = succession_trial(cluster, after, delay, args, cfg, quiet)
            except Aborted:
                raise
            except BenchError as exc:
                errors += 1
                result["failures"].append(f"{after} delay {delay:g} trial {i + 1}: {exc}")
                log(f"{label} delay {delay:g}s trial {i + 1} FAILED: {exc}")
                if cluster is not None:  # start over on a fresh namespace
                    finish(cluster)
                    cluster = None
                if errors > 3:
                    raise
                continue
            sample = {"after": after, "delay": delay, "trial": i + 1, **sample}
            result["samples"].append(sample)
            log(
                f"{label} delay {delay:g}s trial {i + 1}: {sample['leader']} killed after "
                f"{sample['led_s']:.3f}s (tagged: {sample['tagged_at_kill']}), "
                f"{sample['new']} elected {sample['failover_s']:.3f}s later "
                f"via {sample['new_via']}" + (f"  [{sample['error']}]" if "error" in sample else "")
            )
    finally:
        if cluster is not None:
            finish(cluster)


def matrix_config(
    config: str,
    url: str,
    args: argparse.Namespace,
    cfg: ElectionConfig,
    quiet: Quiet,
    into: list[Any],
) -> None:
    """One configuration's matrix; its result is appended to ``into`` first, then filled."""
    prefix = f"fomx{os.getpid() % 100000}_{secrets.token_hex(3)}_"
    result = new_result(config, url, prefix, samples=[])
    into.append(result)
    try:
        admin, options, notes = make_admin(config, url, prefix)
    except Exception as exc:  # no driver, bad URL, no listen=
        result["status"] = "error"
        result["notes"].append(f"{type(exc).__name__}: {exc}")
        log(f"[{config}] error: {exc}")
        return
    result["notes"] += notes
    options = {**options, "liveness": args.liveness}
    run = BackendRun(config, url, prefix, cfg.ttl, options, admin, result["notes"])
    started = time.monotonic()
    try:
        result["db_version"] = db_version(admin)
        admin.install()
        log(f"[{config}] {result['db_version']}; tables {prefix}*")
        for after in args.after:
            if quiet.abort.is_set():
                break
            with _events.outcome(result, f"{config} {after}"):
                matrix_after(run, after, args, cfg, quiet, result)
    except Exception as exc:
        result["status"] = "error"
        result["failures"].append(f"{type(exc).__name__}: {exc}")
        log(f"[{config}] FAILED: {exc!r}")
    finally:
        with contextlib.suppress(Exception):
            admin.uninstall()
        admin.close()
        result["seconds"] = round(time.monotonic() - started, 1)
        log(f"[{config}] done in {result['seconds']:.0f}s")


def matrix_bound(config: str, delta: float) -> float:
    """The issue's bound on the crash failover p95: delta + 150 ms (MariaDB: + 1.1 s)."""
    return delta + (1.1 if config.startswith("mariadb") else 0.15)


def matrix_rows(results: list[dict[str, Any]], args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    for r in results:
        bound = matrix_bound(r["config"], args.liveness)
        for after in args.after:
            for delay in args.delays:
                cell = [
                    s
                    for s in r["samples"]
                    if s["after"] == after and s["delay"] == delay and "error" not in s
                ]
                xs = [s["failover_s"] for s in cell]
                row: dict[str, Any] = {
                    "config": r["config"],
                    "after": after,
                    "delay": delay,
                    "n": len(xs),
                    "bound": bound,
                    "untagged": sum(1 for s in cell if s["tagged_at_kill"] is False),
                    "over_bound": sum(1 for x in xs if x > bound),
                    "errors": sum(
                        1 for s in r["samples"] if s["after"] == after and s["delay"] == delay
                    )
                    - len(cell),
                }
                if xs:
                    row.update(p50=pct(xs, 0.5), p95=pct(xs, 0.95), max=max(xs))
                    row["ok"] = row["p95"] <= bound
                rows.append(row)
    return rows


def format_matrix(rows: list[dict[str, Any]]) -> str:
    def num(x: float | None) -> str:
        return "-" if x is None else f"{x:.3f}"

    head = (
        f"{'config':<10} {'after':<9} {'delay':>6} {'n':>3} {'p50':>7} {'p95':>7} "
        f"{'max':>7} {'bound':>6}  {'ok':<6} {'>bound':>6} untagged"
    )
    lines = [head, "-" * len(head)]
    last = None
    for row in rows:
        if last is not None and (row["config"], row["after"]) != last:
            lines.append("")
        last = (row["config"], row["after"])
        ok = "-" if "ok" not in row else "ok" if row["ok"] else "MISSED"
        lines.append(
            f"{row['config']:<10} {row['after']:<9} {row['delay']:>5g}s {row['n']:>3} "
            f"{num(row.get('p50')):>7} {num(row.get('p95')):>7} {num(row.get('max')):>7} "
            f"{row['bound']:>6.2f}  {ok:<6} {row['over_bound']:>6} {row['untagged']:>8}"
            + (f"  ({row['errors']} with errors)" if row["errors"] else "")
        )
    return "\n".join(lines)


def matrix_main(args: argparse.Namespace) -> int:
    configs = _events.start_parent(args, args.configs, BASE_CONFIGS, "configuration")
    args.after = [a.strip() for a in args.after.split(",") if a.strip()]
    if unknown := [a for a in args.after if a not in AFTERS]:
        raise SystemExit(f"unknown --after {unknown}; choose from {', '.join(AFTERS)}")
    args.trials = 5 if args.trials is None else args.trials
    args.ttl = 10.0 if args.ttl is None else args.ttl
    cfg = ElectionConfig.create(ttl=args.ttl, liveness=args.liveness)
    json_path = args.json or DEFAULT_MATRIX_JSON
    sqlite_path = Path(args.sqlite_path or f"/tmp/celery-election-matrix-{os.getpid()}.db")
    urls = {
        "pg-notify": args.pg_url,
        "pg-poll": args.pg_url,
        "mariadb": args.mysql_url,
        "sqlite": f"sqlite:///{sqlite_path.resolve()}",
    }
    quiet = Quiet(enabled=args.parallel > 1)
    out: dict[str, Any] = {
        "benchmark": "failover --matrix",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine_info(),
        "settings": {
            "configs": configs,
            "after": args.after,
            "delays": args.delays,
            "trials": args.trials,
            "long_trials": args.long_trials,
            "long_delay": args.long_delay,
            "n": args.n,
            "ttl": args.ttl,
            "liveness": args.liveness,
            "parallel": args.parallel,
            "seed": args.seed,
            "argv": sys.argv[1:],
        },
        "elector_config": {**dataclasses.asdict(cfg), "heartbeat_interval": cfg.heartbeat_interval},
        "method": MATRIX_METHOD,
        "results": [],
    }
    log(
        f"matrix: {', '.join(configs)} x after {', '.join(args.after)} x delays "
        f"{', '.join(f'{d:g}' for d in args.delays)} s; ttl {cfg.ttl:g}s, liveness delta "
        f"{cfg.liveness}s, {args.parallel} configuration(s) at a time"
    )
    started = time.monotonic()
    interrupted = False
    results: list[dict[str, Any]] = []
    pending = list(configs)
    threads: list[threading.Thread] = []
    try:
        while pending or any(t.is_alive() for t in threads):
            while pending and sum(t.is_alive() for t in threads) < args.parallel:
                config = pending.pop(0)
                t = threading.Thread(
                    target=matrix_config,
                    args=(config, urls[config], args, cfg, quiet, results),
                    name=config,
                    daemon=True,
                )
                t.start()
                threads.append(t)
            time.sleep(0.5)
    except KeyboardInterrupt:
        interrupted = True
        quiet.abort.set()
        log("interrupted: stopping children and dropping tables; writing what was measured")
        for t in threads:
            t.join(90)
    finally:
        if args.sqlite_path is None:
            # and the liveness lock files the SQLite backend keeps next to the database
            locks = [str(p) for p in sqlite_path.parent.glob(f"{sqlite_path.name}.*.lock")]
            for name in [f"{sqlite_path}{s}" for s in ("", "-wal", "-shm", "-journal")] + locks:
                with contextlib.suppress(OSError):
                    os.unlink(name)
    results.sort(key=lambda r: configs.index(r["config"]))
    out["results"] = results
    out["interrupted"] = interrupted
    out["seconds"] = round(time.monotonic() - started, 1)
    out["spawn_wait_s"] = round(quiet.waited, 1)
    out["machine"]["loadavg_at_end"] = os.getloadavg()
    rows = matrix_rows(results, args)
    out["summary"] = rows
    print(format_matrix(rows))
    print(
        f"failover = next elected (another process) - SIGKILL, seconds; bound on p95: "
        f"delta + 0.15 s (MariaDB: + 1.1 s), delta = {cfg.liveness:g} s; >bound: samples "
        f"above it; untagged: kills that found the leader's term not yet bound by the "
        f"liveness lock on the lease row"
    )
    for r in results:
        for note in r["notes"] + r["failures"]:
            print(f"{r['config']}: {note}")
        print(f"{r['config']}: overlapping leaders: {len(r['overlaps'])}")
        for o in r["overlaps"]:
            print(f"{r['config']}:   {o}")
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(out, indent=1, default=str) + "\n")
    print(f"raw results: {json_path} ({out['seconds']:.0f}s)")
    failed = any(r["status"] == "error" or r["overlaps"] for r in results)
    return 130 if interrupted else 1 if failed else 0


MATRIX_METHOD = """\
--matrix: crash failover as a function of how the leader got its term and how long it
has led. For each configuration (liveness lock on, --liveness delta, ttl --ttl) and each
"after" (--after), for each delay D (--delays): the leader is SIGKILLed D seconds after
its own `elected` transition (Transition.at, CLOCK_BOOTTIME), and the failover is the next
`elected` transition of another process minus the kill time. N (--n, 3) elector
processes are alive at the kill.

after=election: a fresh namespace per trial; N processes are built (imports, backend)
held, then all told to start at once; the winner of the vacant lease is the leader.
after=handoff: N + 1 processes on one namespace; the leader is SIGTERMed (stop(): it
drops its belief and resigns) and the winner of the resigned lease is the leader.
after=takeover: N + 1 processes; once the leader's term is tagged on the lease row
(bound by the liveness lock) it is SIGKILLed, and the follower that takes over (normally
through the liveness lock: `new_via`/`prev.via` = take_over) is the leader.
Killed and stopped processes are replaced before the next trial (the replacement has made
its first election step). Trials of a cell are interleaved with the other delays'.
Right after each kill the lease is read: `tagged_at_kill` says whether the killed term
was bound by the liveness lock (if not, the followers wait out the lease).
"""


def int_list(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def float_list(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def parse_args(argv: Iterable[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Leader election failover and steady-state database load.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument(
        "--backends", default=",".join(ALL_CONFIGS), help="comma list of " + ", ".join(ALL_CONFIGS)
    )
    p.add_argument("--n", type=int, default=3, help="elector processes in the failover trials")
    p.add_argument("--trials", type=int, help="trials of each kind (SIGTERM, SIGKILL) [20]")
    p.add_argument("--ttl", type=float, help="lease ttl, seconds [10]")
    p.add_argument("--steady-seconds", type=float, help="steady-state window, seconds [60]")
    p.add_argument(
        "--steady-n",
        type=int_list,
        default=[3, 50],
        help="cluster sizes for the steady-state windows",
    )
    p.add_argument(
        "--max-procs",
        type=int,
        default=5,
        help="a steady-state cluster of more electors than this runs them as threads "
        "in this many processes",
    )
    p.add_argument(
        "--quick", action="store_true", help="smoke run: --trials 3 --ttl 2 --steady-seconds 5"
    )
    p.add_argument(
        "--json",
        type=Path,
        default=None,
        help=f"where to write the raw results [{DEFAULT_JSON}; --matrix: {DEFAULT_MATRIX_JSON}]",
    )
    p.add_argument("--pg-url", default=os.environ.get("CELERY_ELECTION_TEST_PG_URL", PG_DEFAULT))
    p.add_argument(
        "--mysql-url", default=os.environ.get("CELERY_ELECTION_TEST_MYSQL_URL", MYSQL_DEFAULT)
    )
    p.add_argument(
        "--sqlite-path",
        default=None,
        help="SQLite file (default: a new file in /tmp, removed at the end)",
    )
    p.add_argument("--seed", type=int, default=None, help="random seed for the trial timing")
    m = p.add_argument_group(
        "--matrix",
        "crash failover D seconds after an election, a clean handoff or a takeover "
        "(liveness lock on); --trials defaults to 5 and --ttl to 10 here",
    )
    m.add_argument("--matrix", action="store_true", help="run the matrix instead")
    m.add_argument(
        "--configs",
        default=",".join(BASE_CONFIGS),
        help="comma list of " + ", ".join(BASE_CONFIGS),
    )
    m.add_argument(
        "--after",
        default=",".join(AFTERS),
        help="how the killed leader got its term: comma list of " + ", ".join(AFTERS),
    )
    m.add_argument(
        "--delays",
        type=float_list,
        default=list(MATRIX_DELAYS),
        help="seconds from the leader's election to its SIGKILL",
    )
    m.add_argument(
        "--long-trials", type=int, default=3, help="trials per cell for delays >= --long-delay"
    )
    m.add_argument("--long-delay", type=float, default=30.0, help="see --long-trials")
    m.add_argument("--liveness", type=float, default=1.0, help="liveness delta, seconds")
    m.add_argument(
        "--parallel", type=int, default=1, help="configurations measured at the same time"
    )
    # child mode
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--url", help=argparse.SUPPRESS)
    p.add_argument("--prefix", help=argparse.SUPPRESS)
    p.add_argument("--ns", help=argparse.SUPPRESS)
    p.add_argument("--electors", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--backend-options", default="{}", help=argparse.SUPPRESS)
    p.add_argument("--hold", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.matrix:
        return args  # matrix_main fills in its own defaults
    return _events.quick_defaults(
        args, ("trials", "ttl", "steady_seconds"), (3, 2.0, 5.0), (20, 10.0, 60.0)
    )


def main(argv: Iterable[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        return child_main(args)
    if args.matrix:
        return matrix_main(args)
    args.json = args.json or DEFAULT_JSON
    configs = _events.start_parent(args, args.backends, ALL_CONFIGS, "backend")
    cfg = ElectionConfig.create(ttl=args.ttl)
    sqlite_path = Path(args.sqlite_path or f"/tmp/celery-election-failover-{os.getpid()}.db")
    urls = {
        "pg-notify": args.pg_url,
        "pg-poll": args.pg_url,
        "mariadb": args.mysql_url,
        "sqlite": f"sqlite:///{sqlite_path.resolve()}",
    }
    out: dict[str, Any] = {
        "benchmark": "failover",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine_info(),
        "settings": {
            "backends": configs,
            "n": args.n,
            "trials": args.trials,
            "ttl": args.ttl,
            "steady_seconds": args.steady_seconds,
            "steady_n": args.steady_n,
            "max_procs": args.max_procs,
            "quick": args.quick,
            "seed": args.seed,
        },
        "elector_config": {**dataclasses.asdict(cfg), "heartbeat_interval": cfg.heartbeat_interval},
        "method": __doc__,
        "results": [],
    }
    log(
        f"ttl {cfg.ttl:g}s, renew every {cfg.renew_interval:.2f}s, followers poll every "
        f"{cfg.poll_interval:.2f}s, heartbeat every {cfg.heartbeat_interval:.0f}s"
    )
    started = time.monotonic()
    interrupted = False
    try:
        for config in configs:
            run_config(config, urls[config.removesuffix("-lease")], args, cfg, out["results"])
    except KeyboardInterrupt:
        interrupted = True
        log("interrupted: children stopped, tables dropped; writing what was measured")
    finally:
        if args.sqlite_path is None:
            # and the liveness lock files the SQLite backend keeps next to the database
            locks = [str(p) for p in sqlite_path.parent.glob(f"{sqlite_path.name}.*.lock")]
            for name in [f"{sqlite_path}{s}" for s in ("", "-wal", "-shm", "-journal")] + locks:
                with contextlib.suppress(OSError):
                    os.unlink(name)
    out["interrupted"] = interrupted
    out["seconds"] = round(time.monotonic() - started, 1)
    out["machine"]["loadavg_at_end"] = os.getloadavg()
    rows = summary_rows(out["results"], cfg)
    out["summary"] = [r.as_dict() for r in rows]
    print(format_table(rows))
    for r in out["results"]:
        for note in r["notes"] + r["failures"]:
            print(f"{r['config']}: {note}")
        if r["status"] != "n/a":
            print(f"{r['config']}: overlapping leaders: {len(r['overlaps'])}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=1, default=str) + "\n")
    print(f"raw results: {args.json} ({out['seconds']:.0f}s)")
    failed = any(r["status"] == "error" or r["overlaps"] for r in out["results"])
    return 130 if interrupted else 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
