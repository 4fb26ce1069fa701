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
from peer_electors import child_main, scale_child_main

from celery_election import backend_from_url
from celery_election.core.clock import boottime
from celery_election.core.config import ElectionConfig
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
# scale mode: N candidates as threads in a few processes (--scale, --max-n)
# =========================================================================================

ADMIN_APP = "peers-scale-admin"  # the parent's own sessions: never counted as a candidate's
DEFAULT_SCALE_JSON = HERE / "results" / "peers_scale.json"


class NoFit(BenchError):
    """The candidates' sessions would not fit in the connections left on the server."""


def sessions_of(pids: Iterable[int], server_port: int) -> set[int]:
    """Local ports of the TCP connections of ``pids`` to ``server_port`` (from ``ss``)."""
    out = subprocess.run(
        ["ss", "-tnpH", "state", "established"], capture_output=True, text=True, check=True
    ).stdout
    wanted = {f"pid={p}," for p in pids}
    ports = set()
    for line in out.splitlines():
        fields = line.split()
        if len(fields) < 4 or not any(w in line for w in wanted):
            continue
        local, peer = fields[2], fields[3]
        if peer.rsplit(":", 1)[1] == str(server_port):
            ports.add(int(local.rsplit(":", 1)[1]))
    return ports


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of ``pid`` so far (``/proc/<pid>/stat``), or None if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def server_cpu_seconds(postmaster: int | None) -> float | None:
    """CPU time of the whole server so far: the postmaster, its live children and the
    children it has reaped (cutime + cstime), so short-lived sessions count too."""
    if postmaster is None:
        return None
    tick = os.sysconf("SC_CLK_TCK")
    try:
        fields = Path(f"/proc/{postmaster}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    total = sum(int(x) for x in fields[11:15]) / tick  # utime stime cutime cstime
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            f = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(f[1]) == postmaster:
            total += (int(f[11]) + int(f[12])) / tick
    return total


class Sessions:
    """Server sessions of a run's processes, counted in pg_stat_activity.

    A session is the run's when its client port belongs to a connection of one of the
    run's processes (``ss``): a child's own, or the proxy's (in the parent) for a child
    that goes through it. The parent's other sessions carry ``application_name``
    ADMIN_APP and are left out.
    """

    def __init__(self, pg_url: str, reserve: int) -> None:
        self.pg_url = pg_url
        url = child_url(pg_url, "advisory", None)
        self.conn = psycopg.connect(url, autocommit=True, application_name=ADMIN_APP)
        self.port = sa.make_url(pg_url).port or 5432
        row = self.conn.execute("SELECT current_setting('max_connections')::int").fetchone()
        self.max_connections = int(row[0]) if row else 100
        self.reserve = reserve
        #: the server's postmaster, if it runs on this machine (/proc shows it)
        self.postmaster: int | None = None
        row = self.conn.execute("SELECT pg_backend_pid()").fetchone()
        with contextlib.suppress(OSError, TypeError, IndexError):
            stat = Path(f"/proc/{row[0] if row else 0}/stat").read_text()
            self.postmaster = int(stat.rsplit(")", 1)[1].split()[1])
        #: the most sessions per candidate one process brought, by (kind, shared backend):
        #: how the next process's sessions are foreseen before it starts
        self.rate: dict[tuple[str, bool], float] = {}

    @property
    def fits(self) -> int:
        """What the candidates may hold of a server to themselves: max_connections - reserve."""
        return self.max_connections - self.reserve

    def reconnect(self) -> None:
        """A new session of our own (after the server restarted under the old one)."""
        with contextlib.suppress(Exception):
            self.conn.close()
        url = child_url(self.pg_url, "advisory", None)
        self.conn = psycopg.connect(url, autocommit=True, application_name=ADMIN_APP)

    def sample(self, pids: Iterable[int]) -> dict[str, Any]:
        ports = sorted(sessions_of(pids, self.port))
        rows = self.conn.execute(
            "SELECT pid, coalesce(application_name, ''), client_port = ANY(%s) "
            "AND application_name IS DISTINCT FROM %s AND pid <> pg_backend_pid(), "
            "application_name = %s OR pid = pg_backend_pid() "
            "FROM pg_stat_activity WHERE backend_type = 'client backend'",
            (ports, ADMIN_APP, ADMIN_APP),
        ).fetchall()
        ours = [(pid, app) for pid, app, mine, _admin in rows if mine]
        admin = sum(1 for *_x, a in rows if a)
        by_app: dict[str, int] = {}
        for _pid, app in ours:
            by_app[app or "-"] = by_app.get(app or "-", 0) + 1
        return {
            "at": time.monotonic(),
            "ours": len(ours),
            "by_app": by_app,
            "backend_pids": [pid for pid, _app in ours],
            "admin": admin,
            "others": len(rows) - len(ours) - admin,
            "all": len(rows),
        }

    def room(self, s: dict[str, Any]) -> int:
        """How many sessions the candidates may hold now: the server's room left after the
        other users and the parent, less the reserve, and never more than ``fits``."""
        return min(self.fits, self.max_connections - self.reserve - s["others"] - s["admin"])

    def close(self) -> None:
        self.conn.close()


class ScaleCluster(Cluster):
    """Processes of several candidate threads each; ``leading`` is keyed by candidate."""

    def __init__(
        self, kind: Kind, ns: str, proxy: Proxy | None, sessions: Sessions, shared: bool
    ) -> None:
        super().__init__(kind, ns, proxy)
        self.sessions = sessions
        self.shared = shared
        self.cands: dict[str, str] = {}  # candidate -> process name
        self.counted: list[str] = []  # the proxy's names of this cluster's candidates
        self.peak = 0

    def pids(self) -> list[int]:
        pids = [p.popen.pid for p in self.procs.values() if p.alive]
        return pids + ([os.getpid()] if self.proxy is not None else [])

    def spawn_threads(self, threads: int) -> Child:
        self._seq += 1
        name = f"{self.kind.name[:4]}-{self.ns}-p{self._seq}"
        a = self.kind.args
        cands = [f"{name}-t{i}" for i in range(threads)]
        if self.proxy is None:
            urls = [child_url(a.pg_url, self.kind.name, None)] * threads
        elif self.shared:  # one backend per process: one port per process
            urls = [child_url(a.pg_url, self.kind.name, self.proxy.add(name))] * threads
            self.counted.append(name)
        else:
            urls = [child_url(a.pg_url, self.kind.name, self.proxy.add(c)) for c in cands]
            self.counted += cands
        for c in cands:
            self.cands[c] = name
        options = [
            "--kind", self.kind.name, "--urls", ",".join(urls), "--url", urls[0],
            "--prefix", self.kind.prefix, "--ns", self.ns, "--ttl", repr(a.ttl),
            "--poll", repr(a.poll), "--ne-interval", repr(a.ne_interval),
            "--ne-timeout", repr(a.ne_timeout), "--threads", str(threads),
            "--stagger", repr(a.stagger),
        ]  # fmt: skip
        if self.shared:
            options.append("--shared-backend")
        popen = self.launch(__file__, name, options, env={**os.environ, **self.kind.env})
        proc = self.procs[name] = Child(name, popen)
        return proc

    def start_guarded(self, threads: int) -> Child:
        """Start one process and wait for all its candidates; stop it at once (NoFit) if the
        run's sessions outgrow the room left on the server."""
        before = self.sessions.sample(self.pids())
        key = (self.kind.name, self.shared)
        foreseen = before["ours"] + threads * self.sessions.rate.get(key, 0.0)
        if foreseen > self.sessions.room(before):
            raise NoFit(
                f"{before['ours']} sessions with {len(self.cands)} candidates started, "
                f"{threads} more would bring about {foreseen:.0f} (room "
                f"{self.sessions.room(before)}: max_connections {self.sessions.max_connections}"
                f" - reserve {self.sessions.reserve} - {before['others']} of other users - "
                f"{before['admin']} of this run)"
            )
        proc = self.spawn_threads(threads)
        ready = 0
        timeout = 30 + self.kind.cycle * 2 + threads * self.kind.args.stagger
        deadline = time.monotonic() + timeout
        while ready < threads:
            if time.monotonic() > deadline:
                raise BenchError(
                    f"{proc.name}: {ready}/{threads} candidates ready in {timeout:.0f}s"
                )
            self.pump(0.25)
            s = self.sessions.sample(self.pids())
            self.peak = max(self.peak, s["ours"])
            room = self.sessions.room(s)
            if s["ours"] > room:
                proc.popen.kill()
                proc.popen.wait(10)
                raise NoFit(
                    f"{s['ours']} sessions with {len(self.cands)} candidates started "
                    f"(room {room}: max_connections {self.sessions.max_connections} - reserve "
                    f"{self.sessions.reserve} - {s['others']} of other users - {s['admin']} "
                    f"of this run; before this process: {before['ours']})"
                )
            ready = sum(1 for e in self.events if e["event"] == "ready" and e["proc"] == proc.name)
            errors = [
                e for e in self.events if e["event"] == "thread_error" and e["proc"] == proc.name
            ]
            if errors:
                raise BenchError(f"{errors[0]['cand']}: {errors[0]['error']}")
            if not proc.alive:
                raise BenchError(f"{proc.name} exited with {proc.popen.returncode}")
        self.pump(0.5)  # the last candidates' sessions (a LISTEN after the first look)
        s = self.sessions.sample(self.pids())
        # A process of a few candidates on one backend says little of a large one's
        # sessions per candidate (its LISTEN and pool are shared by fewer).
        if threads >= 5 or not self.shared:
            rate = (s["ours"] - before["ours"]) / threads
            self.sessions.rate[key] = max(self.sessions.rate.get(key, 0.0), rate)
        return proc


def split(n: int, parts: int) -> list[int]:
    """``n`` candidates over at most ``parts`` processes, as evenly as possible."""
    parts = max(1, min(parts, n))
    return [n // parts + (1 if i < n % parts else 0) for i in range(parts)]


def scale_window(cl: ScaleCluster, proxy: Proxy | None, seconds: float) -> dict[str, Any]:
    """Sessions (sampled), statements (the proxy) and CPU (/proc) over one steady window."""
    _proc, leader = cl.one_leader()
    mark = len(cl.events)
    pids = [p.popen.pid for p in cl.procs.values() if p.alive]
    first = cl.sessions.sample(cl.pids())
    server_pids = first["backend_pids"]
    cpu0 = {p: cpu_seconds(p) for p in pids + server_pids}
    snap0 = proxy.snapshot() if proxy is not None else {}
    whole0 = server_cpu_seconds(cl.sessions.postmaster)
    t0 = time.monotonic()
    samples = [first]
    n_samples = max(3, int(seconds // 5))
    for i in range(1, n_samples + 1):
        cl.pump(max(0.0, t0 + seconds * i / n_samples - time.monotonic()))
        samples.append(cl.sessions.sample(cl.pids()))
    t1 = time.monotonic()
    snap1 = proxy.snapshot() if proxy is not None else {}
    cpu1 = {p: cpu_seconds(p) for p in cpu0}
    whole1 = server_cpu_seconds(cl.sessions.postmaster)
    cl.drain()
    dt = t1 - t0
    changed = sorted({e["cand"] for e in cl.events[mark:] if e["event"] in ("elected", "revoked")})
    n = len(cl.cands)

    def cpu_pct(ps: list[int]) -> float | None:
        used = [cpu1[p] - cpu0[p] for p in ps if cpu0[p] is not None and cpu1[p] is not None]  # type: ignore[operator]
        return None if not used else 100.0 * sum(used) / dt / n

    per_name: dict[str, dict[str, Any]] = {}
    for name in cl.counted:
        a, b = snap0.get(name), snap1.get(name)
        if a is None or b is None:
            continue
        per_name[name] = {
            "stmts_per_s": (b["stmts"] - a["stmts"]) / dt,
            "connects_per_s": (b["connections"] - a["connections"]) / dt,
            "notifications_per_s": (b["notifications"] - a["notifications"]) / dt,
            "verbs_per_s": {
                k: round((v - a["verbs"].get(k, 0)) / dt, 3)
                for k, v in b["verbs"].items()
                if v - a["verbs"].get(k, 0)
            },
        }
    total = sum(r["stmts_per_s"] for r in per_name.values()) if per_name else None
    leader_name = cl.cands[leader] if cl.shared else leader
    leader_rate = per_name[leader_name]["stmts_per_s"] if leader_name in per_name else None
    follower_rates = [
        r["stmts_per_s"] for k, r in per_name.items() if k != leader_name and k not in changed
    ]
    verbs: dict[str, float] = {}
    for r in per_name.values():
        for k, v in r["verbs_per_s"].items():
            verbs[k] = round(verbs.get(k, 0.0) + v, 3)
    ours = [s["ours"] for s in samples]
    by_app: dict[str, int] = {}
    for s in samples:
        for app, c in s["by_app"].items():
            by_app[app] = max(by_app.get(app, 0), c)
    return {
        "seconds": dt,
        "leader": leader,
        "changed_in_window": changed,
        "connections_mean": sum(ours) / len(ours),
        "connections_max": max(ours),
        "connections_samples": ours,
        "connections_by_app_max": by_app,
        "others_max": max(s["others"] for s in samples),
        "stmts_per_s_total": total,
        "stmts_per_s_leader": leader_rate,
        "stmts_per_s_per_follower": (
            None if cl.shared or not follower_rates else sum(follower_rates) / len(follower_rates)
        ),
        "stmts_per_s_follower_max": None
        if cl.shared or not follower_rates
        else max(follower_rates),
        "verbs_per_s": verbs,
        "connects_per_s": sum(r["connects_per_s"] for r in per_name.values()) if per_name else None,
        "notifications_per_s": sum(r["notifications_per_s"] for r in per_name.values())
        if per_name
        else None,
        "client_cpu_pct_per_candidate": cpu_pct(pids),
        "server_cpu_pct_per_candidate": cpu_pct(server_pids),
        # every session of the server, other users' too, and the short-lived ones
        "whole_server_cpu_pct": None
        if whole0 is None or whole1 is None
        else 100.0 * (whole1 - whole0) / dt,
    }


def start_scaled(
    kind: Kind, ns: str, n: int, args: argparse.Namespace, proxy: Proxy | None,
    sessions: Sessions, shared: bool, solo_leader: bool = False,
) -> ScaleCluster:  # fmt: skip
    """N candidates in at most --procs processes (the first alone when ``solo_leader``:
    it is started first and leads before the others start)."""
    cl = ScaleCluster(kind, ns, proxy, sessions, shared)
    try:
        if solo_leader:
            first = cl.start_guarded(1)
            _p, cand = cl.one_leader()
            if cl.cands[cand] != first.name:
                raise BenchError(f"the first candidate did not lead ({cand} does)")
            sizes = split(n - 1, args.procs - 1)
        else:
            sizes = split(n, args.procs)
        for t in sizes:
            cl.start_guarded(t)
    except BaseException:
        cl.close()
        raise
    return cl


def run_scale_kind(
    name: str, n: int, args: argparse.Namespace, sessions: Sessions
) -> dict[str, Any]:
    """The steady state of N candidates of one kind."""
    result: dict[str, Any] = {"kind": name, "n": n, "status": "ok", "failures": []}
    choices = [False]
    if name == "celery-election":
        choices = {"elector": [False], "process": [True], "auto": [False, True]}[args.ce_backend]
    started = time.monotonic()
    for shared in choices:
        kind = make_kind(name, args, [])
        url = sa.make_url(args.pg_url)
        proxy = Proxy(url.host or "127.0.0.1", url.port or 5432)
        cl: ScaleCluster | None = None
        result["backend"] = "per-process" if shared else "per-candidate"
        try:
            with _events.outcome(result, f"{name} N={n}", any_error=True):
                log(f"[{name}] N={n}, {result['backend']}: starting")
                cl = start_scaled(kind, f"s{n}", n, args, proxy, sessions, shared)
                result["processes"] = len(cl.procs)
                log(
                    f"[{name}] N={n}: settling {args.settle:g}s, "
                    f"then a {args.scale_seconds:g}s window"
                )
                cl.pump(args.settle)
                result["window"] = scale_window(cl, proxy, args.scale_seconds)
                result["overlaps"] = cl.overlaps()
                w = result["window"]
                log(
                    f"  connections {w['connections_mean']:.1f}/{w['connections_max']} "
                    f"{w['connections_by_app_max']}, stmts/s {w['stmts_per_s_total']}, "
                    f"cpu/cand {w['client_cpu_pct_per_candidate']}"
                )
        except KeyboardInterrupt:
            raise
        finally:
            if cl is not None:
                result["peak_sessions_at_start"] = cl.peak
                cl.close()
            proxy.close()
            drop_kind(kind)
        nofit = [f for f in result["failures"] if "sessions with" in f]
        if result["status"] == "error" and nofit and shared is not choices[-1]:
            result["no_fit_per_candidate_backend"] = nofit[-1]
            result["status"], result["failures"] = "ok", []
            continue
        break
    if result["status"] == "error" and any("sessions with" in f for f in result["failures"]):
        result["status"] = "no fit"
    result["seconds"] = round(time.monotonic() - started, 1)
    return result


def run_failover_n(n: int, args: argparse.Namespace, sessions: Sessions) -> dict[str, Any]:
    """celery-election at N: sessions held, then SIGKILL of the (solo) leader's process,
    --failover-trials times, each on a fresh cluster (per-candidate backends, or with
    ``--ce-backend auto`` per-process ones when those do not fit)."""
    choices = {"elector": [False], "process": [True], "auto": [False, True]}[args.ce_backend]
    started = time.monotonic()
    result: dict[str, Any] = {}
    nofit = ""
    for shared in choices:
        result = failover_at(n, args, sessions, shared)
        if result["status"] != "no fit" or shared is choices[-1]:
            break
        nofit = result["failures"][-1]
        log(f"  per-candidate backends do not fit ({nofit}): one backend per process")
    if len(choices) > 1 and result["backend"] == "per-process":
        result["no_fit_per_candidate_backend"] = nofit
    result["seconds"] = round(time.monotonic() - started, 1)
    return result


def failover_trial(kind: Kind, cl: ScaleCluster, args: argparse.Namespace) -> dict[str, Any]:
    """Sessions every second of --settle, then SIGKILL of the leader's process."""
    samples = []
    settled = time.monotonic() + args.settle
    while time.monotonic() < settled:
        cl.pump(1.0)
        samples.append(cl.sessions.sample(cl.pids())["ours"])
    proc, cand = cl.one_leader()
    cl.pump(random.uniform(0.05, 1.0))
    proc, cand = cl.one_leader()
    mark = len(cl.events)
    t_kill = cl.signal(proc, signal.SIGKILL)
    lease = kind.admin.current(cl.ns, timeout=5)
    proc.popen.wait(10)
    proc.ended_at = t_kill
    new = cl.next_elected(proc, t_kill, mark, kind.wait_bound)
    if new is None:
        raise BenchError(f"no new leader within {kind.wait_bound:.0f}s")
    return {
        "old": cand,
        "killed_process_candidates": sum(1 for p in cl.cands.values() if p == proc.name),
        "new": new["cand"],
        "failover_ms": (new["at"] - t_kill) * 1000,
        "lease_remaining_s": None if lease is None else lease.remaining,
        "connections": samples,
        "peak_sessions_at_start": cl.peak,
    }


def failover_at(
    n: int, args: argparse.Namespace, sessions: Sessions, shared: bool
) -> dict[str, Any]:
    name = "celery-election"
    result: dict[str, Any] = {
        "kind": name, "n": n, "status": "ok", "failures": [], "trials": [],
        "backend": "per-process" if shared else "per-candidate",
    }  # fmt: skip
    kind = make_kind(name, args, [])
    result["restarts_seen"] = 0
    try:
        with _events.outcome(result, f"failover N={n}", any_error=True):
            i = 0
            while len(result["trials"]) < args.failover_trials:
                i += 1
                before = server_started(args.pg_url)
                if sessions.conn.closed or sessions.conn.broken:
                    sessions.reconnect()
                cl: ScaleCluster | None = None
                try:
                    cl = start_scaled(kind, f"f{n}x{i}", n, args, None, sessions, shared, True)
                    sample = failover_trial(kind, cl, args)
                except (BenchError, psycopg.Error) as exc:
                    if isinstance(exc, NoFit) or server_started(args.pg_url) == before:
                        raise
                    sample = None
                finally:
                    if cl is not None:
                        result["overlaps"] = result.get("overlaps", []) + cl.overlaps()
                        cl.close()
                if sample is None or server_started(args.pg_url) != before:
                    # Other test runs on the machine restart the server: discard, redo.
                    result["restarts_seen"] += 1
                    log(f"  N={n}: the database server restarted during the trial: discarded")
                    if result["restarts_seen"] > 2 * args.failover_trials:
                        raise BenchError("the database server keeps restarting")
                    sessions.reconnect()
                    continue
                result["processes"] = len(cl.procs) if cl is not None else None
                result["trials"].append(sample)
                log(
                    f"  N={n} trial {len(result['trials'])}: {sample['failover_ms']:.0f} ms "
                    f"({sample['old']} -> {sample['new']}), sessions {sample['connections']}"
                )
    finally:
        drop_kind(kind)
    if result["status"] == "error" and any("sessions with" in f for f in result["failures"]):
        result["status"] = "no fit"
    fo = [t["failover_ms"] for t in result["trials"]]
    conns = [c for t in result["trials"] for c in t["connections"]]
    result["failover_ms"] = stats(fo)
    result["connections_max"] = max(conns) if conns else None
    return result


def scale_table(rows: list[dict[str, Any]], fits: int) -> str:
    head = (
        "| kind | N | processes | backend | connections mean / max | per candidate | "
        "stmts/s total | leader | per follower (mean / max) | new sessions/s | "
        "client CPU % per candidate | server CPU % per candidate |"
    )
    lines = [head, "|" + " --- |" * 12]

    def f(x: float | None, d: int = 2) -> str:
        return "-" if x is None else f"{x:.{d}f}"

    for r in rows:
        w = r.get("window")
        if w is None:
            why = r["status"] + (": " + r["failures"][-1] if r["failures"] else "")
            lines.append(
                f"| {r['kind']} | {r['n']} | - | {r.get('backend', '-')} | {why} |" + " |" * 6
            )
            continue
        n = r["n"]
        per_f = f(w["stmts_per_s_per_follower"], 3)
        if w["stmts_per_s_follower_max"] is not None:
            per_f += f" / {f(w['stmts_per_s_follower_max'], 3)}"
        lines.append(
            f"| {r['kind']} | {n} | {r['processes']} | {r['backend']} | "
            f"{w['connections_mean']:.1f} / {w['connections_max']} | "
            f"{w['connections_mean'] / n:.2f} | {f(w['stmts_per_s_total'])} | "
            f"{f(w['stmts_per_s_leader'])} | {per_f} | {f(w.get('connects_per_s'))} | "
            f"{f(w['client_cpu_pct_per_candidate'], 3)} | "
            f"{f(w['server_cpu_pct_per_candidate'], 3)} |"
        )
    lines.append(f"\n(connections: the candidates' sessions in pg_stat_activity; fits = {fits})")
    lines.append(
        "whole server CPU % over each window (every user's sessions, short-lived ones too): "
        + ", ".join(
            f"{r['kind']} N={r['n']}: {r['window']['whole_server_cpu_pct']:.1f}"
            for r in rows
            if r.get("window") and r["window"].get("whole_server_cpu_pct") is not None
        )
    )
    return "\n".join(lines)


def failover_table(rows: list[dict[str, Any]], args: argparse.Namespace, fits: int) -> str:
    bound = 1000 * (args.delta or 0) + 150
    lines = [
        "| N | processes | backend | connections max | fits in "
        f"{fits} | failover p50 / max ms | <= {bound:.0f} ms | status |",
        "|" + " --- |" * 8,
    ]
    for r in rows:
        fo = r["failover_ms"]
        cm = r["connections_max"]
        ok_fit = "-" if cm is None else "yes" if cm <= fits else "no"
        ok_fo = "-" if fo is None else "yes" if fo["max"] <= bound else "no"
        why = r["status"] + (": " + r["failures"][-1] if r["failures"] else "")
        times = "-" if fo is None else f"{fo['p50']:.0f} / {fo['max']:.0f}"
        conns = "-" if cm is None else str(cm)
        lines.append(
            f"| {r['n']} | {r.get('processes', '-')} | {r['backend']} | {conns} | "
            f"{ok_fit} | {times} | {ok_fo} | {why} |"
        )
    good = [
        r["n"] for r in rows
        if r["failover_ms"] and r["connections_max"] is not None
        and r["connections_max"] <= fits and r["failover_ms"]["max"] <= bound
        and r["status"] == "ok"
    ]  # fmt: skip
    lines.append(
        f"\nlargest N that fit with failover <= {bound:.0f} ms: {max(good) if good else 'none'}"
    )
    return "\n".join(lines)


def scale_main(args: argparse.Namespace) -> int:
    if args.electors == ",".join(KINDS):
        args.electors = "celery-election,advisory,tooz"
    kinds = [k.strip() for k in args.electors.split(",") if k.strip()]
    ns_list = [int(x) for x in args.scale.split(",")] if args.scale else []
    max_ns = [int(x) for x in args.max_n.split(",")] if args.max_n else []
    sessions = Sessions(args.pg_url, args.reserve)
    cfg = ElectionConfig.create(ttl=args.ttl)
    args.delta = cfg.liveness
    head = subprocess.run(
        ["git", "-C", str(HERE), "log", "-1", "--format=%h %s"], capture_output=True, text=True
    ).stdout.strip()
    out: dict[str, Any] = {
        "benchmark": "peers --scale",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "git": head,
        "machine": {**machine_info(), "versions": versions()},
        "settings": {
            "electors": kinds, "scale": ns_list, "max_n": max_ns, "procs": args.procs,
            "ttl": args.ttl, "liveness": cfg.liveness, "settle": args.settle,
            "standbys": getattr(cfg, "standbys", None),
            "scale_seconds": args.scale_seconds, "stagger": args.stagger,
            "ce_backend": args.ce_backend, "failover_trials": args.failover_trials,
            "reserve": args.reserve, "max_connections": sessions.max_connections,
            "fits": sessions.fits, "advisory_poll": args.poll,
        },
        "method": SCALE_METHOD,
        "steady": [],
        "failover": [],
    }  # fmt: skip
    started = time.monotonic()
    interrupted = False
    try:
        for n in ns_list:
            for k in kinds:
                out["steady"].append(run_scale_kind(k, n, args, sessions))
        for n in max_ns:
            log(f"[celery-election] failover at N={n}")
            out["failover"].append(run_failover_n(n, args, sessions))
    except KeyboardInterrupt:
        interrupted = True
        log("interrupted: children stopped, tables dropped; writing what was measured")
    finally:
        sessions.close()
    out["interrupted"] = interrupted
    out["seconds"] = round(time.monotonic() - started, 1)
    out["machine"]["loadavg_at_end"] = os.getloadavg()
    text = [f"# peers.py --scale ({head}; ttl {args.ttl:g}s, liveness {cfg.liveness}s)"]
    if out["steady"]:
        text += ["", scale_table(out["steady"], sessions.fits)]
    if out["failover"]:
        text += ["", failover_table(out["failover"], args, sessions.fits)]
    table = "\n".join(text)
    print(table)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=1, default=str) + "\n")
    if args.table is not None:
        args.table.write_text(table + "\n")
    print(f"raw results: {args.json} ({out['seconds']:.0f}s)")
    return 130 if interrupted else 0


SCALE_METHOD = """\
--scale N1,N2,..: for each N and each kind, N candidates run as threads in at most --procs
processes (peer_electors.scale_child_main; threads start --stagger s apart). celery-election
runs one Elector per thread, each on its own backend (per-candidate: lease pool, LISTEN,
liveness session each), or with --ce-backend process one backend shared by the process's
Electors; auto tries per-candidate first and falls back to per-process when that does not
fit. Every candidate (per-process: every process) connects through its own port of the
wire proxy, which counts statements (simple Query statements and extended-protocol Executes,
transaction control not counted). After --settle s, a --scale-seconds window: sessions
sampled every ~5 s in pg_stat_activity (the rows whose client port is a connection of the
run's processes, or of the proxy for them; the parent's own sessions are left out), statements
per second from proxy snapshots, CPU per candidate = (utime + stime of the child processes
from /proc over the window) / window / N, and the same for the server backends of the
candidates' sessions present at the window's start (short-lived sessions are missed: the
whole server's CPU over the window, every user's and reaped sessions' included, is in the
JSON and under the table). Processes start one at a time; while
they start, the sessions are sampled every 0.25 s and a process is SIGKILLed (the N is
reported "no fit") once they pass min(max_connections - reserve, max_connections - reserve
- other users' sessions - the parent's).
--max-n N1,..: celery-election only, directly (no proxy): a first candidate alone in its
process leads, then N - 1 others start in --procs - 1 processes; the sessions are sampled
every second of --settle s, then at a random point of a second the leader's process is
SIGKILLed and the failover is the next `elected` Transition.at (CLOCK_BOOTTIME) of another
candidate minus the kill time. --failover-trials fresh clusters per N. Before each process
starts, its sessions are foreseen from the most sessions per candidate a process brought so
far; it is not started when they would not fit (a process of under 5 candidates on one
backend does not count). The wire proxy also counts the sessions opened (new sessions/s).
"""


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
    p.add_argument("--threads", type=int, help=argparse.SUPPRESS)
    p.add_argument("--urls", help=argparse.SUPPRESS)
    p.add_argument("--shared-backend", action="store_true", help=argparse.SUPPRESS)
    s = p.add_argument_group("scale mode (--scale / --max-n)")
    s.add_argument("--scale", help="steady state at these N (comma list), e.g. 3,20,100")
    s.add_argument("--max-n", help="celery-election failover at these N, e.g. 100,200,500")
    s.add_argument("--procs", type=int, default=5, help="processes the N candidates share")
    s.add_argument("--settle", type=float, help="seconds after the start before measuring [15]")
    s.add_argument("--scale-seconds", type=float, help="steady window, seconds [150]")
    s.add_argument("--stagger", type=float, default=0.05, help="seconds between thread starts")
    s.add_argument(
        "--ce-backend",
        choices=("auto", "elector", "process"),
        default="auto",
        help="celery-election: a backend per candidate, per process, or per candidate "
        "when it fits (else per process)",
    )
    s.add_argument("--failover-trials", type=int, default=3, help="SIGKILLs per --max-n N")
    s.add_argument("--reserve", type=int, default=10, help="connections left to others")
    s.add_argument("--table", type=Path, help="also write the printed table here")
    args = p.parse_args(argv)
    if args.scale or args.max_n:
        # a waiting follower looks, heartbeats and renews its lock wait once a minute: the
        # window spans at least two of those rounds
        _events.quick_defaults(args, ("settle", "scale_seconds"), (5.0, 10.0), (15.0, 150.0))
        if args.json == DEFAULT_JSON:
            args.json = DEFAULT_SCALE_JSON
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
        return scale_child_main(args) if args.threads else child_main(args)
    if args.scale or args.max_n:
        _events.start_parent(args, args.electors, KINDS, "elector")
        return scale_main(args)
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
