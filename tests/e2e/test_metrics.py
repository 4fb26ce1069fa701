"""Metrics and probes of real workers: prefork children's counts add up, the beat's tick
loop drives /healthz, a follower is ready, and ``celery election health`` agrees."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from harness.cluster import ROOT, Cluster, wait_until

pytest.importorskip("prometheus_client")

pytestmark = [pytest.mark.slow]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError as e:
        return 0, str(e)


def sample(body: str, name: str, **labels: str) -> float | None:
    """The value of one sample in a /metrics body."""
    for line in body.splitlines():
        m = re.match(rf"{name}\{{(.*)\}} (\S+)$", line)
        if m and all(f'{k}="{v}"' in m.group(1) for k, v in labels.items()):
            return float(m.group(2))
    return None


def health(c: Cluster, port: int, *flags: str) -> int:
    proc = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "tests.e2e.proj", "election", "health",
         "--port", str(port), *flags],
        env=c.env, cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    return proc.returncode


@pytest.mark.parametrize("cluster", [{"kind": "sqla+sqlite"}], indirect=True)
def test_prefork_children_counts_add_up_and_a_follower_is_ready(cluster: Cluster) -> None:
    c = cluster
    ports = {"w1": free_port(), "w2": free_port()}
    opts = ("--max-tasks-per-child", "1")
    c.start("w1", *opts, "--election-metrics-port", str(ports["w1"]))
    c.wait_candidates(1)  # the sqla transport creates its queue rows without a lock
    c.start("w2", *opts, "--election-metrics-port", str(ports["w2"]))
    c.wait_candidates(2)
    leader = c.wait_leader(30)
    follower = "w2" if leader == "w1" else "w1"
    wait_until(lambda: get(ports[follower], "/readyz")[0] == 200, 30, "the follower ready")
    assert health(c, ports[follower], "--ready") == 0
    assert health(c, ports[follower]) == 0

    # each task in a fresh child (--max-tasks-per-child 1): 6 skipped on the follower,
    # 3 run on the leader
    for i in range(6):
        c.send("skip", f"s{i}", queue=c.own_queue(follower))
    for i in range(3):
        c.send("skip", f"r{i}", queue=c.own_queue(leader))
    task = "tests.e2e.proj.skip"

    def counted(port: int, outcome: str, n: int) -> bool:
        body = get(port, "/metrics")[1]
        return sample(body, "celery_election_leader_tasks_total", task=task, outcome=outcome) == n

    wait_until(lambda: counted(ports[follower], "skipped", 6), 60, "6 skips counted")
    wait_until(lambda: counted(ports[leader], "run", 3), 60, "3 runs counted")
    body = get(ports[leader], "/metrics")[1]
    assert sample(body, "celery_election_leading") == 1
    assert sample(get(ports[follower], "/metrics")[1], "celery_election_leading") == 0
    assert sample(body, "celery_election_transitions_total", kind="elected") == 1
    # nothing listens there: the exec probe says so
    assert health(c, free_port()) == 1


@pytest.mark.parametrize("cluster", [{"kind": "sqla+sqlite", "beat": True}], indirect=True)
def test_healthz_fails_while_the_tick_loop_hangs_and_recovers(
    cluster: Cluster, tmp_path: Path
) -> None:
    c = cluster
    hang = tmp_path / "hang"
    c.env["E2E_HANG_FILE"] = str(hang)
    port = free_port()
    c.start("w1", "-B", "--election-metrics-port", str(port))
    c.wait_leader(30)
    ns = c.namespace

    def sent() -> float:
        body = get(port, "/metrics")[1]
        return sample(body, "celery_election_beat_runs_sent_total", namespace=ns) or 0

    wait_until(lambda: sent() >= 1, 30, "the embedded beat sending")
    assert get(port, "/healthz")[0] == 200
    assert health(c, port) == 0

    hang.touch()  # the next send of a tick hangs, and with it the tick loop
    _, body = wait_until(
        lambda: (r := get(port, "/healthz"))[0] == 503 and r, 30, "/healthz failing"
    )
    assert "beat tick loop" in json.loads(body)["problems"][0]
    assert health(c, port) == 1
    body = get(port, "/metrics")[1]
    age = sample(body, "celery_election_beat_tick_age_seconds")
    late = sample(body, "celery_election_beat_tick_late_seconds", namespace=ns)
    assert age is not None and age > c.ttl
    assert late is not None and late > c.ttl

    hang.unlink()
    wait_until(lambda: get(port, "/healthz")[0] == 200, 30, "/healthz back to 200")
    late = sample(get(port, "/metrics")[1], "celery_election_beat_tick_late_seconds")
    assert late is not None and late < c.ttl  # the gauge agrees: on time again
    assert health(c, port) == 0
    assert get(port, "/readyz")[0] == 200


@pytest.mark.parametrize("cluster", [{"kind": "sqla+sqlite", "beat": True}], indirect=True)
def test_standalone_beats_serve_metrics_and_probes(cluster: Cluster) -> None:
    """``celery beat --election-metrics-port``: the leader counts its sends, the follower
    sends nothing and is ready, and after SIGKILL the follower leads under a greater term."""
    c = cluster
    ports = {"b1": free_port(), "b2": free_port()}
    for name, port in ports.items():
        c.start_beat(name, "--election-metrics-port", str(port))
    ns = f"{c.namespace}-beat"
    leader = c.wait_beat_leader(30)
    follower = "b2" if leader == "b1" else "b1"

    def metric(name: str, port: int, **labels: str) -> float | None:
        return sample(get(port, "/metrics")[1], name, **labels)

    def sent(port: int, entry: str) -> float:
        return metric("celery_election_beat_runs_sent_total", port, entry=entry) or 0

    wait_until(lambda: sent(ports[leader], "every-second-a") >= 2, 30, "the leader sending")
    lease = c.backend.current(ns)
    assert lease is not None
    assert metric("celery_election_leading", ports[leader], namespace=ns) == 1
    assert metric("celery_election_term", ports[leader], namespace=ns) == lease.term
    body = get(ports[leader], "/metrics")[1]
    assert not sample(body, "celery_election_beat_runs_refused_total")  # absent, or 0
    assert not sample(body, "celery_election_beat_runs_publish_failed_total")
    claimed = sample(body, "celery_election_beat_runs_claimed_total", entry="every-second-a")
    assert claimed is not None and claimed >= 2

    wait_until(lambda: get(ports[follower], "/readyz")[0] == 200, 30, "the follower ready")
    assert metric("celery_election_leading", ports[follower], namespace=ns) == 0
    assert sent(ports[follower], "every-second-a") == 0
    for port in ports.values():
        assert get(port, "/healthz")[0] == 200
        assert health(c, port, "--ready") == 0

    c.signal(leader, signal.SIGKILL)
    assert c.wait_beat_leader(30, other_than=leader) == follower
    wait_until(lambda: sent(ports[follower], "every-second-a") >= 1, 30, "the new leader sending")
    term = metric("celery_election_term", ports[follower], namespace=ns)
    assert metric("celery_election_leading", ports[follower], namespace=ns) == 1
    assert term is not None and term > lease.term
