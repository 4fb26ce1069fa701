"""Real ``celery worker`` subprocesses around tests/e2e/proj.py, observed through the database.

Every wait here waits for something observable (a lease row, a recorded run, a process
exit) with a deadline; nothing sleeps and hopes.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import sqlalchemy as sa
from celery import Celery
from celery.result import AsyncResult

from celery_election.backends import SQLBackend, backend_from_url
from celery_election.backends.locks import MAX_SLOTS, lock_key, slot_key
from celery_election.backends.schema import db_now_us
from celery_election.core.lease import Lease
from celery_election.integration.app import leader_queue_name
from harness.e2e_tables import e2e_tables
from harness.processes import Proc, stop_all

ROOT = Path(__file__).resolve().parents[1]
T = TypeVar("T")


def wait_until(check: Callable[[], T | None], timeout: float, what: str, every: float = 0.05) -> T:
    """Poll ``check`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(every)


def tail_logs(folder: Path, chars: int = 3000) -> str:
    """The end of every ``*.log`` in ``folder``: what a failed test prints."""
    return "\n".join(
        f"--- {p.name}\n{p.read_text(errors='replace')[-chars:]}"
        for p in sorted(folder.glob("*.log"))
    )


class Cluster:
    """Workers of one test: one namespace, one table prefix, logs in ``tmp``."""

    def __init__(
        self,
        tmp: Path,
        broker: str,
        election_url: str,
        results: str,
        ttl: float = 3.0,
        beat: bool = False,
    ):
        self.tmp = tmp
        self.prefix = f"e{uuid.uuid4().hex[:8]}_"
        self.namespace = f"ns{uuid.uuid4().hex[:6]}"
        self.ttl = ttl
        self.env = {
            **os.environ,
            "E2E_BROKER": broker,
            "E2E_ELECTION": election_url,
            "E2E_RESULTS": results,
            "E2E_PREFIX": self.prefix,
            "E2E_NAMESPACE": self.namespace,
            "E2E_TTL": str(ttl),
            "PYTHONPATH": str(ROOT),
            "E2E_BEAT": "1" if beat else "",
            "E2E_QUEUE": f"q.{self.namespace}",
        }
        self.workers: dict[str, Proc] = {}
        self.backend = backend_from_url(election_url, table_prefix=self.prefix)
        assert isinstance(self.backend, SQLBackend)
        self.backend.install()
        self.engine = sa.create_engine(election_url, poolclass=sa.pool.NullPool)
        # the project's workers write these under E2E_PREFIX (this cluster's prefix)
        self.runs, self.transitions, self.ticks = e2e_tables(self.prefix)
        self.runs.metadata.create_all(self.engine)
        # A fresh app to send from: a Celery app caches its broker pool and result backend,
        # so one shared across tests would keep talking to the first test's servers.
        self.app = Celery("e2e-client", broker=broker, backend=results, set_as_current=False)
        self.app.conf.task_default_queue = f"q.{self.namespace}"
        self.leader_queue = leader_queue_name(self.namespace)

    def own_queue(self, worker: str) -> str:
        """The queue only ``worker`` consumes (named per test: brokers outlive tests)."""
        return f"only.{worker}.{self.namespace}"

    def send(self, task: str, label: str, queue: str | None = None, *args: object) -> AsyncResult:
        """Send tests.e2e.proj.<task>; leader tasks go to the leader queue by default."""
        if queue is None and task != "plain":
            queue = self.leader_queue
        return self.app.send_task(f"tests.e2e.proj.{task}", [label, *args], queue=queue)

    # -- processes --------------------------------------------------------------------------

    def start(
        self,
        name: str,
        *args: str,
        election: bool = True,
        pool: str = "prefork",
        c: int = 2,
        env: dict[str, str] | None = None,
    ) -> None:
        """A worker (``--election`` unless told otherwise).

        Its node name is ``<name>@<host>.<namespace>``: two test runs on one broker would
        otherwise both start ``w1@host`` and fight over its exclusive pidbox queue.
        """
        self._spawn(name, [
            "worker", *(["--election"] if election else []),
            "-c", str(c), "-P", pool, "-n", f"{name}@%h.{self.namespace}",
            "-Q", f"q.{self.namespace},{self.own_queue(name)}",
            "--without-gossip", "--without-mingle", "-s", str(self.tmp / f"{name}-schedule"),
            *args,
        ], env)  # fmt: skip

    def start_beat(self, name: str, *args: str, env: dict[str, str] | None = None) -> None:
        """A standalone ``celery beat`` with the LeaderScheduler (E2E_BEAT must be set)."""
        self._spawn(name, ["beat", "-s", str(self.tmp / f"{name}-schedule"), *args], env)

    def _spawn(self, name: str, args: list[str], env: dict[str, str] | None = None) -> None:
        cmd = [sys.executable, "-m", "celery", "-A", "tests.e2e.proj", *args, "--loglevel", "INFO"]
        log = self.tmp / f"{name}.log"
        home = self.tmp / name  # a working directory per process, as on hosts of their own
        home.mkdir(exist_ok=True)
        self.workers[name] = Proc(name, cmd, env={**self.env, **(env or {})}, cwd=home, log=log)
        self.workers[name].start()

    def signal(self, name: str, sig: int) -> None:
        self.workers[name].signal(sig)

    def wait_exit(self, name: str, timeout: float = 20) -> int:
        return self.workers[name].wait(timeout)

    def alive(self) -> list[str]:
        return [n for n, p in self.workers.items() if p.alive]

    def close(self) -> None:
        # SIGTERM, then SIGKILL to each group: a killed worker's orphans die here too.
        stop_all(self.workers.values(), grace=15)
        if self.app.conf.broker_url.startswith("amqp"):
            with self.app.connection_for_write() as conn:
                names = [f"q.{self.namespace}", self.leader_queue]
                names += [self.own_queue(n) for n in self.workers]
                for q in names:
                    with contextlib.suppress(Exception):
                        conn.default_channel.queue_delete(q)
        self.app.close()
        self.runs.metadata.drop_all(self.engine)
        self.engine.dispose()
        self.backend.uninstall()
        self.backend.close()

    def schedule_cli(self, *args: str, actor: str = "e2e-operator") -> str:
        """``celery -A tests.e2e.proj election schedule <args>`` as an operator types it."""
        done = subprocess.run(
            [sys.executable, "-m", "celery", "-A", "tests.e2e.proj", "election", "schedule",
             "--as", actor, *args],
            cwd=self.tmp, env=self.env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    def logs(self, *, stacks: bool = False) -> str:
        """The end of each log; ``stacks`` (a failed test's): each live process's threads'
        stacks first, pool children's too (it ends them), so a run that never started says
        where it waited."""
        if not stacks:
            return tail_logs(self.tmp)
        for p in self.workers.values():
            if p.alive:
                p.dump_stacks()
        return tail_logs(self.tmp, chars=12_000)

    # -- the database's view ----------------------------------------------------------------

    def lease(self) -> Lease | None:
        return self.backend.current(self.namespace)

    def leader(self, namespace: str | None = None) -> str | None:
        """The worker name ("w1") holding the lease now, by the database."""
        lease = self.backend.current(namespace or self.namespace)
        if lease is None or not lease.held or lease.leader_id is None:
            return None
        return lease.leader_id.split("@", 1)[0]

    def wait_leader(
        self, timeout: float, other_than: str | None = None, namespace: str | None = None
    ) -> str:
        def check() -> str | None:
            who = self.leader(namespace)
            return who if who is not None and who != other_than else None

        return wait_until(check, timeout, f"a leader other than {other_than}")

    def beat_leader(self) -> str | None:
        """The standalone beat (by process name) holding the beat lease now."""
        # only the columns every release has: a rolling upgrade's older tables lack the
        # newer ones until a newer process installs them (tests/e2e/test_upgrade.py)
        assert isinstance(self.backend, SQLBackend)
        t = self.backend.lease
        held = sa.and_(t.c.token.is_not(None), t.c.expires_at > db_now_us())
        stmt = sa.select(t.c.leader_id).where(t.c.namespace == f"{self.namespace}-beat", held)
        with self.engine.connect() as conn:
            leader_id = conn.execute(stmt).scalar()
        if leader_id is None:
            return None
        pid = int(leader_id.split(":")[1])
        return next((n for n, p in self.workers.items() if p.pid == pid), None)

    def wait_beat_leader(self, timeout: float, other_than: str | None = None) -> str:
        def check() -> str | None:
            who = self.beat_leader()
            return who if who is not None and who != other_than else None

        return wait_until(check, timeout, f"a beat leader other than {other_than}")

    def wait_candidates(self, n: int, timeout: float = 30) -> None:
        wait_until(
            lambda: len(self.backend.candidates(self.namespace)) >= n,
            timeout,
            f"{n} registered candidates",
        )

    def listening(self, name: str) -> bool:
        """Whether worker ``name``'s PostgreSQL LISTEN connection has run its LISTEN.

        Its session is found in ``pg_stat_activity`` by the listener's application name
        and a client port of the worker's main process (the listener is a thread there);
        the LISTEN is done once the session is idle after it or has moved on to its probe.
        """
        ports = _local_ports(self.workers[name].pid)
        if not ports:
            return False
        query = sa.text(
            "SELECT state, query FROM pg_stat_activity "
            "WHERE application_name = 'celery-election-listen' AND client_port IN :ports"
        ).bindparams(sa.bindparam("ports", expanding=True))
        with self.engine.connect() as conn:
            rows = list(conn.execute(query, {"ports": sorted(ports)}))
        return any(
            (r.state == "idle" and r.query.lstrip().upper().startswith("LISTEN"))
            or "pg_notify" in r.query
            for r in rows
        )

    def hot_standby(self, name: str) -> bool:
        """Whether worker ``name`` holds a standby slot of the namespace's liveness lock.

        A follower claims a slot just before it waits on the lock and frees it at the
        grant: a worker holding one is woken by the grant. The server's (or the kernel's)
        record of the slot's owner is matched to the worker's main process (the lock
        thread's): PostgreSQL and MariaDB by the session's client port, SQLite's file
        locks by pid (/proc/locks).
        """
        pid = self.workers[name].pid
        key = lock_key(self.prefix, self.namespace)
        slots = [slot_key(key, n) for n in range(MAX_SLOTS)]
        dialect = self.engine.dialect.name
        if dialect == "sqlite":
            db = Path(str(self.engine.url.database))
            base = f"{db.name}.{key.hex()[:16]}"
            return _flocked_by(
                pid, [db.with_name(f"{base}.slot{n}.lock") for n in range(MAX_SLOTS)]
            )
        ports = _local_ports(pid)
        if not ports:
            return False
        with self.engine.connect() as conn:
            if dialect == "postgresql":
                ids = set()
                for slot in slots:
                    k = int.from_bytes(slot[:8], "big", signed=True) & 0xFFFFFFFFFFFFFFFF
                    ids.add((k >> 32, k & 0xFFFFFFFF))
                query = sa.text(
                    "SELECT l.classid, l.objid FROM pg_locks l JOIN pg_stat_activity a "
                    "ON a.pid = l.pid WHERE l.locktype = 'advisory' AND l.granted "
                    "AND a.client_port IN :ports"
                ).bindparams(sa.bindparam("ports", expanding=True))
                held = conn.execute(query, {"ports": sorted(ports)})
                return any((int(r[0]), int(r[1])) in ids for r in held)
            for slot in slots:  # MySQL/MariaDB: the slot's holder, then its client port
                who = conn.execute(
                    sa.text("SELECT IS_USED_LOCK(:n)"), {"n": "celery_election:" + slot.hex()[:40]}
                ).scalar()
                if who is None:
                    continue
                host = conn.execute(
                    sa.text("SELECT HOST FROM information_schema.PROCESSLIST WHERE ID = :i"),
                    {"i": int(who)},
                ).scalar()
                if host and int(str(host).rsplit(":", 1)[-1] or 0) in ports:
                    return True
            return False

    def rows(self, table: sa.Table) -> list[Any]:
        with self.engine.connect() as conn:
            return list(conn.execute(sa.select(table).order_by(table.c.id)))

    def term_owners(self) -> dict[int, set[str]]:
        """term -> the workers that announced being elected under it."""
        owners: dict[int, set[str]] = {}
        for r in self.rows(self.transitions):
            if r.kind == "elected":
                owners.setdefault(r.term, set()).add(r.worker.split("@", 1)[0])
        return owners


def _flocked_by(pid: int, files: list[Path]) -> bool:
    """Whether process ``pid`` holds a ``flock`` on one of ``files`` (/proc/locks)."""
    inodes = {f.stat().st_ino for f in files if f.exists()}
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()  # "1: FLOCK ADVISORY WRITE <pid> <major:minor:inode> 0 EOF"
        mine = len(fields) > 5 and fields[1] == "FLOCK" and fields[4] == str(pid)
        if mine and int(fields[5].rsplit(":", 1)[1]) in inodes:
            return True
    return False


def _local_ports(pid: int) -> set[int]:
    """Local TCP ports of the sockets process ``pid`` holds open (Linux /proc)."""
    inodes: set[str] = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:["):
                    inodes.add(link[8:-1])
    ports: set[int] = set()
    for table in ("tcp", "tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
                fields = line.split()
                if len(fields) > 9 and fields[9] in inodes:
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports
