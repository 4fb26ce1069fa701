"""The dead-man's switch per entry in a real Prometheus: a worker stops running an entry,
the ``CeleryElectionEntryOverdue`` alert fires; a worker runs it again, the alert resolves.

A standalone ``celery beat`` (LeaderScheduler, entries every second) serves /metrics; its
``celery_election_beat_entry_overdue_seconds`` is judged from the shared database, so the
beat's own sends do not hide a worker that stopped: the runs it sends are not finished.
The shipped rule is loaded as is but for its ``for`` (1 m, checked by ``promtool test
rules``), cut to 2 s here; each wait is bounded by seconds, none sleeps and hopes.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from celery_election.schedule.store import schedule_store
from harness.cluster import Cluster, wait_until

from .test_metrics import free_port
from .test_prometheus import RULES, Prometheus

pytest.importorskip("prometheus_client")
# The second tier (minutes of real servers). RabbitMQ, not kombu's SQLAlchemy transport:
# on kombu 5.3.4 (the floor) a worker takes one message per poll, every 2 s, while the
# beat sends two a second, so the runs pile up unfinished and the entry *is* overdue.
pytestmark = [pytest.mark.slow, pytest.mark.tier2]

ENTRY = "every-second-a"  # tests/e2e/proj.py: schedule 1.0, so its grace is 1 s
ALERT = "CeleryElectionEntryOverdue"


def with_short_for(rules: str) -> str:
    """The alert rules, the overdue rule's ``for: 1m`` cut to 2 s (a test of seconds)."""
    head, rule = rules.split(f"- alert: {ALERT}", 1)
    assert "for: 1m" in rule.split("- alert:", 1)[0]
    return head + f"- alert: {ALERT}" + rule.replace("for: 1m", "for: 2s", 1)


def finished_runs(c: Cluster) -> int:
    store = schedule_store(c.backend)
    assert store is not None
    runs = store.history([f"{c.namespace}-beat"], ENTRY, limit=50)
    return sum(r.finished_at is not None for r in runs)


@pytest.mark.parametrize("cluster", [{"beat": True}], indirect=True)
def test_the_overdue_alert_fires_when_no_worker_runs_an_entry_and_resolves_after(
    cluster: Cluster, tmp_path: Path
) -> None:
    c = cluster
    rules = tmp_path / "alerts.yml"
    rules.write_text(with_short_for(RULES.read_text()))
    port = free_port()
    prom = Prometheus(tmp_path, [port], rules=rules)
    labels = f'namespace="{c.namespace}-beat",entry="{ENTRY}"'
    overdue = f"celery_election_beat_entry_overdue_seconds{{{labels}}}"
    firing = f'count(ALERTS{{alertname="{ALERT}",alertstate="firing",{labels}}}) or vector(0)'
    try:
        c.start("w1", c=1)
        c.start_beat("b1", "--election-metrics-port", str(port))
        c.wait_beat_leader(30)
        # the worker runs the entry and reports its runs' ends: the switch is armed
        wait_until(lambda: finished_runs(c) >= 2, 60, "two finished runs of the entry")
        wait_until(lambda: prom.query(overdue) == 0, 60, "the entry scraped, on time")
        assert prom.query(firing) == 0

        c.signal("w1", signal.SIGTERM)  # no worker runs it now; the beat goes on sending
        c.wait_exit("w1", 30)
        wait_until(lambda: (prom.query(overdue) or 0) > 0, 15, "the entry overdue")
        wait_until(lambda: prom.query(firing) == 1, 15, f"{ALERT} firing")

        c.start("w2", c=1)  # it runs the entry again: the sent runs finish
        wait_until(lambda: prom.query(overdue) == 0, 45, "the entry on time again")
        wait_until(lambda: prom.query(firing) == 0, 15, f"{ALERT} resolved")
    finally:
        prom.close()
