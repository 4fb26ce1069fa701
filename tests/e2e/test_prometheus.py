"""A real Prometheus scrapes three ``celery worker --election -B``: one leader in the sum,
and after SIGKILL of the leader, one again under a greater term. The alert rules load."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from celery_election import Elector, MemoryBackend, metrics
from harness.cluster import ROOT, Cluster, wait_until

from ..conftest import tool
from .test_metrics import free_port

pytest.importorskip("prometheus_client")
pytestmark = [pytest.mark.slow]

HINT = "apt-get install prometheus; scripts/services-up does it"
RULES = ROOT / "examples/prometheus/alerts.yml"


def test_promtool_loads_the_alert_rules() -> None:
    promtool = tool("/usr/bin/promtool", HINT)
    proc = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS: 8 rules found" in proc.stdout


def test_each_alert_fires_on_its_series_and_not_on_healthy_ones() -> None:
    """``promtool test rules``: alerts_test.yml feeds each alert the series it is for (and a
    sparse schedule, which must not page)."""
    promtool = tool("/usr/bin/promtool", HINT)
    tests = RULES.with_name("alerts_test.yml")
    proc = subprocess.run(
        [promtool, "test", "rules", tests.name], capture_output=True, text=True, cwd=tests.parent
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    tested = {line.split("alertname:")[1].strip() for line in tests.read_text().splitlines()
              if "alertname:" in line}  # fmt: skip
    assert len(tested) == 8  # every rule in alerts.yml


def test_promtool_finds_nothing_to_lint_in_the_metrics() -> None:
    """Prometheus' own linter on a /metrics body with every family populated: base units,
    ``_total`` on counters, help text on each (``promtool check metrics`` exits 3 on any)."""
    promtool = tool("/usr/bin/promtool", HINT)
    old = metrics.use_counters(metrics.LocalCounters())
    elector = Elector(MemoryBackend(), "lint", "me", ttl=2)
    remove = metrics.add_overdue_source(lambda: {("lint-beat", "nightly"): 12.5})
    try:
        metrics.count(metrics.key(metrics.TASK, "proj.report", "skipped"))
        for what in ("claimed", "sent", "refused", "publish_failed", "held", "missed",
                     "skipped_overlap", "run_now", "late_ms"):  # fmt: skip
            metrics.count(metrics.key(metrics.BEAT, "lint-beat", "nightly", what))
        metrics.mark_tick("lint-beat", 1.0)
        elector.start()
        assert elector.wait_for_leadership(10)
        body, _ = metrics.render()
    finally:
        remove()
        elector.stop()
        metrics.use_counters(old)
    families = {line.split()[2] for line in body.decode().splitlines() if line.startswith("# TYPE")}
    assert len(families) == 25, sorted(families)  # every metric in the README's table
    proc = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True)
    assert proc.returncode == 0, (proc.stdout + proc.stderr).decode()


class Prometheus:
    def __init__(self, tmp: Path, targets: list[int], rules: Path = RULES) -> None:
        binary = tool("/usr/bin/prometheus", HINT)
        self.port = free_port()
        config = tmp / "prometheus.yml"
        addresses = json.dumps([f"127.0.0.1:{p}" for p in targets])
        config.write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            f"rule_files: [{json.dumps(str(rules))}]\n"
            "scrape_configs:\n"
            "  - job_name: workers\n"
            "    scrape_timeout: 900ms\n"
            f"    static_configs: [{{targets: {addresses}}}]\n"
        )
        self.log = (tmp / "prometheus.log").open("w")
        self.proc = subprocess.Popen(
            [binary, f"--config.file={config}", f"--web.listen-address=127.0.0.1:{self.port}",
             f"--storage.tsdb.path={tmp / 'tsdb'}"],
            stdout=self.log, stderr=subprocess.STDOUT,
        )  # fmt: skip

    def query(self, expr: str, *, any_value: bool = False) -> float | None:
        """The value of a scalar-like instant query, or None (no result yet).

        ``any_value``: a result whose value is not a number (NaN: 0/0) still counts.
        """
        url = f"http://127.0.0.1:{self.port}/api/v1/query?" + urllib.parse.urlencode(
            {"query": expr}
        )
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                result = json.load(r)["data"]["result"]
        except OSError:
            return None
        if not result:
            return None
        value = float(result[0]["value"][1])
        return 0.0 if any_value and value != value else value

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


@pytest.fixture
def ports() -> list[int]:
    return [free_port() for _ in range(3)]


@pytest.fixture
def prometheus(tmp_path: Path, ports: list[int]) -> Iterator[Prometheus]:
    p = Prometheus(tmp_path, ports)
    try:
        yield p
    finally:
        p.close()


@pytest.mark.parametrize("cluster", [{"kind": "sqla+sqlite", "beat": True}], indirect=True)
def test_prometheus_sees_one_leader_before_and_after_a_kill(
    cluster: Cluster, prometheus: Prometheus, ports: list[int]
) -> None:
    c, prom = cluster, prometheus
    names = ["w1", "w2", "w3"]
    for n, (name, port) in enumerate(zip(names, ports, strict=True)):
        c.start(name, "-B", "--election-metrics-port", str(port))
        if n == 0:
            c.wait_candidates(1)  # the sqla transport creates its queue rows without a lock
    c.wait_candidates(3)
    leader = c.wait_leader(30)
    ns = c.namespace
    wait_until(lambda: prom.query('sum(up{job="workers"})') == 3, 60, "three targets up")
    leading = f'sum(celery_election_leading{{namespace="{ns}"}})'
    leader_term = f'max(celery_election_term{{namespace="{ns}"}} * celery_election_leading)'
    wait_until(lambda: prom.query(leading) == 1, 60, "sum(celery_election_leading) == 1")
    first = wait_until(lambda: prom.query(leader_term), 30, "the leader's term")

    c.workers[leader].signal_group(signal.SIGKILL)
    new = c.wait_leader(60, other_than=leader)
    assert new != leader
    wait_until(lambda: prom.query('sum(up{job="workers"})') == 2, 60, "the killed target down")
    wait_until(
        lambda: prom.query(leading) == 1 and (prom.query(leader_term) or 0) > first,
        60,
        "one leader again under a greater term",
    )


DASHBOARD = ROOT / "examples/prometheus/grafana-dashboard.json"


def dashboard_queries() -> list[tuple[str, str]]:
    """(where, PromQL) of every panel target and annotation of the Grafana dashboard."""
    board = json.loads(DASHBOARD.read_text())
    out = [(f"panel {p['title']!r}", t["expr"]) for p in board["panels"] for t in p["targets"]]
    out += [(f"annotation {a['name']!r}", a["expr"]) for a in board["annotations"]["list"]]
    return out


def alert_queries() -> list[tuple[str, str]]:
    """(alert, PromQL) of every alert rule, each comparison made ``bool``.

    A healthy cluster fires no alert, so the condition itself returns nothing: with
    ``bool`` it returns 0 or 1 for every series it compares, which proves the series it
    reads exist under those names and labels.
    """
    import yaml

    rules = yaml.safe_load(RULES.read_text())["groups"][0]["rules"]
    return [
        (f"alert {r['alert']}", re.sub(r"\s(>=|<=|==|!=|>|<)\s+(?=[\d.])", r" \1 bool ", r["expr"]))
        for r in rules
    ]


def grafana(expr: str) -> str:
    """A dashboard query as Grafana sends it: all namespaces, a rate window of 30 s."""
    return expr.replace("$namespace", ".+").replace("$__rate_interval", "30s")


def test_the_dashboard_has_every_view_the_issue_names() -> None:
    text = " ".join(e for _, e in dashboard_queries())
    for metric in (
        "celery_election_leading", "celery_election_transitions_total",
        "celery_election_call_duration_seconds_bucket", "celery_election_beat_runs_sent_total",
        "celery_election_beat_runs_refused_total", "celery_election_beat_runs_missed_total",
        "celery_election_beat_late_seconds_total", "celery_election_beat_tick_late_seconds",
        "celery_election_leader_tasks_total", "celery_election_beat_entry_overdue_seconds",
    ):  # fmt: skip
        assert metric in text, metric


@pytest.mark.tier2
@pytest.mark.parametrize("cluster", [{"beat": True}], indirect=True, ids=["rabbitmq+postgresql"])
def test_every_dashboard_and_alert_query_returns_data_from_a_real_worker_and_beat(
    cluster: Cluster, tmp_path: Path
) -> None:
    """A real Prometheus scrapes a ``celery worker --election`` and a standalone ``celery
    beat``: each query of the dashboard and of the alert rules returns data."""
    c = cluster
    worker, beat = free_port(), free_port()
    prom = Prometheus(tmp_path, [worker, beat])
    try:
        name = f"w{c.namespace}"  # a node name no other run on the shared broker has
        c.start(name, "--election-metrics-port", str(worker))
        c.start_beat("b1", "--election-metrics-port", str(beat))
        c.wait_leader(30)
        c.wait_beat_leader(30)
        tick = "tests.e2e.proj.tick"
        setup = ("--args",)
        # runs the policies drop, a run sent late by design, a send that fails, a run now
        c.schedule_cli("add", "overlap", tick, "every 1s", *setup, '["overlap", 2.5]',
                       "--overlap", "skip", actor="e2e")  # fmt: skip
        c.schedule_cli("add", "strict", tick, "every 1s", *setup, '["strict"]', "--grace",
                       "0.001", actor="e2e")  # fmt: skip
        c.schedule_cli("add", "broken", tick, "every 2s", *setup, '["broken"]', "--options",
                       '{"serializer": "no-such-serializer"}', actor="e2e")  # fmt: skip
        c.schedule_cli("add", "rare", tick, "every 1h", *setup, '["rare"]', actor="e2e")

        # missed whatever the tick's precision (a run 1 ms late, strict's grace, needs a tick
        # that late): added disabled, the beat never sends it; paused across a due time on
        # the database's clock, resumed skipping it
        def db_now() -> int:
            lease = c.backend.current(c.namespace)
            assert lease is not None
            return lease.db_now_us

        c.schedule_cli("add", "paused", tick, "every 1s", *setup, '["paused"]', "--disabled",
                       actor="e2e")  # fmt: skip
        added = db_now()
        c.schedule_cli("pause", "paused", actor="e2e")
        c.schedule_cli("enable", "paused", actor="e2e")
        c.schedule_cli("run", "rare", actor="e2e")
        for i in range(3):
            c.send("skip", f"p{i}", queue=c.own_queue(name))
        wait_until(lambda: prom.query('sum(up{job="workers"})') == 2, 60, "both targets up")
        wait_until(lambda: db_now() > added + 1_500_000, 10, "a due time of paused passed")
        c.schedule_cli("resume", "paused", "--missed", "skip", actor="e2e")
        # a failover for the failover views: the worker's term resigned, elected anew
        leading = f'sum(celery_election_leading{{namespace="{c.namespace}"}})'
        wait_until(lambda: prom.query(leading) == 1, 60, "the leader scraped")
        resigned = subprocess.run(
            [sys.executable, "-m", "celery", "-A", "tests.e2e.proj", "election", "resign"],
            cwd=c.tmp, env=c.env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert resigned.returncode == 0, resigned.stdout + resigned.stderr
        queries = [(w, grafana(e)) for w, e in dashboard_queries()] + alert_queries()
        empty: dict[str, str] = dict(queries)

        def all_answer() -> bool:
            for where, expr in list(empty.items()):
                if prom.query(expr, any_value=True) is not None:
                    del empty[where]
            return not empty

        try:
            wait_until(all_answer, 90, "data for every query")
        except AssertionError:
            raise AssertionError(f"no data for {json.dumps(empty, indent=1)}") from None
        board, alerts = len(dashboard_queries()), len(alert_queries())
        print(f"{len(queries)} queries answered: {board} of the dashboard, {alerts} alerts")
        for what in ("missed", "skipped_overlap", "run_now", "publish_failed"):
            total = f"sum(celery_election_beat_runs_{what}_total)"
            assert (prom.query(total) or 0) > 0, f"{what}: nothing counted"
    finally:
        prom.close()
