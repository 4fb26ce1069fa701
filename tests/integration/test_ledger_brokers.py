"""A broker outage delays the beat's runs and loses none, on RabbitMQ and on Redis.

The leader reaches the broker through a proxy that refuses it: the burst's sends fail, each
run stays pending in the election database and owed; once the broker answers again, each
is sent once, under its run's task id. Counted from the messages in the queue. (RabbitMQ
counts a send once it confirmed it, beat/confirms.py; Redis once its command answered.)
"""

from __future__ import annotations

import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from kombu.simple import SimpleQueue

from harness.proxy import Proxy

from ..conftest import server_url
from ..support.beat import DueOnce, Leading

N = 10


@pytest.fixture(params=["amqp", "redis"])
def broker(request: pytest.FixtureRequest) -> Iterator[tuple[Proxy, str]]:
    proxy, via = Proxy.for_url(server_url(request.param))
    yield proxy, via
    proxy.close()


def make_app(url: str, tmp_path: Path) -> Celery:
    app = Celery("ledger-brokers", broker=url, set_as_current=False)
    app.conf.update(
        election_url=f"sqlite:///{tmp_path}/election.db",
        election_ttl=10.0,
        task_default_queue=f"ledger-{uuid.uuid4().hex[:8]}",
        broker_connection_retry_on_startup=True,
        task_publish_retry_policy={"max_retries": 1, "interval_start": 0.1},
        beat_schedule={
            f"e{i:03d}": {"task": "ledger.noop", "schedule": DueOnce(), "args": (f"e{i:03d}",)}
            for i in range(N)
        },
    )
    return app


def drain(app: Celery) -> list[Any]:
    """Every message in the app's queue (taken off it)."""
    out = []
    with app.connection_for_write() as conn:
        queue = SimpleQueue(conn, app.conf.task_default_queue)
        try:
            while True:
                try:
                    message = queue.get_nowait()
                except queue.Empty:
                    return out
                message.ack()
                out.append(message)
        finally:
            queue.queue.delete()
            queue.close()


def test_a_broker_outage_delays_the_runs_and_loses_none(
    broker: tuple[Proxy, str], tmp_path: Path
) -> None:
    proxy, via = broker
    app = make_app(via, tmp_path)
    s = Leading(app=app)
    try:
        assert s.wait_for_leadership(10)
        assert s.producer.channel is not None  # a running beat: its channel open before it
        proxy.cut(refuse_new=True)
        s.tick()  # the burst: every send fails
        assert s._sender.ledger.owing == N
        assert {p.entry_name for p in s._fence.pending_runs()} == set(app.conf.beat_schedule)
        proxy.resume()
        deadline = time.monotonic() + 60
        while s._sender.ledger.owing and time.monotonic() < deadline:  # after the back-off
            s.tick()
            time.sleep(0.05)
        assert s._sender.ledger.owing == 0
        s._sender.ledger.flush()
        assert s._fence.pending_runs() == []
    finally:
        s.close()
    by_entry: dict[str, set[str]] = defaultdict(set)
    for m in drain(app):
        by_entry[m.payload[0][0]].add(m.headers["id"])  # (args, kwargs, embed)
    assert set(by_entry) == set(app.conf.beat_schedule)  # no run lost
    # Each run under one task id (a copy re-sent after an unconfirmed send is that id
    # again, which the workers run once): no entry was sent as a second run.
    assert {name: len(ids) for name, ids in by_entry.items() if len(ids) > 1} == {}
