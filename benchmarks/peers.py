"""celery-election against other PostgreSQL leader electors, side by side in one run.

    .venv/bin/python benchmarks/peers.py --quick     # smoke run: ttl 2 s, 3 trials, 10 s windows
    .venv/bin/python benchmarks/peers.py             # full run: ttl 10 s, 10 trials, 60 s windows

Three electors, each run as N (default 3) processes, one elector per process, on the same
PostgreSQL server, one after the other in the same run:

``celery-election``
    ``celery_election.Elector`` on ``backend_from_url(url, listen=True)``: a lease row
    with a ttl, followers woken by LISTEN/NOTIFY (the library's default on PostgreSQL).
``advisory``
    The usual hand-written elector: every process holds one psycopg 3 connection
    (autocommit) and runs ``SELECT pg_try_advisory_lock(key)`` every ``--poll`` seconds
    until it gets the lock; the holder leads while its session holds it, and checks its
    connection with ``SELECT 1`` every ``--poll`` seconds (a leader that cannot reach the
    database must stop leading). A clean stop is ``pg_advisory_unlock`` and closing the
    connection. There is no lease: a session that dies releases the lock when PostgreSQL
    notices it (at once when the socket closes, as after SIGKILL on loopback).
``notifelect``
    notifelect (PyPI) ``Coordinator``: a bully election over NOTIFY. Each process takes a
    number from a sequence; every ``election_interval`` each process pings, waits
    ``election_timeout`` for pongs and leads if its number is the highest that answered
    (the newest process wins). Its defaults are 20 s + 5 s; here they are scaled so that
    interval + timeout = ttl (timeout 1 s, or 0.5 s when ttl < 5), so its detection time
    is comparable with a ttl-second lease. Clean stop: leaving its ``async with``.

Measured for each, on its own cluster:

(a) clean stop: SIGTERM to the leader's process, which stops the way that library stops
    cleanly (``Elector.stop()``; unlock + close; leaving the ``Coordinator``). Reported:
    time from the moment the old leader dropped its belief to the next "I lead" report
    of another process, and from the SIGTERM.
(b) crash: SIGKILL to the leader's process; time until another process reports that it
    leads. For celery-election the parent reads the lease right after the kill and also
    reports the time past the lease's expiry (as failover.py does).
(c) steady state: statements per minute of the leader and of each follower, counted on
    the wire, the same way for all three: during the statement window each child
    connects through a small PostgreSQL protocol proxy in this process (one port per
    child) that counts what the server is asked to execute: each statement of a simple
    Query message, and each Execute of the extended protocol (named by its Parse).
    Transaction control (BEGIN/COMMIT/ROLLBACK/START/END) is not counted, as in
    failover.py; the per-verb counts and the notifications each process received are in
    the JSON. The timing trials connect directly, so the proxy adds nothing to them.

"I lead" is each process's own report, with a CLOCK_BOOTTIME timestamp (comparable across
processes): celery-election's ``Transition.at``; for advisory the moment
``pg_try_advisory_lock`` returned true; for notifelect the moment the Coordinator
assigned ``outcome.winner`` (the attribute is watched, not polled). A killed or stopped
process is replaced and the replacement has made its first election step before the next
trial. ``overlapping beliefs`` counts pairs of processes that both believed they led at
the same instant (notifelect: a new process outranks the leader at its first election,
and the old leader only learns it at its own next election).

Clean-up: children run in their own sessions, stop on SIGTERM or when stdin closes, and
are terminated, then killed, in a finally block (also on Ctrl-C / SIGTERM of the parent);
celery-election's tables and notifelect's sequence use a unique prefix and are dropped;
advisory locks go with the children's sessions.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import random
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import _root  # noqa: F401  (the repository root on sys.path: harness)
import psycopg
import sqlalchemy as sa
from _machine import machine_info
from peer_electors import child_main

from celery_election import backend_from_url
from celery_election.clock import boottime
from celery_election.config import ElectionConfig
from harness import events as _events
from harness.events import BenchError, Child, Collector, log
from harness.pgwire import Proxy
from harness.stats import percentile as pct

HERE = Path(__file__).resolve().parent
DEFAULT_JSON = HERE / "results" / "peers.json"
PG_DEFAULT = "postgresql://postgres@127.0.0.1:5432/test"
KINDS = ("celery-election", "advisory", "tooz", "notifelect")
FAULT_TRIALS = ("pause", "conn_kill")


def child_url(base: str, kind: str, port: int | None) -> str:
    """The URL a child of ``kind`` uses: the right driver name, maybe through the proxy."""
    url = sa.make_url(base).update_query_dict({"sslmode": "disable"})
    if port is not None:
        url = url.set(host="127.0.0.1", port=port)
    url = url.set(drivername="postgresql+psycopg" if kind == "celery-election" else "postgresql")
    return url.render_as_string(hide_password=False)


def server_started(base: str, timeout: float = 60.0) -> str:
    """When the PostgreSQL server started; waits (with a deadline) while it is down.

    Other test runs on the machine may restart the server. A trial or window during which
    it restarted measured the restart, not the elector: it is discarded and redone.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            with psycopg.connect(
                child_url(base, "advisory", None), autocommit=True, connect_timeout=5
            ) as c:
                row = c.execute("SELECT pg_postmaster_start_time()").fetchone()
                return str(row[0]) if row else "?"
        except psycopg.Error:
            if time.monotonic() > deadline:
                raise BenchError(f"the database did not come back within {timeout:.0f}s") from None
            time.sleep(0.2)  # the server is down: try again until the deadline


# =========================================================================================
# parent: a cluster of elector processes
# =========================================================================================


@dataclass
class Kind:
    """How to run and time one elector kind."""

    name: str
    args: argparse.Namespace
    prefix: str
    env: dict[str, str]
    admin: Any = None  # celery-election: the parent's backend, to read the lease
    cycle: float = 1.0  # the longest regular wait of the kind (detection time)

    @property
    def wait_bound(self) -> float:
        """How long any single transition may take before the run is declared failed."""
        return 3 * self.cycle + 15


class Cluster(Collector[Child]):
    """N elector processes of one kind and the ordered stream of their reports."""

    def __init__(self, kind: Kind, ns: str, proxy: Proxy | None = None) -> None:
        super().__init__(grace=10 + kind.cycle)
        self.kind = kind
        self.ns = ns
        self.proxy = proxy

    def spawn(self) -> Child:
        self._seq += 1
        name = f"{self.kind.name[:4]}-{self.ns}-p{self._seq}"
        port = self.proxy.add(name) if self.proxy is not None else None
        a = self.kind.args
        options = [
            "--kind",
            self.kind.name,
            "--url",
            child_url(a.pg_url, self.kind.name, port),
            "--prefix",
            self.kind.prefix,
            "--ns",
            self.ns,
            "--ttl",
            repr(a.ttl),
            "--poll",
            repr(a.poll),
            "--ne-interval",
            repr(a.ne_interval),
            "--ne-timeout",
            repr(a.ne_timeout),
        ]
        popen = self.launch(__file__, name, options, env={**os.environ, **self.kind.env})
        proc = self.procs[name] = Child(name, popen)
        return proc

    def start(self, n: int) -> None:
        started = [self.spawn() for _ in range(n)]
        for proc in started:
            self.wait_ready(proc)

    def wait_ready(self, proc: Child) -> None:
        timeout = 30 + self.kind.cycle * 2
        event = self.wait_for(
            lambda e: e["event"] == "ready" and e["proc"] == proc.name, 0, timeout
        )
        if event is None:
            raise BenchError(f"{proc.name} did not report ready within {timeout:.0f}s")

    def replace(self) -> None:
        self.wait_ready(self.spawn())

    def one_leader(self) -> tuple[Child, str]:
        """Wait until exactly one live process believes it leads."""
        proc, cand, _term = self.single_leader(self.kind.wait_bound + self.kind.cycle)
        return proc, cand

    def overlaps(self) -> list[dict[str, Any]]:
        """Pairs of beliefs "I lead" of different processes that overlapped in time."""
        return [
            {"a": a.cand, "b": b.cand, "seconds": min(a.end, b.end) - b.start}
            for a, b in self.overlapping()
        ]


# =========================================================================================
# trials
# =========================================================================================


def signal_leader(cl: Cluster, sig: signal.Signals) -> tuple[Child, str, int, float]:
    """At a random point of the cycle, ``sig`` to the leader's process.

    Returns the process, its candidate, the index of the first report after the signal and
    when the signal was sent.
    """
    cl.one_leader()
    cl.pump(random.uniform(0.05, min(cl.kind.cycle, 4.0)))  # a random point of the cycle
    proc, cand = cl.one_leader()
    mark = len(cl.events)
    return proc, cand, mark, cl.signal(proc, sig)


def next_leader(
    cl: Cluster, proc: Child, cand: str, sig: signal.Signals, at: float, mark: int
) -> dict[str, Any]:
    """The report of the next process that leads after ``sig`` (sent ``at``) to ``proc``."""
    bound = cl.kind.wait_bound
    new = cl.next_elected(proc, at, mark, bound)
    if new is None:
        raise BenchError(f"no new leader within {bound:.0f}s after {sig.name} of {cand}")
    return new


def handoff_trial(cl: Cluster) -> dict[str, Any]:
    """SIGTERM the leader (a clean stop); time until another process leads."""
    proc, cand, mark, t_sig = signal_leader(cl, signal.SIGTERM)
    new = next_leader(cl, proc, cand, signal.SIGTERM, t_sig, mark)
    bound = cl.kind.wait_bound
    revoked = cl.wait_for(lambda e: e["event"] == "revoked" and e["cand"] == cand, mark, 10)
    stopped = cl.wait_for(lambda e: e["event"] == "stopped" and e["proc"] == proc.name, mark, bound)
    proc.popen.wait(bound)
    if revoked is None:
        raise BenchError(f"{cand} reported no revoke after SIGTERM")
    sample = {
        "old": cand,
        "new": new["cand"],
        "from_revoke_ms": (new["at"] - revoked["at"]) * 1000,
        "from_signal_ms": (new["at"] - t_sig) * 1000,
        "stop_returned_ms": None if stopped is None else (stopped["at"] - t_sig) * 1000,
    }
    cl.replace()
    return sample


def crash_trial(cl: Cluster) -> dict[str, Any]:
    """SIGKILL the leader; time until another process leads (and past lease expiry)."""
    proc, cand, mark, t_kill = signal_leader(cl, signal.SIGKILL)
    remaining: float | None = None
    if cl.kind.admin is not None:
        lease = cl.kind.admin.current(cl.ns, timeout=5)
        remaining = lease.remaining if lease is not None else 0.0
    proc.popen.wait(10)
    proc.ended_at = t_kill  # its belief ended with the process
    new = next_leader(cl, proc, cand, signal.SIGKILL, t_kill, mark)
    total = new["at"] - t_kill
    sample: dict[str, Any] = {"old": cand, "new": new["cand"], "total_ms": total * 1000}
    if remaining is not None:
        sample["remaining_s"] = remaining
        sample["past_expiry_ms"] = (total - remaining) * 1000
    cl.replace()
    return sample


def overlap_since(cl: Cluster, t0: float) -> float:
    """Seconds, from ``t0`` on, during which two processes believed they led."""
    total = 0.0
    for a, b in cl.overlapping():
        total += max(0.0, min(a.end, b.end) - max(a.start, b.start, t0))
    return total


def client_ports(pid: int, server_port: int) -> list[int]:
    """The local ports of ``pid``'s TCP connections to ``server_port`` (from ``ss``)."""
    out = subprocess.run(
        ["ss", "-tnpH", "state", "established"], capture_output=True, text=True, check=True
    ).stdout
    ports = []
    for line in out.splitlines():
        fields = line.split()
        if f"pid={pid}," not in line or len(fields) < 4:
            continue
        local, peer = fields[2], fields[3]
        if peer.rsplit(":", 1)[1] == str(server_port):
            ports.append(int(local.rsplit(":", 1)[1]))
    return ports


def fault_trial(cl: Cluster, fault: str) -> dict[str, Any]:
    """``pause`` (SIGSTOP for --pause-seconds, then SIGCONT) or ``conn_kill`` (the server
    ends every session of the leader's process, which lives on): when another process
    leads (if one does within the window), and how long two believed they led."""
    window = cl.kind.args.pause_seconds
    cl.one_leader()
    cl.pump(random.uniform(0.05, min(cl.kind.cycle, 4.0)))
    proc, cand = cl.one_leader()
    mark = len(cl.events)
    cl.drain()
    at = boottime()
    sample: dict[str, Any] = {"old": cand}
    if fault == "pause":
        proc.popen.send_signal(signal.SIGSTOP)
    else:
        url = sa.make_url(cl.kind.args.pg_url)
        ports = client_ports(proc.popen.pid, url.port or 5432)
        with psycopg.connect(child_url(cl.kind.args.pg_url, "advisory", None)) as c:
            c.autocommit = True
            row = c.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE client_port = ANY(%s)",
                (ports,),
            ).fetchone()
        sample["sessions_killed"] = row[0] if row else 0
    new = cl.next_elected(proc, at, mark, window)
    if fault == "pause":
        cl.pump(max(0.0, at + window - boottime()))
        proc.popen.send_signal(signal.SIGCONT)
    cl.pump(2.0 + cl.kind.cycle / 2)  # the old leader finds out (or does not)
    sample["new"] = None if new is None else new["cand"]
    sample["failover_ms"] = None if new is None else (new["at"] - at) * 1000
    sample["overlap_s"] = overlap_since(cl, at)
    sample["old_still_leads"] = cand in cl.leading
    return sample


def steady_window(cl: Cluster, proxy: Proxy, seconds: float) -> dict[str, Any]:
    """Statements per minute per process between two proxy snapshots."""
    cl.one_leader()
    cl.pump(3.0)  # past the first steps
    cl.one_leader()
    mark = len(cl.events)
    t1, s1 = time.monotonic(), proxy.snapshot()
    cl.pump(seconds)
    t2, s2 = time.monotonic(), proxy.snapshot()
    cl.drain()
    changed = {e["cand"] for e in cl.events[mark:] if e["event"] in ("elected", "revoked")}
    per_min = 60.0 / (t2 - t1)
    rows = []
    for name, b in s2.items():
        a = s1.get(name)
        # The proxy outlives a cluster redone after a restart: skip the old one's children.
        if a is None or name not in cl.procs or not cl.procs[name].alive:
            continue
        role = "changed" if name in changed else "leader" if name in cl.leading else "follower"
        verbs = {k: round((v - a["verbs"].get(k, 0)) * per_min, 2) for k, v in b["verbs"].items()}
        rows.append(
            {
                "proc": name,
                "role": role,
                "stmts_per_min": (b["stmts"] - a["stmts"]) * per_min,
                "verbs_per_min": verbs,
                "notifications_per_min": (b["notifications"] - a["notifications"]) * per_min,
                "connections": b["connections"],
                "unparsed_connections": b["opaque"],
            }
        )
    return {"seconds": t2 - t1, "processes": rows}


# =========================================================================================
# one kind
# =========================================================================================


def make_kind(name: str, args: argparse.Namespace, notes: list[str]) -> Kind:
    prefix = f"peers{os.getpid() % 100000}_{secrets.token_hex(3)}_"
    kind = Kind(name, args, prefix, env={"LOGLEVEL": "WARNING"})
    if name == "celery-election":
        cfg = ElectionConfig.create(ttl=args.ttl)
        kind.cycle = cfg.ttl
        kind.admin = backend_from_url(child_url(args.pg_url, name, None), table_prefix=prefix)
        kind.admin.install()
    elif name in ("advisory", "tooz"):
        kind.cycle = args.poll
    else:
        kind.cycle = args.ne_interval + args.ne_timeout
        kind.env["NOTIFELECT_PREFIX"] = prefix
        with psycopg.connect(child_url(args.pg_url, "advisory", None), autocommit=True) as c:
            c.execute(f"CREATE SEQUENCE {prefix}seq_notifelect START 1".encode())
    return kind


def drop_kind(kind: Kind) -> None:
    """Drop what the kind created (tables, sequence); advisory locks end with sessions."""
    if kind.admin is not None:
        with contextlib.suppress(Exception):
            kind.admin.uninstall()
        kind.admin.close()
    if kind.name == "notifelect":
        with psycopg.connect(child_url(kind.args.pg_url, "advisory", None), autocommit=True) as c:
            c.execute(f"DROP SEQUENCE IF EXISTS {kind.prefix}seq_notifelect".encode())


def run_kind(name: str, args: argparse.Namespace, into: list[dict[str, Any]]) -> None:
    """Measure one elector kind; its result is appended to ``into`` first, then filled."""
    result: dict[str, Any] = {
        "kind": name,
        "status": "ok",
        "notes": [],
        "handoff": [],
        "crash": [],
        "steady": None,
        "overlaps": [],
        "failures": [],
        "restarts_seen": 0,
    }
    into.append(result)
    started = time.monotonic()
    clusters: list[Cluster] = []
    proxy: Proxy | None = None
    kind: Kind | None = None
    try:
        # any_error: a missing peer library, say, fails this kind; the other kinds still run
        with _events.outcome(result, name, any_error=True):
            kind = make_kind(name, args, result["notes"])
            result["prefix"] = kind.prefix
            result["cycle_s"] = kind.cycle
            url = sa.make_url(args.pg_url)
            proxy = Proxy(url.host or "127.0.0.1", url.port or 5432)

            log(f"[{name}] steady state, N={args.n}, {args.steady_seconds:g}s (through the proxy)")
            for attempt in range(4):
                before = server_started(args.pg_url)
                counted = Cluster(kind, f"steady{attempt}", proxy)
                clusters.append(counted)
                try:
                    counted.start(args.n)
                    steady = steady_window(counted, proxy, args.steady_seconds)
                except BenchError:
                    if server_started(args.pg_url) == before:
                        raise
                    steady = None
                disturbed = server_started(args.pg_url) != before
                counted.close()
                if disturbed or steady is None:
                    result["restarts_seen"] += 1
                    log("  the database server restarted during the window: measuring again")
                    continue
                result["steady"] = steady
                collect_notes(counted, result)
                result["overlaps"] += counted.overlaps()
                break
            for row in result["steady"]["processes"] if result["steady"] else []:
                log(f"  {row['proc']:<22} {row['role']:<9} {row['stmts_per_min']:6.1f} stmts/min")

            log(f"[{name}] starting {args.n} elector processes")
            cl = start_cluster(kind, "trials", args, result, clusters)
            restarts = 0
            for label, trial, key in (
                ("clean stop (SIGTERM)", handoff_trial, "handoff"),
                ("crash (SIGKILL)", crash_trial, "crash"),
            ):
                log(f"[{name}] {args.trials} x {label}")
                i = 0
                while len(result[key]) + result.get(f"{key}_failed", 0) < args.trials:
                    i += 1
                    before = server_started(args.pg_url)
                    error: BenchError | None = None
                    try:
                        sample = trial(cl)
                    except BenchError as exc:
                        error = exc
                    if server_started(args.pg_url) != before:
                        # Sessions were cut under the cluster: discard the trial, start afresh.
                        result["restarts_seen"] += 1
                        log(f"  {i:>3}: the database server restarted during the trial: discarded")
                        if result["restarts_seen"] > 4 * args.trials:
                            raise BenchError("the database server keeps restarting")
                    elif error is not None:
                        # One failed trial (no new leader in time) is a result, not the end of
                        # the run: record it, start a fresh cluster, go on (at most twice).
                        result["failures"].append(f"{key} trial {i}: {error}")
                        result[f"{key}_failed"] = result.get(f"{key}_failed", 0) + 1
                        log(f"  {i:>3}: FAILED: {error}")
                        restarts += 1
                        if restarts > 2:
                            raise error
                    else:
                        result[key].append(sample)
                        log(f"  {i:>3}: {describe(key, sample)}")
                        continue
                    collect_notes(cl, result)
                    result["overlaps"] += cl.overlaps()
                    cl.close()
                    cl = start_cluster(kind, f"trials{i}", args, result, clusters)
            cl.drain()
            collect_notes(cl, result)
            result["overlaps"] += cl.overlaps()
            cl.close()
            for fault in FAULT_TRIALS:
                log(f"[{name}] {args.fault_trials} x {fault}")
                result[fault] = []
                for i in range(1, args.fault_trials + 1):
                    # A fresh cluster each time: a fault may leave two leaders behind.
                    cl = start_cluster(kind, f"{fault}{i}", args, result, clusters)
                    try:
                        sample = fault_trial(cl, fault)
                    except BenchError as exc:
                        result["failures"].append(f"{fault} trial {i}: {exc}")
                        log(f"  {i:>3}: FAILED: {exc}")
                        continue
                    finally:
                        collect_notes(cl, result)
                        result["overlaps"] += cl.overlaps()
                        cl.close()
                    result[fault].append(sample)
                    log(f"  {i:>3}: {describe(fault, sample)}")
    finally:
        for c in clusters:
            c.close()
        if proxy is not None:
            proxy.close()
        if kind is not None:
            drop_kind(kind)
        result["seconds"] = round(time.monotonic() - started, 1)


def start_cluster(
    kind: Kind, ns: str, args: argparse.Namespace, result: dict[str, Any], into: list[Cluster]
) -> Cluster:
    """N processes that all started while the server stayed up (a restart: start again)."""
    for attempt in range(4):
        before = server_started(args.pg_url)
        cl = Cluster(kind, f"{ns}-{attempt}")
        into.append(cl)
        try:
            cl.start(args.n)
        except BenchError:
            if server_started(args.pg_url) == before:
                raise
        if server_started(args.pg_url) == before:
            return cl
        result["restarts_seen"] += 1
        log("  the database server restarted while the cluster started: starting again")
        cl.close()
    raise BenchError("the database server keeps restarting")


def collect_notes(cl: Cluster, result: dict[str, Any]) -> None:
    """Sessions the server ended under a child (the benchmark never does that itself)."""
    cl.drain()
    for e in cl.events:
        if e["event"] == "conn_lost":
            result["notes"].append(f"{e['cand']}: its database session was ended by the server")


def describe(key: str, s: dict[str, Any]) -> str:
    if key in ("pause", "conn_kill"):
        after = "none in the window" if s["new"] is None else f"{s['failover_ms']:.0f} ms"
        return (
            f"{s['old']}: new leader {after}; two believed they led for "
            f"{s['overlap_s']:.2f} s; old one still leads: {s['old_still_leads']}"
        )
    if key == "handoff":
        return (
            f"{s['old']} -> {s['new']}: {s['from_revoke_ms']:.1f} ms after the old leader "
            f"stopped leading, {s['from_signal_ms']:.1f} ms after SIGTERM"
        )
    text = f"{s['old']} -> {s['new']}: {s['total_ms']:.1f} ms after SIGKILL"
    if "past_expiry_ms" in s:
        text += f", lease had {s['remaining_s']:.3f} s left: {s['past_expiry_ms']:.1f} ms past"
    return text


# =========================================================================================
# summary
# =========================================================================================


def stats(xs: list[float]) -> dict[str, float] | None:
    if not xs:
        return None
    return {"n": len(xs), "p50": pct(xs, 0.5), "p95": pct(xs, 0.95), "max": max(xs)}


def summarize(r: dict[str, Any]) -> dict[str, Any]:
    steady = r["steady"]["processes"] if r["steady"] else []
    leader = [p["stmts_per_min"] for p in steady if p["role"] == "leader"]
    followers = [p["stmts_per_min"] for p in steady if p["role"] == "follower"]
    return {
        "kind": r["kind"],
        "status": r["status"],
        "clean_stop_ms": stats([s["from_revoke_ms"] for s in r["handoff"]]),
        "clean_stop_from_sigterm_ms": stats([s["from_signal_ms"] for s in r["handoff"]]),
        "crash_ms": stats([s["total_ms"] for s in r["crash"]]),
        "crash_past_expiry_ms": stats(
            [s["past_expiry_ms"] for s in r["crash"] if "past_expiry_ms" in s]
        ),
        "leader_stmts_per_min": leader,
        "follower_stmts_per_min": followers,
        "notifications_per_min": [p["notifications_per_min"] for p in steady],
        "failed_trials": r.get("handoff_failed", 0) + r.get("crash_failed", 0),
        "discarded_for_server_restart": r.get("restarts_seen", 0),
        **{
            f"{f}_ms": stats([s["failover_ms"] for s in r.get(f, []) if s["new"] is not None])
            for f in FAULT_TRIALS
        },
        **{f"{f}_none": sum(s["new"] is None for s in r.get(f, [])) for f in FAULT_TRIALS},
        **{
            f"{f}_overlap_s": max((s["overlap_s"] for s in r.get(f, [])), default=None)
            for f in FAULT_TRIALS
        },
        "overlapping_beliefs": len(r["overlaps"]),
        "overlap_seconds_max": max((o["seconds"] for o in r["overlaps"]), default=0.0),
    }


def num(x: float) -> str:
    return f"{x:.0f}" if abs(x) >= 100 else f"{x:.1f}" if abs(x) >= 1 else f"{x:.2f}"


def triple(s: dict[str, float] | None, unit: str) -> str:
    if s is None:
        return "-"
    return f"{num(s['p50'])} / {num(s['p95'])} / {num(s['max'])} {unit}"


def rates(xs: list[float]) -> str:
    if not xs:
        return "-"
    lo, hi = min(xs), max(xs)
    return num(lo) if round(lo) == round(hi) else f"{num(lo)}-{num(hi)}"


def format_table(summaries: list[dict[str, Any]], args: argparse.Namespace) -> str:
    head = (
        "| elector | clean stop -> new leader p50 / p95 / max | crash (SIGKILL) -> new leader "
        "p50 / p95 / max | crash: past lease expiry p50 / p95 / max | pause -> new leader "
        "p50 / p95 / max | killed connection -> new leader p50 / p95 / max | seconds two "
        "believed they led (pause / killed connection, max) | stmts/min leader / "
        "followers | notifications received/min | overlapping beliefs |"
    )
    lines = [head, "|" + " --- |" * 10]
    for s in summaries:
        if s["status"] != "ok" and s["clean_stop_ms"] is None:
            lines.append(f"| {s['kind']} | {s['status']} |" + " |" * 8)
            continue
        overl = str(s["overlapping_beliefs"])
        if s["overlapping_beliefs"]:
            overl += f" (longest {s['overlap_seconds_max']:.1f} s)"
        label = s["kind"]
        if s["failed_trials"]:
            label += f" ({s['failed_trials']} trials without a new leader)"
        faults = []
        for f in FAULT_TRIALS:
            text = triple(s[f"{f}_ms"], "ms")
            if s[f"{f}_none"]:
                text += f" ({s[f'{f}_none']} with none in {args.pause_seconds:g} s)"
            faults.append(text)
        both = [s[f"{f}_overlap_s"] for f in FAULT_TRIALS]
        believed = " / ".join("-" if x is None else f"{x:.2f} s" for x in both)
        lines.append(
            f"| {label} | {triple(s['clean_stop_ms'], 'ms')} | {triple(s['crash_ms'], 'ms')} "
            f"| {triple(s['crash_past_expiry_ms'], 'ms')} | {faults[0]} | {faults[1]} | "
            f"{believed} | "
            f"{rates(s['leader_stmts_per_min'])} / {rates(s['follower_stmts_per_min'])} | "
            f"{rates(s['notifications_per_min'])} | {overl} |"
        )
    return "\n".join(lines)


def versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for dist in ("celery-election", "notifelect", "asyncpg", "psycopg"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out


def parse_args(argv: Iterable[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="celery-election against other PostgreSQL electors, side by side.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--electors", default=",".join(KINDS), help="comma list of " + ", ".join(KINDS))
    p.add_argument("--n", type=int, default=3, help="elector processes per cluster")
    p.add_argument("--trials", type=int, help="trials of each kind (SIGTERM, SIGKILL) [10]")
    p.add_argument("--ttl", type=float, help="celery-election lease ttl, seconds [10]")
    p.add_argument("--steady-seconds", type=float, help="statement-count window, seconds [60]")
    p.add_argument("--poll", type=float, default=1.0, help="advisory: lock poll / liveness check")
    p.add_argument(
        "--fault-trials", type=int, default=3, help="trials of pause and of killed connection"
    )
    p.add_argument(
        "--pause-seconds",
        type=float,
        default=5.0,
        help="how long a paused leader stays stopped, and the window to see a new leader",
    )
    p.add_argument(
        "--ne-timeout", type=float, help="notifelect election_timeout [1, or 0.5 if ttl < 5]"
    )
    p.add_argument("--ne-interval", type=float, help="notifelect election_interval [ttl - timeout]")
    p.add_argument(
        "--quick", action="store_true", help="smoke run: --trials 3 --ttl 2 --steady-seconds 10"
    )
    p.add_argument("--json", type=Path, default=DEFAULT_JSON, help="where to write the results")
    p.add_argument("--pg-url", default=os.environ.get("CELERY_ELECTION_TEST_PG_URL", PG_DEFAULT))
    p.add_argument("--seed", type=int, default=None, help="random seed for the trial timing")
    # child mode
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--kind", help=argparse.SUPPRESS)
    p.add_argument("--url", help=argparse.SUPPRESS)
    p.add_argument("--prefix", help=argparse.SUPPRESS)
    p.add_argument("--ns", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    _events.quick_defaults(
        args, ("trials", "ttl", "steady_seconds"), (3, 2.0, 10.0), (10, 10.0, 60.0)
    )
    if args.ne_timeout is None:
        args.ne_timeout = 1.0 if args.ttl >= 5 else 0.5
    if args.ne_interval is None:
        args.ne_interval = max(0.5, args.ttl - args.ne_timeout)
    return args


def main(argv: Iterable[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        return child_main(args)
    kinds = _events.start_parent(args, args.electors, KINDS, "elector")
    with psycopg.connect(child_url(args.pg_url, "advisory", None)) as c:
        row = c.execute("SELECT version()").fetchone()
        db_version = str(row[0]) if row else "?"
    cfg = ElectionConfig.create(ttl=args.ttl)
    out: dict[str, Any] = {
        "benchmark": "peers",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {**machine_info(), "versions": versions(), "database": db_version},
        "settings": {
            "electors": kinds,
            "n": args.n,
            "trials": args.trials,
            "ttl": args.ttl,
            "steady_seconds": args.steady_seconds,
            "advisory_poll": args.poll,
            "notifelect_election_interval": args.ne_interval,
            "notifelect_election_timeout": args.ne_timeout,
            "celery_election_renew_interval": cfg.renew_interval,
            "celery_election_poll_interval": cfg.poll_interval,
            "quick": args.quick,
            "seed": args.seed,
        },
        "method": __doc__,
        "results": [],
    }
    log(
        f"{db_version.split(',')[0]}; ttl {args.ttl:g}s, advisory poll {args.poll:g}s, "
        f"notifelect interval {args.ne_interval:g}s + timeout {args.ne_timeout:g}s"
    )
    started = time.monotonic()
    interrupted = False
    try:
        for k in kinds:
            run_kind(k, args, out["results"])
    except KeyboardInterrupt:
        interrupted = True
        log("interrupted: children stopped, tables dropped; writing what was measured")
    out["interrupted"] = interrupted
    out["seconds"] = round(time.monotonic() - started, 1)
    out["machine"]["loadavg_at_end"] = os.getloadavg()
    out["summary"] = [summarize(r) for r in out["results"]]
    print(format_table(out["summary"], args))
    for r in out["results"]:
        for note in r["notes"] + r["failures"]:
            print(f"{r['kind']}: {note}")
        if r.get("restarts_seen"):
            print(
                f"{r['kind']}: {r['restarts_seen']} trials/windows discarded and redone: the "
                f"database server was restarted by something else while they ran"
            )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=1, default=str) + "\n")
    print(f"raw results: {args.json} ({out['seconds']:.0f}s)")
    ours = [r for r in out["results"] if r["kind"] == "celery-election"]
    failed = any(r["status"] == "error" for r in out["results"]) or any(r["overlaps"] for r in ours)
    return 130 if interrupted else 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
