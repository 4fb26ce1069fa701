"""Singleton tasks' metrics: runs by outcome, keys held, waits for dead holders, hold time.

Counted by real (eager) runs into a store and read back from /metrics' text, as a scrape
reads them; another ``KeyHolder`` on the same memory backend plays the other worker.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery
from prometheus_client.parser import text_string_to_metric_families

from celery_election import metrics
from celery_election.backends import MemoryBackend
from celery_election.core.keys import holder_lock_name
from celery_election.election.holder import KeyHolder
from celery_election.keys.singleton import singleton_task

from ..support.singleton_holders import DELTA, app, backend, other

__all__ = ["app", "backend", "other"]  # the fixtures, used by name


@pytest.fixture(autouse=True)
def counters() -> Iterator[None]:
    """Counts into a store of the test's own."""
    old = metrics.use_counters(metrics.LocalCounters())
    try:
        yield
    finally:
        metrics.use_counters(old)


def scrape() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of /metrics' singleton families, by name and labels."""
    body, _ = metrics.render()
    out = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            if s.name.startswith("celery_election_singleton_"):
                out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(name: str, task: str, **labels: str) -> float:
    key = (f"celery_election_singleton_{name}", tuple(sorted({"task": task, **labels}.items())))
    return scrape()[key]


def test_runs_busy_outcomes_held_keys_and_hold_time(app: Celery, other: KeyHolder) -> None:
    name = f"unit.m{uuid.uuid4().hex[:6]}"
    during: list[float] = []

    @singleton_task(app=app, name=name, bind=True, on_busy="skip")
    def report(self: Any, account: int) -> int:
        during.append(value("keys_held", name))
        return account

    assert report.apply((1,)).get() == 1
    assert during == [1.0]  # held while it ran
    assert value("tasks_total", name, outcome="run") == 1
    assert value("keys_held", name) == 0  # and given back
    assert value("hold_seconds_total", name) >= 0
    assert other.acquire(str(report.key_for((2,), {}))) is not None
    report.apply((2,))
    report.apply((2,))
    assert value("tasks_total", name, outcome="skipped") == 2
    assert value("tasks_total", name, outcome="run") == 1
    for outcome in ("requeued", "raised"):  # exported as 0 before the first one
        assert value("tasks_total", name, outcome=outcome) == 0
    assert value("waits_total", name) == 0


@pytest.mark.parametrize("mode, outcome", [("raise", "raised"), ("requeue", "requeued")])
def test_each_busy_mode_counts_its_outcome(
    app: Celery, other: KeyHolder, mode: str, outcome: str
) -> None:
    name = f"unit.m{uuid.uuid4().hex[:6]}"

    @singleton_task(app=app, name=name, on_busy=mode, requeue_delay=0, max_retries=0)
    def task(account: int) -> int:
        return account

    assert other.acquire(str(task.key_for((1,), {}))) is not None
    task.apply((1,))
    assert value("tasks_total", name, outcome=outcome) >= 1
    assert value("tasks_total", name, outcome="run") == 0


def test_a_dead_holders_key_counts_a_wait_and_its_seconds(
    app: Celery, backend: MemoryBackend, other: KeyHolder
) -> None:
    name = f"unit.m{uuid.uuid4().hex[:6]}"

    @singleton_task(app=app, name=name, on_busy="raise")
    def task(account: int) -> int:
        return account

    seen = other.acquire(str(task.key_for((1,), {})))
    assert seen is not None
    assert backend.kill_liveness(holder_lock_name(seen.incarnation.token))  # it crashed
    assert task.apply((1,)).get() == 1
    assert value("waits_total", name) == 1
    assert value("wait_seconds_total", name) >= DELTA  # its delta, waited out
    assert value("tasks_total", name, outcome="run") == 1
