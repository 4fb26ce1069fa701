"""One election per deployment in every layout Celery teaches (tests/e2e/layouts.py).

Two "hosts" are two working directories, each running a real ``celery worker
--election`` and a real ``celery beat -S LeaderScheduler``, on one PostgreSQL and one
RabbitMQ. A third process imports only the app and sends the leader task by name. In each
layout: both hosts join one election and one leads; every leader task runs once, on the
leader, delivered through the leader queue and never requeued; beat sends each run once.
A dropped setting fails it: each host would elect itself in a file of its own directory.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kombu import Connection

from celery_election.backends import SQLBackend, backend_from_url
from celery_election.settings import leader_queue_name
from harness.cluster import ROOT, tail_logs, wait_until
from harness.processes import Proc, stop_all

from ..conftest import failed, server_url
from .layouts import LAYOUTS, SENDER, Settings

pytestmark = pytest.mark.slow

SENT_BY_NAME = 6  # + countdown, signature, a group and a chain of 2, a retry, 2 `celery call`s


class Deployment:
    """The two hosts of one layout, and the database's view of their elections."""

    def __init__(self, tmp: Path, layout: str, broker: str, db: str) -> None:
        uid = uuid.uuid4().hex[:8]
        self.settings = Settings(
            broker=broker,
            election_url=db,
            namespace=f"lay{uid}",
            table_prefix=f"lay{uid}_",
            queue=f"q.lay{uid}",
        )
        self.tmp = tmp
        self.code = tmp / "code"
        extra_env = LAYOUTS[layout](self.code, self.settings)
        self.runs = tmp / "runs.jsonl"
        self.env = {
            **os.environ,
            **extra_env,
            "PYTHONPATH": os.pathsep.join([str(self.code), str(ROOT)]),
            "LAYOUT_RUNS": str(self.runs),
        }
        self.hosts = [tmp / "host1", tmp / "host2"]
        self.procs: dict[str, Proc] = {}
        # The test's own handle on the database: nothing is created by the test, so the
        # hosts' auto-install must find the tables where their settings say.
        self.backend = backend_from_url(db, table_prefix=self.settings.table_prefix)
        assert isinstance(self.backend, SQLBackend)

    def celery(self, name: str, cwd: Path, *args: str) -> Proc:
        cmd = [sys.executable, "-m", "celery", "-A", "proj", *args, "--loglevel", "INFO"]
        proc = Proc(name, cmd, env=self.env, cwd=cwd, log=self.tmp / f"{name}.log")
        self.procs[name] = proc.start()
        return proc

    def start(self) -> None:
        for n, host in enumerate(self.hosts, 1):
            host.mkdir()
            self.celery(f"w{n}", host, "worker", "--election", "-P", "prefork", "-c", "1",
                        "-n", f"w{n}@%h.{self.settings.namespace}",  # unique per run on the broker
                        "--without-gossip", "--without-mingle")  # fmt: skip
            self.celery(f"beat{n}", host, "beat", "-S", "celery_election.beat:LeaderScheduler")

    def leader_of(self, namespace: str, joined: int = 2) -> str | None:
        """The leader's id once ``joined`` candidates are in this one election."""
        with contextlib.suppress(Exception):  # tables not created yet
            if len(self.backend.candidates(namespace)) < joined:
                return None
            lease = self.backend.current(namespace)
            if lease is not None and lease.held and lease.leader_id:
                return lease.leader_id
        return None

    def records(self) -> list[dict[str, Any]]:
        if not self.runs.exists():
            return []
        return [json.loads(line) for line in self.runs.read_text().splitlines() if line]

    def send(self) -> list[str]:
        """From a third directory: the sender script, then `celery call` twice."""
        third = self.tmp / "sender"
        third.mkdir()
        (third / "send.py").write_text(SENDER)
        for cmd in (
            [sys.executable, "send.py", str(SENT_BY_NAME)],
            [sys.executable, "-m", "celery", "-A", "proj", "call", "layout.leader_job",
             "--args", '["call-0"]'],
            [sys.executable, "-m", "celery", "-A", "proj", "call", "layout.leader_job",
             "--args", '["call-1"]'],
        ):  # fmt: skip
            proc = Proc("sender", cmd, env=self.env, cwd=third, log=self.tmp / "sender.log")
            assert proc.start().wait(60) == 0, (self.tmp / "sender.log").read_text()
        return [
            *(f"send-{i}" for i in range(SENT_BY_NAME)),
            "countdown",
            "signature",
            "group-0",
            "group-1",
            "chain-0",
            "chain-1",
            "retried",
            "call-0",
            "call-1",
        ]

    def close(self) -> None:
        stop_all(self.procs.values(), grace=15)
        with contextlib.suppress(Exception), Connection(self.settings.broker) as conn:
            for q in (self.settings.queue, leader_queue_name(self.settings.namespace)):
                with contextlib.suppress(Exception):
                    conn.default_channel.queue_delete(q)
        with contextlib.suppress(Exception):
            self.backend.uninstall()
        self.backend.close()


@pytest.fixture
def deployment(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Deployment]:
    d = Deployment(tmp_path, request.param, server_url("amqp"), server_url("postgresql"))
    try:
        yield d
    finally:
        if failed(request):
            print(tail_logs(d.tmp))
        d.close()


@pytest.mark.parametrize("deployment", list(LAYOUTS), indirect=True)
def test_one_election_per_deployment(deployment: Deployment) -> None:
    d = deployment
    ns = d.settings.namespace
    d.start()
    leader = wait_until(lambda: d.leader_of(ns), 60, "one worker leader of both hosts")
    wait_until(lambda: d.leader_of(f"{ns}-beat"), 60, "one beat leader of both hosts")
    labels = d.send()

    def leader_runs() -> list[dict[str, Any]]:
        return [r for r in d.records() if r["kind"] == "leader"]

    wait_until(lambda: len(leader_runs()) >= len(labels), 60, "every leader task to run")
    wait_until(lambda: sum(r["kind"] == "beat" for r in d.records()) >= 4, 30, "4 beat runs")
    worker_lease = d.backend.current(ns)
    assert worker_lease is not None and worker_lease.leader_id == leader  # no change
    d.close()

    runs = leader_runs()
    assert sorted(r["label"] for r in runs) == sorted(labels)  # each once
    leader_host = leader.split(":", 1)[0]  # "w1@host"
    assert {r["host"] for r in runs} == {leader_host}
    assert {r["term"] for r in runs} == {worker_lease.term}
    assert {r["queue"] for r in runs} == {leader_queue_name(ns)}  # routed, not bounced
    worker_logs = "".join((d.tmp / f"w{n}.log").read_text() for n in (1, 2))
    assert "requeued" not in worker_logs and "not the leader" not in worker_logs
    # each banner names the election; the hosts' auto-install said what it created
    assert worker_logs.count(f".> namespace:   {ns} (leader queue election-leader.{ns})") == 2
    assert worker_logs.count(f".> database:    {d.settings.election_url} (election_url)") == 2
    assert (
        "created tables"
        in worker_logs + (d.tmp / "beat1.log").read_text() + (d.tmp / "beat2.log").read_text()
    )
    beat_runs = [r["run"] for r in d.records() if r["kind"] == "beat"]
    assert None not in beat_runs
    assert len(beat_runs) == len(set(beat_runs)), beat_runs  # each run sent once
    assert len({r["term"] for r in d.records() if r["kind"] == "beat"}) == 1  # one beat sent
    for host in d.hosts:  # the configured database, never a file of the host's own
        assert not list(host.glob("celery-election*.sqlite3"))
