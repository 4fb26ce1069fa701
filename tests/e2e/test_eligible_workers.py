"""``--no-election-eligible``: real workers (RabbitMQ + PostgreSQL) that never lead.

An ineligible worker alone registers, is listed as ineligible, reports
``celery_election_eligible 0`` and is ready, and never takes a term: the lease stays
vacant for two leases and a leader task sent meanwhile waits in the leader queue. An
eligible worker joining leads (how long after it registered is printed, not asserted)
and runs that task, once, under its own term; no term ever names the ineligible one.
"""

from __future__ import annotations

import json
import time

import pytest
from click.testing import CliRunner

from celery_election.ops.cli import election
from harness.cluster import Cluster, wait_until

from .test_metrics import free_port, get, sample

pytest.importorskip("prometheus_client")

pytestmark = [pytest.mark.slow]


def _status(c: Cluster) -> dict[str, object]:
    url = c.env["E2E_ELECTION"]
    args = ["--url", url, "--table-prefix", c.prefix, "status", "-N", c.namespace, "--json"]
    out = CliRunner().invoke(election, args)
    assert out.exit_code == 0, out.output
    info: dict[str, object] = json.loads(out.output)
    return info


def test_an_ineligible_worker_alone_never_leads_and_an_eligible_one_joining_does(
    cluster: Cluster,
) -> None:
    c = cluster
    port = free_port()
    c.start("w1", "--no-election-eligible", "--election-metrics-port", str(port))
    c.wait_candidates(1)
    [w1] = c.backend.candidates(c.namespace)
    assert not w1.eligible
    waiting = c.send("skip", "waiting")  # a leader task: into the leader queue

    # Two leases long (a candidate that may lead elects within one poll of a vacancy),
    # every 50 ms: no term, no run, and status and the metrics say why.
    deadline = time.monotonic() + 2 * c.ttl
    while time.monotonic() < deadline:
        lease = c.lease()
        assert lease is None or not lease.held, f"the ineligible worker took {lease}"
        assert not c.rows(c.runs), "a leader task ran with no leader"
        time.sleep(0.05)
    info = _status(c)
    assert info["leader"] is None and info["eligible_candidates"] == 0
    status, body = get(port, "/metrics")
    assert status == 200
    assert sample(body, "celery_election_eligible", namespace=c.namespace) == 0.0
    assert sample(body, "celery_election_leading", namespace=c.namespace) == 0.0
    assert get(port, "/readyz")[0] == 200  # it takes part: not leading is no problem

    spawned = time.monotonic()
    c.start("w2")
    wait_until(lambda: len(c.backend.candidates(c.namespace)) == 2, 30, "w2 registered")
    registered = time.monotonic()
    leader = c.wait_leader(30)
    led = time.monotonic()
    print(
        f"\neligible worker joining: leads {(led - registered) * 1000:.0f} ms after it "
        f"registered, {led - spawned:.1f} s after its process started"
    )
    assert leader == "w2"
    term = c.lease().term  # type: ignore[union-attr]
    assert waiting.get(timeout=30) == term  # the task that waited ran, on the leader
    runs = [(r.task, r.label, r.worker.split("@")[0], r.term) for r in c.rows(c.runs)]
    assert runs == [("skip", "waiting", "w2", term)]
    assert c.term_owners() == {term: {"w2"}}
    info = _status(c)
    assert info["eligible_candidates"] == 1
    assert {(x["candidate_id"].split("@")[0], x["eligible"]) for x in info["candidates"]} == {  # type: ignore[union-attr, index]
        ("w1", False),
        ("w2", True),
    }
