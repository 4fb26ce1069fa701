"""ElectionStep on a fake worker: the shared record, the signals, the leader queue."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery

from celery_election import init_app
from celery_election.election import shared_state
from celery_election.election.elector import RevokeReason
from celery_election.election.shared_state import ENV_VAR, SharedLeadership, TrustRecord
from celery_election.integration.bootstep import ElectionStep
from celery_election.signals import leader_elected, leader_revoked

from ..support.apps import new_app


@pytest.fixture
def step(clean_env: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Any]:
    """An enabled ElectionStep on a fake worker (app, hostname; no consumer), not started."""
    monkeypatch.chdir(tmp_path)
    app = init_app(new_app(election_namespace="sig-ns"))
    worker = SimpleNamespace(app=app, hostname="w1@host")
    s = ElectionStep(worker, election=True)
    try:
        yield s
    finally:
        s.shutdown(worker)
        assert s.shared is None


def test_disabled_step_does_nothing(clean_env: None) -> None:
    worker = SimpleNamespace(app=init_app(new_app()), hostname="w")
    s = ElectionStep(worker)
    assert s.enabled is False
    assert s.shared is None
    assert not hasattr(worker, "election")
    assert shared_state.current() is None


def test_a_metrics_port_without_an_election_warns(
    clean_env: None, caplog: pytest.LogCaptureFixture
) -> None:
    worker = SimpleNamespace(app=init_app(new_app()), hostname="w")
    with caplog.at_level("WARNING", logger="celery_election"):
        s = ElectionStep(worker, election_metrics_port=9808)
    assert s.enabled is False and s.server is None
    (line,) = [r.getMessage() for r in caplog.records if "metrics_port" in r.getMessage()]
    assert "nothing is served" in line and "--election" in line


def test_enabled_step_publishes_not_leader_before_start(step: Any) -> None:
    assert step.worker.election is step
    shared: SharedLeadership = step.shared
    assert shared is not None
    assert shared_state.current() is shared
    assert shared.read() == TrustRecord(False, None, 0.0)
    assert os.environ[ENV_VAR] == shared.path
    info = step.info()
    assert info["namespace"] == "sig-ns"
    assert info["leader"] is False
    assert info["leader_queue"] == "election-leader.sig-ns"


def test_signals_deliver_term_and_namespace(step: Any) -> None:
    got: list[tuple[str, dict[str, Any]]] = []

    def on_elected(sender: Any, **kwargs: Any) -> None:
        got.append(("elected", {"sender": sender, **kwargs}))

    def on_revoked(sender: Any, **kwargs: Any) -> None:
        got.append(("revoked", {"sender": sender, **kwargs}))

    leader_elected.connect(on_elected, weak=False)
    leader_revoked.connect(on_revoked, weak=False)
    try:
        step._elected(41)
        step._revoked(41, RevokeReason.EXPIRED)
        step._revoked(41, RevokeReason.RESIGNED)
    finally:
        leader_elected.disconnect(on_elected)
        leader_revoked.disconnect(on_revoked)
    assert [name for name, _ in got] == ["elected", "revoked", "revoked"]
    elected, expired, resigned = (kw for _, kw in got)
    assert elected["sender"] == "w1@host"
    assert (elected["term"], elected["namespace"]) == (41, "sig-ns")
    assert (expired["term"], expired["namespace"], expired["reason"]) == (41, "sig-ns", "expired")
    assert resigned["reason"] == "resigned"
    assert "signal" in elected  # Celery adds the signal itself


def test_signal_receiver_errors_do_not_escape(step: Any, caplog: pytest.LogCaptureFixture) -> None:
    """A failing receiver must not break the elector's event thread (Celery logs it)."""
    raised: list[tuple[str, int]] = []
    received: list[tuple[str, int]] = []

    def broken(sender: Any, **kwargs: Any) -> None:
        raised.append((kwargs["signal"].name, kwargs["term"]))
        raise RuntimeError("receiver bug")

    def healthy(sender: Any, **kwargs: Any) -> None:
        received.append((kwargs["signal"].name, kwargs["term"]))

    consumer = FakeConsumer(step.worker.app, started=True)
    step.worker.consumer = consumer
    signals = (leader_elected, leader_revoked)
    for signal in signals:
        signal.connect(broken, weak=False)  # first: a receiver after it must still run
        signal.connect(healthy, weak=False)
    try:
        # the event thread's callbacks: each returns, though a receiver raised inside
        step._elected(1)
        step._revoked(1, RevokeReason.LOST)
    finally:
        for signal in signals:
            signal.disconnect(broken)
            signal.disconnect(healthy)
    assert raised == [("leader_elected", 1), ("leader_revoked", 1)]
    assert received == raised
    consumer.run_soon()  # and the leader queue still followed leadership
    assert consumer.added == consumer.cancelled == ["election-leader.sig-ns"]
    logged = [r for r in caplog.records if "receiver bug" in r.getMessage()]
    assert len(logged) == 2 and all(r.levelname == "ERROR" for r in logged)


class FakeConsumer:
    def __init__(self, app: Celery, started: bool) -> None:
        self.app = app
        self.task_consumer = object() if started else None
        self.soon: list[Callable[[], None]] = []
        self.added: list[str] = []
        self.cancelled: list[str] = []

    def call_soon(self, fn: Callable[[], None]) -> None:
        self.soon.append(fn)

    def add_task_queue(self, queue: str) -> None:
        self.added.append(queue)

    def cancel_task_queue(self, queue: str) -> None:
        self.cancelled.append(queue)

    def run_soon(self) -> None:
        soon, self.soon = self.soon, []
        for fn in soon:
            fn()


def test_leader_queue_follows_leadership_on_a_running_consumer(step: Any) -> None:
    consumer = FakeConsumer(step.worker.app, started=True)
    step.worker.consumer = consumer
    step._elected(5)
    assert consumer.added == []  # only through call_soon: the consumer's own thread
    consumer.run_soon()
    assert consumer.added == ["election-leader.sig-ns"]
    step._revoked(5, RevokeReason.LOST)
    consumer.run_soon()
    assert consumer.cancelled == ["election-leader.sig-ns"]


def test_leader_queue_selected_before_the_consumer_starts(step: Any) -> None:
    app = step.worker.app
    consumer = FakeConsumer(app, started=False)
    step.worker.consumer = consumer
    queues = app.amqp.queues
    step._elected(5)
    consumer.run_soon()
    assert "election-leader.sig-ns" in {q.name for q in queues.consume_from.values()}
    step._revoked(5, RevokeReason.LOST)
    consumer.run_soon()
    assert "election-leader.sig-ns" not in {q.name for q in queues.consume_from.values()}
