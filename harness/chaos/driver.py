"""The randomized fault driver: a seed picks faults, targets and timings; the history decides.

A run starts electors (``harness.chaos.node``), ``celery worker --election`` processes and
``celery beat`` LeaderScheduler processes, each talking to the database through its own
TCP proxy, then applies one fault at a time, heals it, waits for every role to have a
leader again, and pauses. Every process appends to one history file; the driver adds a
``fault`` record per fault. At the end, :func:`harness.checker.check` judges it.

The memory backend cannot cross processes, so its run (:class:`MemoryChaos`) puts the
electors on threads of this process and injects its faults at the backend boundary.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from celery_election import Elector
from celery_election.backends import MemoryBackend, backend_from_url
from celery_election.backends.base import Backend
from celery_election.core.clock import boottime
from celery_election.errors import BackendUnavailableError
from celery_election.history import Recorder
from harness.chaos import faults
from harness.checker import Report, check, intervals, load, run_key
from harness.processes import Proc, stop_all
from harness.proxy import Proxy

ROOT = Path(__file__).resolve().parents[2]
BACKENDS = (
    "memory",
    "sqlite",
    "pg-notify",
    "pg-poll",
    "mariadb",
    "pgbouncer-tx",
    "pgbouncer-tx-direct",
    "pgbouncer-session",
)
#: PgBouncer backends: the lease through the pooler (-direct: the liveness lock and LISTEN
#: straight to PostgreSQL through election_direct_url). conn_kill ends every server
#: session behind the pooler (and the node's direct ones).
POOLED = {"pgbouncer-tx", "pgbouncer-tx-direct", "pgbouncer-session"}

#: Faults each backend can suffer. skew: SQLite's clock *is* the host clock of whoever
#: writes, so a process with its own wall clock is not a configuration one host can have.
FAULTS: dict[str, tuple[str, ...]] = {
    "memory": ("crash", "pause", "unreachable", "resign"),
    "sqlite": ("kill", "pause", "resign", "lock", "broker"),
    "pg-notify": ("kill", "pause", "resign", "conn_kill", "restart", "unreachable",
                  "partition", "stall", "slow", "skew", "broker"),
    "pg-poll": ("kill", "pause", "resign", "conn_kill", "restart", "unreachable",
                "partition", "stall", "slow", "skew", "broker"),
    "mariadb": ("kill", "pause", "resign", "conn_kill", "restart", "unreachable",
                "partition", "stall", "slow", "skew", "broker"),
    **{backend: ("kill", "pause", "resign", "conn_kill") for backend in POOLED},
}  # fmt: skip


@dataclass
class Node:
    """One process under test, and how to start it again."""

    name: str
    role: str  # elector | worker | beat
    ns: str
    cmd: list[str]
    env: dict[str, str]
    proxy: Proxy | None = None
    proc: Proc | None = None
    #: a worker's or beat's link to the broker (the ``broker`` fault cuts them all)
    broker: Proxy | None = None


@dataclass
class Settings:
    backend: str
    seed: int
    ttl: float = 2.0
    electors: int = 3
    workers: int = 0
    beats: int = 0
    faults: tuple[str, ...] | None = None
    #: The first N bare electors run with election_eligible=False: never in any term.
    ineligible: int = 0
    #: Apply each fault kind once, in order (the test suite's bounded run), not at random.
    cycle: bool = False
    pg_url: str = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
    mysql_url: str = "mysql+pymysql://root@127.0.0.1:3306/test"
    amqp_url: str = "amqp://guest:guest@127.0.0.1:5672//"
    pgbouncer_tx_url: str = "postgresql+psycopg://postgres@127.0.0.1:6432/test"
    pgbouncer_session_url: str = "postgresql+psycopg://postgres@127.0.0.1:6433/test"
    #: The memory run's elector class (a deliberately broken one proves the checker bites).
    elector: type[Elector] = Elector


class _Driver:
    """The loop every run shares: start, step until the time is up (or, with ``cycle``,
    each fault once), stop, then judge the history.
    """

    def __init__(self, settings: Settings, workdir: Path) -> None:
        if settings.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}: got {settings.backend!r}")
        self.s = settings
        self.rng = random.Random(settings.seed)
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.history = workdir / "history.jsonl"
        self.recorder = Recorder(self.history, role="driver")
        self.faults = settings.faults or FAULTS[settings.backend]
        self.log: list[dict[str, Any]] = []
        self.steps = 0

    def next_fault(self) -> str:
        self.steps += 1
        if self.s.cycle:
            return self.faults[(self.steps - 1) % len(self.faults)]
        return self.rng.choice(self.faults)

    def setup(self) -> None:
        raise NotImplementedError

    def step(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def run(self, seconds: float, progress: Callable[[str], None] | None = None) -> Report:
        try:
            self.setup()
            end = time.monotonic() + seconds
            while self.steps < len(self.faults) if self.s.cycle else time.monotonic() < end:
                self.step()
                if progress is not None:
                    progress(json.dumps(self.log[-1]))
            if self.s.workers:
                self.drain(60.0)
        finally:
            self.close()
        return judge(self.history, settle=2 * self.s.ttl + 1, executions=self.s.workers > 0)

    def drain(self, timeout: float) -> None:
        """Before stopping: the runs sent so far executed (or ``timeout`` seconds passed).

        A worker's broker connection comes back on Celery's reconnect back-off, seconds
        after a broker fault heals: a run it has not fetched yet is late, not lost. Stopped
        sooner, the judge took one for lost (a broker fault last in the cycle). A run that
        never executes is still judged lost after the wait.
        """
        since = boottime()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            records = load([self.history])
            sent = {run_key(r) for r in records if r["k"] == "send" and r["mono"] <= since}
            if sent <= {run_key(r) for r in records if r["k"] == "ran"}:
                return
            time.sleep(0.5)


class Chaos(_Driver):
    """A randomized run over real processes; ``run(seconds)`` returns the checked Report."""

    def __init__(self, settings: Settings, workdir: Path) -> None:
        super().__init__(settings, workdir)
        tag = uuid.uuid4().hex[:6]
        self.prefix = f"chaos{tag}_"
        self.ns = f"c{tag}"
        self.url = {
            "sqlite": f"sqlite:///{workdir / 'election.db'}",
            "pg-notify": settings.pg_url,
            "pg-poll": settings.pg_url,
            "mariadb": settings.mysql_url,
            "pgbouncer-tx": settings.pgbouncer_tx_url,
            "pgbouncer-tx-direct": settings.pgbouncer_tx_url,
            "pgbouncer-session": settings.pgbouncer_session_url,
        }[settings.backend]
        self.nodes: list[Node] = []
        self.admin = backend_from_url(self.url, table_prefix=self.prefix, **self._listen(False))
        self.admin.install()

    def _listen(self, listen: bool) -> dict[str, Any]:
        return {"listen": listen} if self.s.backend.startswith("pg") else {}

    # -- processes --------------------------------------------------------------------------

    def _proxied(self) -> tuple[Proxy | None, str]:
        if self.s.backend == "sqlite" or self.s.backend in POOLED:
            return None, self.url
        return Proxy.for_url(self.url)

    def _add(self, name: str, role: str, ns: str, args: list[str], env: dict[str, str]) -> None:
        proxy, url = self._proxied()
        env = {**os.environ, "PYTHONPATH": str(ROOT), **env}
        if role == "elector":
            cmd = [sys.executable, "-m", "harness.chaos.node", url, ns, str(self.history),
                   "--ttl", str(self.s.ttl), "--prefix", self.prefix, *args]  # fmt: skip
            if self.s.backend == "pg-poll":
                cmd.append("--no-listen")
            if self.s.backend == "pgbouncer-tx-direct":  # its own proxy: conn_kill finds it
                proxy, direct = Proxy.for_url(self.s.pg_url)
                cmd += ["--direct-url", direct]
        broker = None
        if role != "elector":
            broker, env["CHAOS_BROKER"] = Proxy.for_url(self.s.amqp_url)
            env["CHAOS_ELECTION"] = url
            cmd = [sys.executable, "-m", "celery", "-A", "harness.chaos.app", *args]
        node = Node(name, role, ns, cmd, env, proxy, broker=broker)
        node.proc = Proc(name, cmd, env=env, cwd=self.workdir, log=self.workdir / f"{name}.log")
        self.nodes.append(node)

    def _start(self, node: Node, skew: float = 0.0) -> None:
        assert node.proc is not None
        node.proc.start(faults.skew_env(skew) if skew else None)

    def setup(self) -> None:
        celery_env = {
            "CHAOS_BROKER": self.s.amqp_url,
            "CHAOS_PREFIX": self.prefix,
            "CHAOS_NS": self.ns,
            "CHAOS_TTL": str(self.s.ttl),
            "CHAOS_LISTEN": "0" if self.s.backend == "pg-poll" else "1",
            "CHAOS_HISTORY": str(self.history),
        }
        for i in range(self.s.electors):
            flags = ["--ineligible"] if i < self.s.ineligible else []
            self._add(f"e{i}", "elector", self.ns + "e", flags, {})
        for i in range(self.s.workers):
            self._add(f"w{i}", "worker", self.ns, [
                "worker", "--election", "-c", "1", "-P", "prefork", "-n", f"{self.ns}w{i}@%h",
                "--without-gossip", "--without-mingle", "--loglevel", "INFO",
            ], celery_env)  # fmt: skip
        for i in range(self.s.beats):
            self._add(f"b{i}", "beat", f"{self.ns}-beat", [
                "beat", "-s", str(self.workdir / f"b{i}-schedule"), "--loglevel", "INFO",
            ], celery_env)  # fmt: skip
        if self.s.beats:
            self._every_run(celery_env)
        for node in self.nodes:
            self._start(node)
        for ns in self.namespaces():
            if not self.wait_leader(ns, 60):
                raise RuntimeError(f"no leader in {ns} a minute after start: see {self.workdir}")

    def _every_run(self, env: dict[str, str]) -> None:
        """``touch`` catches up every due time it missed (each its own run): the operable
        schedule's policy, set as an operator sets it, before any beat starts."""
        cmd = [sys.executable, "-m", "celery", "-A", "harness.chaos.app", "election",
               "schedule", "--as", "chaos", "edit", "touch", "--catch-up", "all",
               "--catch-up-max", "3600"]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(ROOT), **env, "CHAOS_ELECTION": self.url}
        done = subprocess.run(cmd, env=env, cwd=self.workdir, capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"could not set touch's catch-up policy: {done.stderr[-2000:]}")

    def _check_exits(self) -> None:
        """A process that exited without a fault is a finding: record it, start it again."""
        for node in self.nodes:
            if node.proc is not None and node.proc.returncode is not None:
                self.recorder.record("violation", message=(
                    f"{node.name} exited by itself (status {node.proc.returncode}); "
                    f"see {self.workdir / (node.name + '.log')}"
                ))  # fmt: skip
                self._start(node)

    def namespaces(self) -> list[str]:
        return sorted({n.ns for n in self.nodes})

    def close(self) -> None:
        stop_all([n.proc for n in self.nodes if n.proc is not None], grace=20)
        for node in self.nodes:
            for proxy in (node.proxy, node.broker):
                if proxy is not None:
                    proxy.close()
        if self.s.workers or self.s.beats:
            self._delete_queues()
        with contextlib.suppress(Exception):
            self.admin.uninstall()
        self.admin.close()

    def _delete_queues(self) -> None:
        from kombu.connection import Connection

        with contextlib.suppress(Exception), Connection(self.s.amqp_url) as conn:  # type: ignore[no-untyped-call]
            for q in (f"q.{self.ns}", f"election-leader.{self.ns}"):
                with contextlib.suppress(Exception):
                    conn.default_channel.queue_delete(q)

    # -- the database's view ----------------------------------------------------------------

    def leader_pid(self, ns: str) -> int | None:
        """The pid in the lease's candidate id ("...:<pid>:<token>"), or None."""
        try:
            lease = self.admin.current(ns)
        except Exception:
            return None
        if lease is None or not lease.held or not lease.leader_id:
            return None
        return int(lease.leader_id.rsplit(":", 2)[-2])

    def wait_leader(self, ns: str, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pid = self.leader_pid(ns)
            if pid is not None and any(n.proc and n.proc.pid == pid for n in self.nodes):
                return True
            time.sleep(0.05)
        return False

    # -- faults -----------------------------------------------------------------------------

    def _pick(self) -> tuple[str, Node]:
        fault = self.next_fault()
        role = self.rng.choice(sorted({n.role for n in self.nodes}))
        group = [n for n in self.nodes if n.role == role]
        leader = self.leader_pid(group[0].ns)
        target = next((n for n in group if n.proc and n.proc.pid == leader), None)
        if target is None or self.rng.random() < 0.2:
            target = self.rng.choice(group)
        return fault, target

    def step(self) -> None:
        self._check_exits()
        fault, node = self._pick()
        ttl, rng = self.s.ttl, self.rng
        assert node.proc is not None
        pid = node.proc.pid
        start = boottime()
        self.recorder.record("fault", mono=start, kind=fault, ns=node.ns, target=node.name,
                             target_pid=pid, phase="start")  # fmt: skip
        try:
            detail = self._apply(fault, node)
        except Exception as exc:  # the harness failed, not the system under test: say so
            detail = {"harness_error": repr(exc)}
            self.recorder.record("harness_error", kind=fault, message=repr(exc))
            node.proc.resume()
            if not node.proc.alive:
                self._start(node)
            for n in self.nodes:
                for proxy in (n.proxy, n.broker):
                    if proxy is not None:
                        proxy.resume()
            if self.s.backend != "sqlite":
                faults.wait_reachable(self.url, timeout=120)
        self.recorder.record("fault", kind=fault, ns=node.ns, target=node.name,
                             target_pid=pid, phase="end", **detail)  # fmt: skip
        self.log.append({"fault": fault, "target": node.name, "role": node.role, **detail})
        for ns in self.namespaces():
            if not self.wait_leader(ns, 30 * ttl):
                self.recorder.record("violation", message=(
                    f"{ns}: no leader {30 * ttl:.0f}s after healing {fault} on {node.name}"
                ))  # fmt: skip
        time.sleep(rng.uniform(0.5, 2.0) * ttl)

    def _apply(self, fault: str, node: Node) -> dict[str, Any]:
        """Inject ``fault`` on ``node``, hold it, heal it; returns what was drawn."""
        ttl, rng = self.s.ttl, self.rng
        assert node.proc is not None
        detail: dict[str, Any] = {}
        if fault == "kill":
            node.proc.kill()
            node.proc.wait()
            time.sleep(rng.uniform(0, 2) * ttl)
            self._start(node)
        elif fault == "pause":
            node.proc.pause()
            detail["seconds"] = hold = rng.uniform(1.2, 2.5) * ttl
            time.sleep(hold)
            node.proc.resume()
        elif fault == "resign":
            node.proc.signal(signal.SIGTERM)
            try:
                node.proc.wait(30)
            except subprocess.TimeoutExpired:
                node.proc.kill()
                node.proc.wait()
                detail["stuck"] = True
            self._start(node)
        elif fault == "skew":
            detail["seconds"] = skew = rng.choice((-3600.0, 3600.0))
            node.proc.kill()
            node.proc.wait()
            self._start(node, skew=skew)
        elif fault == "conn_kill" and self.s.backend in POOLED:
            detail["sessions"] = faults.kill_pooled(self.url, self.s.pg_url)
            if node.proxy is not None:  # the node's direct sessions too
                ports = node.proxy.upstream_ports()
                detail["sessions"] += faults.kill_sessions(self.s.pg_url, ports)
        elif fault == "conn_kill":
            assert node.proxy is not None
            detail["sessions"] = faults.kill_sessions(self.url, node.proxy.upstream_ports())
        elif fault == "restart":
            faults.restart_database(self.url)
        elif fault in ("unreachable", "partition"):
            proxies = [n.proxy for n in self.nodes] if fault == "unreachable" else [node.proxy]
            for p in proxies:
                assert p is not None
                p.cut(refuse_new=True)
            time.sleep(2 * ttl)
            for p in proxies:
                assert p is not None
                p.resume()
        elif fault == "broker":  # every worker's and beat's broker link, refused
            links = [n.broker for n in self.nodes if n.broker is not None]
            for link in links:
                link.cut(refuse_new=True)
            detail["seconds"] = hold = rng.uniform(1.0, 3.0) * ttl
            time.sleep(hold)
            for link in links:
                link.resume()
        elif fault == "stall":
            assert node.proxy is not None
            node.proxy.stall()
            detail["seconds"] = hold = rng.uniform(0.5, 2.0) * ttl
            time.sleep(hold)
            node.proxy.resume()
        elif fault == "slow":
            assert node.proxy is not None
            detail["delay"] = delay = rng.uniform(0.02, 0.3) * ttl
            node.proxy.slow(delay)
            time.sleep(rng.uniform(1, 3) * ttl)
            node.proxy.resume()
        elif fault == "lock":
            detail["seconds"] = hold = 2 * ttl
            with _sqlite_write_lock(self.url):
                time.sleep(hold)
        else:
            raise ValueError(f"unknown fault {fault!r}")
        return detail


def judge(history: Path, settle: float, executions: bool = False) -> Report:
    """Check one history file (plus the driver's own violation records).

    ``executions``: workers ran the beat's runs, and each is judged by its executions.
    """
    records = load([history])
    rep = check(records, tick_every={"touch": 1.0}, tick_settle=settle, executions=executions)
    rep.violations += [r["message"] for r in records if r["k"] == "violation"]
    ineligible = {r["cand"] for r in records if r["k"] == "ineligible"}
    rep.violations += [
        f"{iv.ns}: ineligible {iv.cand} believed it led term {iv.term}"
        for iv in intervals(records)
        if iv.cand in ineligible
    ]
    errors = [r for r in records if r["k"] == "harness_error"]
    rep.harness_errors = [f"{r['kind']}: {r['message']}" for r in errors]
    return rep


@contextlib.contextmanager
def _sqlite_write_lock(url: str) -> Iterator[None]:
    """Hold SQLite's write lock: every writer waits, as for a database that stopped answering."""
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    raw = engine.raw_connection()
    try:
        raw.isolation_level = None  # type: ignore[attr-defined]
        cur = raw.cursor()
        cur.execute("BEGIN EXCLUSIVE")
        yield
        cur.execute("ROLLBACK")
    finally:
        raw.close()
        engine.dispose()


# -- the memory backend: electors on threads ------------------------------------------------


class _Gate:
    """Stands between one elector and the shared MemoryBackend, to fail or hang its calls."""

    def __init__(self, inner: MemoryBackend) -> None:
        self._inner = inner
        self.mode = "open"  # open | fail | block
        self._released = threading.Event()
        self._released.set()

    def set(self, mode: str) -> None:
        self.mode = mode
        if mode == "block":
            self._released.clear()
        else:
            self._released.set()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if not callable(attr) or name.startswith("_"):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            self._released.wait()
            if self.mode == "fail":
                raise BackendUnavailableError("chaos: the backend is unreachable")
            return attr(*args, **kwargs)

        return call


class MemoryChaos(_Driver):
    """The same driver for the in-memory backend: electors are threads of this process."""

    def __init__(self, settings: Settings, workdir: Path) -> None:
        super().__init__(settings, workdir)
        self.backend = MemoryBackend(liveness=True)  # the in-process liveness lock too
        self.ns = "memory"
        self.members: list[tuple[Elector, _Gate, threading.Event]] = []
        self.dead: list[tuple[Elector, _Gate, threading.Event]] = []

    def _spawn(self, eligible: bool = True) -> tuple[Elector, _Gate, threading.Event]:
        gate = _Gate(self.backend)
        backend: Backend = gate
        elector = self.s.elector(backend, self.ns, ttl=self.s.ttl, eligible=eligible)
        recorder = Recorder(self.history, role="elector").attach(elector)
        if not eligible:
            recorder.record("ineligible", ns=self.ns, cand=elector.candidate_id)
        done = threading.Event()

        def act() -> None:
            rec = Recorder(self.history, role="elector")
            while not done.wait(0.02):
                checked = boottime()
                term = elector.term
                if term is not None:
                    rec.act(self.ns, term, checked)

        threading.Thread(target=act, daemon=True).start()
        elector.start()
        return elector, gate, done

    def leader(self) -> int | None:
        lease = self.backend.current(self.ns)
        if lease is None or not lease.held:
            return None
        return next(
            (i for i, (e, _, _) in enumerate(self.members) if e.candidate_id == lease.leader_id),
            None,
        )

    def wait_leader(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.leader() is not None:
                return True
            time.sleep(0.02)
        return False

    def step(self) -> None:
        ttl, rng = self.s.ttl, self.rng
        fault = self.next_fault()
        idx = self.leader()
        if idx is None or rng.random() < 0.2:
            idx = rng.randrange(len(self.members))
        elector, gate, done = self.members[idx]
        self.recorder.record("fault", kind=fault, ns=self.ns, target=elector.candidate_id,
                             target_pid=os.getpid(), phase="start")  # fmt: skip
        detail: dict[str, Any] = {}
        if fault == "crash":  # its calls hang forever and it stops acting: gone
            gate.set("block")
            done.set()
            self.dead.append(self.members[idx])
            time.sleep(rng.uniform(0, 2) * ttl)
            self.members[idx] = self._spawn(eligible=idx >= self.s.ineligible)
        elif fault == "pause":  # one call hangs past the lease, then returns
            gate.set("block")
            detail["seconds"] = hold = rng.uniform(1.2, 2.5) * ttl
            time.sleep(hold)
            gate.set("open")
        elif fault == "unreachable":
            for _, g, _ in self.members:
                g.set("fail")
            time.sleep(2 * ttl)
            for _, g, _ in self.members:
                g.set("open")
        elif fault == "resign":
            elector.resign(timeout=5)
        self.recorder.record("fault", kind=fault, ns=self.ns, phase="end", **detail)
        self.log.append({"fault": fault, "target": idx, **detail})
        if not self.wait_leader(30 * ttl):
            self.recorder.record("violation", message=f"no leader 30 ttl after {fault}")
        time.sleep(rng.uniform(0.5, 2.0) * ttl)

    def setup(self) -> None:
        # One pid for every elector here: faults name their target by candidate instead.
        self.members = [
            self._spawn(eligible=i >= self.s.ineligible) for i in range(self.s.electors)
        ]
        if not self.wait_leader(10):
            raise RuntimeError("no leader 10 s after start")

    def close(self) -> None:
        for elector, _, done in self.members:
            done.set()
            elector.stop(timeout=5)
        for elector, gate, _ in self.dead:  # a crashed elector never comes back
            gate.set("fail")
            elector.stop(timeout=5)


def make(settings: Settings, workdir: Path) -> Chaos | MemoryChaos:
    return (
        MemoryChaos(settings, workdir) if settings.backend == "memory" else Chaos(settings, workdir)
    )
