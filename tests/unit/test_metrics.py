"""Metrics: the shared counter table across processes, the exporter, the probes."""

from __future__ import annotations

import json
import os
import threading
import urllib.error
import urllib.request
from typing import Any

import pytest

from celery_election import metrics
from celery_election.backends import backend_from_url
from celery_election.core.clock import boottime
from celery_election.election.elector import Elector

pytest.importorskip("prometheus_client")


@pytest.fixture
def table():
    t = metrics.SharedCounters.create()
    old = metrics.use_counters(t)
    yield t
    metrics.use_counters(old)
    t.close()


def test_counts_of_forked_and_dead_children_add_up(table) -> None:
    k = metrics.key(metrics.TASK, "proj.job", "skipped")
    metrics.count(k)  # the parent's row
    for _ in range(5):  # one after the other, as --max-tasks-per-child replaces them
        pid = os.fork()
        if pid == 0:
            try:
                metrics.count(k, 2)
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
    assert table.snapshot()[k] == 11
    # each child took a free row or a dead one's: rows never run out with replaced children
    owners = [table._words[(table._rows_at + r * table._row_size) // 8] for r in range(64)]
    assert sum(1 for o in owners if o) <= 2


def test_gauges_take_the_largest_value(table) -> None:
    metrics.set_gauge("g:x", 5)
    pid = os.fork()
    if pid == 0:
        metrics.set_gauge("g:x", 7)
        os._exit(0)
    os.waitpid(pid, 0)
    assert table.snapshot()["g:x"] == 7


def test_local_counters_without_a_table() -> None:
    old = metrics.use_counters(metrics.LocalCounters())
    try:
        metrics.count("a")
        metrics.count("a")
        assert metrics.store().snapshot() == {"a": 2}  # type: ignore[union-attr]
    finally:
        metrics.use_counters(old)


def test_count_is_a_no_op_when_off() -> None:
    old = metrics.use_counters(None)
    try:
        metrics.count("a")  # nothing to count into: no error
    finally:
        metrics.use_counters(old)


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_a_forked_child_does_not_keep_the_metrics_port() -> None:
    """A prefork child must not hold the worker's port after the worker closed it (or
    died): a restarted worker binds it again while the old child still runs."""
    server = metrics.MetricsServer(0)
    port = server.port
    r, w = os.pipe()
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: past its fork hooks, alive until the parent is done
        os.close(w)
        os.write(ready_w, b"x")
        os.read(r, 1)
        os._exit(0)
    os.close(r)
    os.close(ready_w)
    try:
        assert os.read(ready_r, 1) == b"x"
        server.close()
        metrics.MetricsServer(port).close()  # free again, with the child still alive
    finally:
        os.close(w)
        os.close(ready_r)
        os.waitpid(pid, 0)


def test_elector_metrics_and_probes(tmp_path) -> None:
    backend = backend_from_url(f"sqlite:///{tmp_path}/e.db")
    backend.install()
    server = metrics.serve(0, host="127.0.0.1")
    e = Elector(backend, "jobs", "me", ttl=2)
    try:
        base = f"http://127.0.0.1:{server.port}"
        assert get(base + "/readyz")[0] == 503  # not started: not taking part yet
        sub = e.subscribe()
        e.start()
        assert e.wait_for_leadership(10)
        # transitions are counted as the dispatcher announces them, before subscribers
        elected = sub.get(timeout=10)
        assert elected is not None and elected.kind == "elected"
        status, body = get(base + "/metrics")
        assert status == 200
        assert 'celery_election_leading{candidate="me",namespace="jobs"} 1.0' in body
        assert 'celery_election_transitions_total{candidate="me",kind="elected"' in body
        assert "celery_election_call_duration_seconds_bucket" in body
        assert "celery_election_trust_left_seconds" in body
        assert 'celery_election_eligible{candidate="me",namespace="jobs"} 1.0' in body
        status, body = get(base + "/readyz")
        assert status == 200 and json.loads(body)["ready"] is True
        # a wedged election thread: held inside its renew, busy for more than 3 ttl (set
        # while it is held: a stepping thread would write its own busy_since over it)
        gate, inside = threading.Event(), threading.Event()
        renew = backend.renew

        def held(*args: Any, **kwargs: Any) -> Any:
            inside.set()
            gate.wait(10)
            return renew(*args, **kwargs)

        backend.renew = held  # type: ignore[method-assign]
        assert inside.wait(10)
        e.stats.busy_since = boottime() - 7
        status, body = get(base + "/healthz")
        assert status == 503 and "busy" in body
        e.stats.busy_since = None
        backend.renew = renew  # type: ignore[method-assign]
        gate.set()
        assert get(base + "/healthz")[0] == 200
        assert get(base + "/nope")[0] == 404
    finally:
        e.stop()
        server.close()
        backend.close()


def test_beat_probe_late_tick() -> None:
    probe = metrics.BeatProbe("ns", grace=2.0)
    now = boottime()
    due = metrics.key(metrics.TICK, "ns", "due")
    start = metrics.key(metrics.TICK, "ns", "start")
    assert probe.check({}, now) is None
    assert probe.check({due: int((now - 1) * 1e6)}, now) is None
    assert "late" in (probe.check({due: int((now - 3) * 1e6)}, now) or "")
    assert "late" in (probe.check({start: int((now - 3) * 1e6)}, now) or "")
    # a sparse schedule: last ticked long ago, next tick announced for later: on time
    last = metrics.key(metrics.TICK, "ns", "last")
    sparse = {last: int((now - 250) * 1e6), due: int((now + 50) * 1e6)}
    assert probe.check(sparse, now) is None
    assert metrics.tick_late(sparse, "ns", now) == 0.0
    assert metrics.tick_late({due: int((now - 3) * 1e6)}, "ns", now) == pytest.approx(3, abs=0.01)
    assert metrics.tick_late({}, "ns", now) is None


def test_missing_client_is_one_line(monkeypatch) -> None:
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(metrics.ConfigurationError) as info:
        metrics.require_client()
    assert "pip install 'celery-election[metrics]'" in str(info.value)
    assert "\n" not in str(info.value)


def test_the_port_setting_is_checked() -> None:
    from celery import Celery

    from celery_election.settings import ElectionSettings

    app = Celery("m", set_as_current=False)
    app.conf.election_metrics_port = "9808"
    with pytest.raises(metrics.ConfigurationError, match="must be a port number"):
        ElectionSettings.from_app(app)
    app.conf.election_metrics_port = 9808
    assert ElectionSettings.from_app(app).metrics_port == 9808
    assert ElectionSettings.from_app(app, metrics_port=1234).metrics_port == 1234


def test_a_port_without_the_client_names_the_extra(monkeypatch) -> None:
    import importlib.util

    from celery import Celery

    from celery_election.settings import ElectionSettings

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    app = Celery("m", set_as_current=False)
    app.conf.election_metrics_port = 9808
    with pytest.raises(metrics.ConfigurationError) as info:
        ElectionSettings.from_app(app)
    assert info.value.problems == [
        "election_metrics_port needs prometheus_client: pip install 'celery-election[metrics]'"
    ]
