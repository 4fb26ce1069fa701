"""The examples run: quickstart/, standalone_elector.py, fencing.py, and docker/ is sound.

Each example runs as a user would run it (a subprocess, its own command line), and is
checked through what it prints or writes. Every process started here is stopped at the
end of its test: SIGTERM, a bounded wait, then SIGKILL of its whole session.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import sqlalchemy as sa
from celery import Celery

from celery_election.backends import backend_from_url
from celery_election.integration.app import leader_queue_name
from harness.cluster import wait_until

from ..conftest import server_url, unique_prefix

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
QUICKSTART = EXAMPLES / "quickstart"
DOCKER = ROOT / "docker"
T = TypeVar("T")

pytestmark = pytest.mark.slow


class Processes:
    """Subprocesses of one test, each in its own session, stopped by close()."""

    def __init__(self) -> None:
        self.procs: dict[str, subprocess.Popen[Any]] = {}

    def start(self, name: str, args: list[str], **kwargs: Any) -> subprocess.Popen[Any]:
        proc = subprocess.Popen(args, start_new_session=True, **kwargs)
        self.procs[name] = proc
        return proc

    def stop(self, name: str, timeout: float = 20) -> int:
        """SIGTERM (a clean stop), and the exit status; SIGKILL if it hangs."""
        proc = self.procs[name]
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self._kill(proc)
            raise AssertionError(f"{name} did not stop within {timeout}s of SIGTERM") from None

    @staticmethod
    def _kill(proc: subprocess.Popen[Any]) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 15
        for proc in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(0.1, deadline - time.monotonic()))
        for proc in self.procs.values():  # the process if it hung, and any orphans
            self._kill(proc)


@pytest.fixture
def processes() -> Iterator[Processes]:
    p = Processes()
    try:
        yield p
    finally:
        p.close()


# -- quickstart/ ------------------------------------------------------------------------------


def test_quickstart_leader_task_runs_on_the_leader_only(
    tmp_path: Path, processes: Processes
) -> None:
    broker = server_url("amqp")
    namespace = f"qs{uuid.uuid4().hex[:8]}"
    queue = f"quickstart.{namespace}"  # the broker outlives the test: nothing shared on it
    leader_queue = leader_queue_name(namespace)
    env = {
        **os.environ,
        "CELERY_BROKER_URL": broker,
        "CELERY_ELECTION_URL": f"sqlite:///{tmp_path}/election.db",
        "CELERY_ELECTION_NAMESPACE": namespace,
        "APP_DATABASE_URL": f"sqlite:///{tmp_path}/app.db",
    }
    backend = backend_from_url(env["CELERY_ELECTION_URL"])
    app_db = sa.create_engine(env["APP_DATABASE_URL"], poolclass=sa.pool.NullPool)
    client = Celery("client", broker=broker, set_as_current=False)
    logs: dict[str, Path] = {}

    def start(name: str) -> None:
        logs[name] = tmp_path / f"{name}.log"
        with open(logs[name], "wb") as log:
            processes.start(
                name,
                # the README's command, plus a queue of this test's own and one process
                [sys.executable, "-m", "celery", "-A", "proj", "worker", "--election",
                 "-n", f"{name}@%h", "--loglevel", "INFO", "-Q", queue, "-c", "1"],
                cwd=QUICKSTART, env=env, stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip

    def leader() -> tuple[str, int] | None:
        lease = backend.current(namespace)
        if lease is None or not lease.held or lease.leader_id is None:
            return None
        return lease.leader_id.split(":", 1)[0], lease.term  # ("w1@host", term)

    def rows() -> list[Any]:
        try:
            with app_db.connect() as conn:
                return list(conn.execute(sa.text("SELECT term, worker FROM reports ORDER BY id")))
        except sa.exc.OperationalError:  # no table before the first refresh
            return []

    def requeued(name: str) -> int:
        return logs[name].read_text(errors="replace").count("requeued to ")

    def send(n: int, to: str) -> None:
        for _ in range(n):
            client.send_task("proj.tasks.refresh_report", queue=to)

    def election(*args: str) -> str:
        proc = subprocess.run(
            [sys.executable, "-m", "celery", "-A", "proj", "election", *args],
            cwd=QUICKSTART, env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return proc.stdout

    try:
        assert "installed in sqlite:///" in election("install")
        start("w1")
        start("w2")
        wait_until(lambda: len(backend.candidates(namespace)) == 2, 30, "two candidates")
        first, term = wait_until(leader, 10, "a leader")
        leader_name = first.split("@")[0]
        follower = "w2" if leader_name == "w1" else "w1"
        assert first == f"{leader_name}@{socket.gethostname()}"

        info = json.loads(election("status", "--json"))
        assert info["namespace"] == namespace and info["term"] == term
        assert info["leader"].startswith(f"{first}:") and len(info["candidates"]) == 2

        # Misrouted to the common queue both consume (once both consume: the broker deals
        # the messages out in turn): the follower requeues those to the leader queue (the
        # default, never lost), the leader runs them all. And to the leader queue, which
        # only the leader consumes.
        wait_until(lambda: all(" ready." in p.read_text() for p in logs.values()), 30, "ready")
        send(4, queue)
        send(3, leader_queue)
        client.send_task("proj.tasks.add", [2, 3], queue=queue)
        wait_until(lambda: len(rows()) == 7, 30, "7 refreshes run, all by the leader")
        assert {tuple(r) for r in rows()} == {(term, first)}
        assert requeued(leader_name) == 0 and requeued(follower) > 0
        ran_add = re.compile(r"proj\.tasks\.add\[\S+\] succeeded in \S+: 5")
        wait_until(
            lambda: any(ran_add.search(p.read_text(errors="replace")) for p in logs.values()),
            20,
            "the plain task to run",
        )

        # A clean stop hands over: the follower leads under a greater term.
        assert processes.stop(leader_name) == 0
        second, term2 = wait_until(
            lambda: (lead := leader()) is not None and lead[0] != first and lead, 10, "handoff"
        )
        assert second.startswith(f"{follower}@") and term2 > term
        before = len(rows())
        send(2, leader_queue)
        wait_until(lambda: len(rows()) == before + 2, 20, "2 refreshes on the new leader")
        assert {tuple(r) for r in rows()[before:]} == {(term2, second)}
        assert processes.stop(follower) == 0
    except BaseException:
        for name, path in logs.items():
            print(f"--- {name}\n{path.read_text(errors='replace')[-4000:]}")
        raise
    finally:
        with client.connection_for_write() as conn:
            for q in (queue, leader_queue):
                with contextlib.suppress(Exception):
                    conn.default_channel.queue_delete(q)
        client.close()
        backend.close()
        app_db.dispose()


# -- standalone_elector.py --------------------------------------------------------------------

LINE = re.compile(r"^(?P<what>[A-Z]+) (?P<fields>.*)$")


class Output:
    """The parsed lines of a running standalone_elector.py, read on a thread."""

    def __init__(self, name: str, proc: subprocess.Popen[str]) -> None:
        self.name = name
        self.lines: list[dict[str, str]] = []
        self.raw: list[str] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._read, args=(proc,), daemon=True)
        self._thread.start()

    def _read(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            match = LINE.match(line.strip())
            with self._lock:
                self.raw.append(line)
                if match:
                    fields = dict(f.split("=", 1) for f in match["fields"].split())
                    self.lines.append({"what": match["what"], **fields})

    def seen(self, what: str, **fields: str) -> list[dict[str, str]]:
        with self._lock:
            return [
                line
                for line in self.lines
                if line["what"] == what and all(line.get(k) == v for k, v in fields.items())
            ]

    def join(self) -> None:
        self._thread.join(10)


def test_standalone_elector_one_leader_then_handoff(tmp_path: Path, processes: Processes) -> None:
    url = f"sqlite:///{tmp_path}/standalone.db"
    outputs: dict[str, Output] = {}
    for name in ("a", "b"):
        proc = processes.start(
            name,
            [sys.executable, str(EXAMPLES / "standalone_elector.py"), "--url", url,
             "--name", name, "--ttl", "3", "--interval", "0.1", "--seconds", "60"],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        outputs[name] = Output(name, proc)
    try:
        first = wait_until(
            lambda: [n for n, o in outputs.items() if o.seen("LEADER")], 20, "a LEADER line"
        )
        assert len(first) == 1
        leader = first[0]
        other = "b" if leader == "a" else "a"
        wait_until(lambda: outputs[other].seen("FOLLOWER", leader=leader), 10, "a FOLLOWER line")
        time.sleep(1.0)  # both keep working: still one leader
        assert not outputs[other].seen("LEADER") and not outputs[other].seen("ELECTED")

        assert processes.stop(leader) == 0
        outputs[leader].join()
        assert outputs[leader].seen("REVOKED", reason="stopped")
        assert outputs[leader].seen("STOPPED")
        wait_until(lambda: outputs[other].seen("LEADER"), 5, "the other one to lead")
        assert processes.stop(other) == 0
        outputs[other].join()
        assert outputs[other].seen("STOPPED")
    except BaseException:
        for o in outputs.values():
            print(f"--- {o.name}\n{''.join(o.raw)}")
        raise

    # Terms: one owner each, and greater after the handoff.
    terms = {n: {int(x["term"]) for x in o.seen("LEADER")} for n, o in outputs.items()}
    assert len(terms[leader]) == 1 and len(terms[other]) == 1
    assert min(terms[other]) > max(terms[leader])
    # No overlap in time: every LEADER line of the first precedes every one of the second,
    # and the second was elected only after the first stepped down.
    last_first = max(float(x["at"]) for x in outputs[leader].seen("LEADER"))
    revoked = float(outputs[leader].seen("REVOKED")[-1]["at"])
    elected = float(outputs[other].seen("ELECTED")[0]["at"])
    assert last_first <= revoked <= elected
    assert all(float(x["at"]) >= elected for x in outputs[other].seen("LEADER"))


# -- fencing.py -------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_fencing_refuses_the_stale_write(kind: str) -> None:
    args = [sys.executable, str(EXAMPLES / "fencing.py")]
    if kind == "sqlite":
        proc = subprocess.run(args, capture_output=True, text=True, timeout=60)
    else:
        url = server_url("postgresql")
        prefix, table = unique_prefix(), f"report_{uuid.uuid4().hex[:8]}"
        try:
            proc = subprocess.run(
                [*args, "--url", url, "--table", table, "--table-prefix", prefix,
                 "--namespace", f"fence-{uuid.uuid4().hex[:6]}"],
                capture_output=True, text=True, timeout=60,
            )  # fmt: skip
        finally:
            backend = backend_from_url(url, table_prefix=prefix, listen=False)
            backend.uninstall()
            backend.close()
            engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
            with engine.begin() as conn:
                conn.execute(sa.text(f'DROP TABLE IF EXISTS "{table}"'))
            engine.dispose()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert re.search(r"node-a writes with term \d+: accepted", out)
    assert re.search(r"node-b writes with term \d+: accepted", out)
    assert re.search(r"node-a \(stale\) writes with term \d+: refused", out)
    assert "row 1 now: payload='written by node-b'" in out
    assert "OK: the stale write was refused" in out


# -- singleton_report.py ----------------------------------------------------------------------


def test_singleton_report_runs_one_refresh_at_a_time_per_account() -> None:
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / "singleton_report.py")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert len(re.findall(r"account 1: version \d ran", out)) == 3
    assert len(re.findall(r"account 2: version 1 ran", out)) == 1
    assert re.search(r"the first run of account 1 writes late with term \d+: refused", out)
    assert "OK: one run at a time per account" in out


# -- docker/ ----------------------------------------------------------------------------------

WORKER = ["celery", "-A", "proj", "worker", "--election"]
BEAT = ["celery", "-A", "proj", "beat", "-S", "celery_election.beat:LeaderScheduler"]


def argv(command: str | list[str]) -> list[str]:
    return shlex.split(command) if isinstance(command, str) else [str(a) for a in command]


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    import yaml  # PyYAML is a dev dependency: without it these tests error, never skip

    with open(DOCKER / "docker-compose.yml") as f:
        loaded: dict[str, Any] = yaml.safe_load(f)
    return loaded


def celery_help(args: list[str]) -> subprocess.CompletedProcess[str]:
    """``args`` (a ``celery ...`` command) with --help, the quickstart app importable."""
    assert args[0] == "celery", args
    return subprocess.run(
        [sys.executable, "-m", "celery", *args[1:], "--help"],
        cwd=QUICKSTART,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_compose_commands_are_ones_the_cli_accepts(compose: dict[str, Any]) -> None:
    commands = {
        name: argv(service["command"])
        for name, service in compose["services"].items()
        if "command" in service
    }
    assert set(commands) >= {"install", "worker1", "worker2", "worker3", "beat1", "beat2"}
    for args in {tuple(a) for a in commands.values()}:
        proc = celery_help(list(args))
        assert proc.returncode == 0, f"{shlex.join(args)}: {proc.stdout}{proc.stderr}"
        if "worker" in args:  # the app's own options were loaded, not only Celery's
            assert "--election" in proc.stdout
    # the check has teeth: an option nobody knows makes click exit 2
    bad = celery_help([*WORKER, "--no-such-option"])
    assert bad.returncode == 2 and "no-such-option" in bad.stderr


def test_compose_services_and_start_up_order(compose: dict[str, Any]) -> None:
    services = compose["services"]
    workers = {n for n, s in services.items() if argv(s.get("command", ""))[:5] == WORKER}
    beats = {n for n, s in services.items() if argv(s.get("command", ""))[:6] == BEAT}
    assert workers == {"worker1", "worker2", "worker3"}
    assert beats == {"beat1", "beat2"}
    nodes = {(a := argv(services[w]["command"]))[a.index("-n") + 1] for w in workers}
    assert len(nodes) == 3  # distinct node names

    pg_check = " ".join(argv(services["postgres"]["healthcheck"]["test"]))
    assert services["postgres"]["image"].startswith("postgres:") and "pg_isready" in pg_check
    mq_check = " ".join(argv(services["rabbitmq"]["healthcheck"]["test"]))
    assert services["rabbitmq"]["image"].startswith("rabbitmq:")
    assert "rabbitmq-diagnostics" in mq_check and "ping" in mq_check

    install = services["install"]
    assert argv(install["command"]) == ["celery", "-A", "proj", "election", "install"]
    assert install["depends_on"] == {"postgres": {"condition": "service_healthy"}}
    assert install.get("restart", "no") == "no"  # a one-shot
    for name in workers | beats:
        assert services[name]["depends_on"] == {
            "postgres": {"condition": "service_healthy"},
            "rabbitmq": {"condition": "service_healthy"},
            "install": {"condition": "service_completed_successfully"},
        }, name

    # Every app service runs the image of docker/Dockerfile, configured the way proj reads.
    source = (QUICKSTART / "proj" / "celery.py").read_text()
    for name in {"install"} | workers | beats:
        service = services[name]
        build = service["build"]
        assert (DOCKER / build["context"] / build["dockerfile"]).resolve() == (
            DOCKER / "Dockerfile"
        ).resolve()
        env = service["environment"]
        for var in ("CELERY_BROKER_URL", "CELERY_ELECTION_URL", "APP_DATABASE_URL"):
            assert var in env and var in source, (name, var)
        assert env["CELERY_ELECTION_URL"].startswith("postgresql+psycopg://")
        assert (
            "@postgres:" in env["CELERY_ELECTION_URL"] and "@rabbitmq:" in env["CELERY_BROKER_URL"]
        )


def dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of docker/Dockerfile, continuation lines joined."""
    text = (DOCKER / "Dockerfile").read_text().replace("\\\n", " ")
    lines = [line.strip() for line in text.splitlines()]
    return [
        (op.upper(), rest.strip())
        for op, _, rest in (line.partition(" ") for line in lines)
        if op and not op.startswith("#")
    ]


def test_dockerfile_installs_the_package_and_runs_the_quickstart() -> None:
    steps = dockerfile()
    assert steps[0] == ("FROM", "python:3.11-slim")
    runs = " && ".join(rest for op, rest in steps if op == "RUN")
    extras = re.search(r"pip install \S*\[([^\]]*)\]", runs)
    assert extras is not None, runs
    assert "postgres" in extras[1].split(",")  # the driver; Celery is a dependency
    copies = [rest.split() for op, rest in steps if op == "COPY"]
    for copy in copies:  # every source is in the build context: the repository root
        for src in copy[:-1]:
            assert src.startswith("--") or (ROOT / src).exists(), src
    quickstart = next(copy[-1] for copy in copies if "examples/quickstart" in copy)
    workdir = [rest for op, rest in steps if op == "WORKDIR"][-1]
    assert workdir == quickstart  # `celery -A proj` finds proj/ there
