"""``election_beat_publishers`` for real: forked publisher processes, on RabbitMQ.

A leading beat forks its publishers when it sets its schedule up and hands them each
batch's sends. What the user must see: every run sent once, from the publishers'
processes (the ``origin`` Celery stamps on a message: ``gen<pid>@<host>``), and a publisher
that dies costs no run and no second send: the sends it held are owed, and the beat
sends them and the rest by itself. (The messages and the fence, in process:
tests/unit/test_burst_publish.py.)
"""

from __future__ import annotations

import json
import logging
import os
import signal
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from amqp.exceptions import NotFound
from celery import Celery
from celery.signals import before_task_publish
from kombu import Queue

from celery_election.core.clock import boottime

from ..conftest import server_url
from ..support.beat import Due, Leading

N = 120


@pytest.fixture
def app(tmp_path: Path) -> Iterator[Celery]:
    queue = f"publishers-{uuid.uuid4().hex[:8]}"
    app = Celery("publishers", broker=server_url("amqp"), set_as_current=False)
    app.conf.update(
        election_url=f"sqlite:///{tmp_path}/election.db",
        election_ttl=10.0,
        # Trust is not this test's subject: on a loaded machine the lock thread's pings
        # starved past the 1 s liveness delta and trust ended mid-burst ("does not lead").
        election_liveness=False,
        election_beat_publishers=2,
        task_default_queue=queue,
        broker_connection_retry_on_startup=True,
        beat_schedule={
            f"e{i:03d}": {"task": "publishers.noop", "schedule": Due(), "args": (f"e{i:03d}",)}
            for i in range(N)
        },
    )
    yield app
    with app.connection_for_write() as conn:
        conn.default_channel.queue_delete(queue)  # no error if it was never declared


def sent(app: Celery) -> list[tuple[str, int]]:
    """Every message in the app's queue: (the entry it was sent for, the sender's pid)."""
    out: list[tuple[str, int]] = []
    with app.connection_for_write() as conn:
        channel = conn.default_channel
        try:
            channel.queue_declare(app.conf.task_default_queue, passive=True)
        except NotFound:  # nothing was ever sent to it
            return out
        while (m := channel.basic_get(app.conf.task_default_queue, no_ack=True)) is not None:
            args, _, _ = json.loads(m.body)
            origin = m.headers["origin"]  # gen<pid>@<host>: the process that published it
            out.append((args[0], int(origin.split("@", 1)[0].removeprefix("gen"))))
    return out


def burst(s: Leading) -> None:
    """Lead, then tick until the burst is over (a tick that answers a wait)."""
    assert s.wait_for_leadership(10)
    for _ in range(10):
        if s.tick() > 0:
            return
    raise AssertionError("the burst did not end in 10 ticks")


def test_publishers_send_each_run_once_from_their_own_processes(app: Celery) -> None:
    s = Leading(app=app)
    try:
        assert s._sender.publishers is not None
        pids = {child.proc.pid for child in s._sender.publishers._all}
        burst(s)
    finally:
        s.close()
    messages = sent(app)
    assert Counter(name for name, _ in messages) == Counter(list(app.conf.beat_schedule))
    assert {pid for _, pid in messages} == pids  # both publishers, never the beat
    assert os.getpid() not in pids


def test_a_dead_publisher_costs_no_second_send_and_the_beat_sends_on(
    app: Celery, caplog: pytest.LogCaptureFixture
) -> None:
    """One of two publishers is gone before the burst: the beat sends its share, once."""
    s = Leading(app=app)
    try:
        assert s._sender.publishers is not None
        dead, alive = s._sender.publishers._all
        os.kill(dead.proc.pid, signal.SIGKILL)
        dead.proc.join(10)
        burst(s)
    finally:
        s.close()
    messages = sent(app)
    assert Counter(name for name, _ in messages) == Counter(list(app.conf.beat_schedule))
    assert {pid for _, pid in messages} == {alive.proc.pid, os.getpid()}
    assert f"publisher pid {dead.proc.pid}: it could not be reached" in caplog.text
    assert "the others go on" in caplog.text


def test_sends_a_publisher_held_when_it_died_are_sent_again_by_the_beat(
    app: Celery, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The sends a publisher had not answered for are owed: the beat sends them itself
    after a back-off, each under its run's task id (a worker runs a task id once)."""
    app.conf.election_beat_publishers = 1
    hold = tmp_path / "hold"
    hold.touch()
    beat = os.getpid()

    def held(**kwargs: Any) -> None:  # in the publisher (forked with it): wait, then die
        while os.getpid() != beat and hold.exists():
            os.sched_yield()

    before_task_publish.connect(held, weak=False)
    try:
        s = Leading(app=app)
    finally:
        before_task_publish.disconnect(held)
    try:
        assert s._sender.publishers is not None
        (child,) = s._sender.publishers._all
        assert s.wait_for_leadership(10)
        with caplog.at_level(logging.ERROR):
            assert s.tick() == 0  # the burst, handed to the publisher (held at its first)
            os.kill(child.proc.pid, signal.SIGKILL)
            child.proc.join(10)
            assert s.tick() > 0  # nothing else due: the replies owed are collected
        assert s._sender.handed == {}
        assert s._sender.ledger.owing == N
        deadline = boottime() + 20
        while s._sender.ledger.owing and boottime() < deadline:  # after the back-off
            s.tick()
            time.sleep(0.05)
    finally:
        hold.unlink()
        s.close()
    messages = sent(app)
    assert Counter(name for name, _ in messages) == Counter(list(app.conf.beat_schedule))
    assert {pid for _, pid in messages} == {beat}
    assert f"{N} sends it held may or may not have gone out" in caplog.text


@pytest.mark.parametrize("publishers", [0, 1], ids=["beat", "publisher"])
def test_a_run_the_broker_refused_stays_pending_and_owed(app: Celery, publishers: int) -> None:
    """With publisher confirms, a message RabbitMQ refuses (a nack) is an error, not a
    send: the run stays pending in the database and owed by the beat. Without them the
    publish returned as the message left, and the run was marked sent and lost."""
    app.conf.election_beat_publishers = publishers
    refusing = {"x-max-length": 0, "x-overflow": "reject-publish"}  # nacks every message
    app.conf.task_queues = [Queue(app.conf.task_default_queue, queue_arguments=refusing)]
    s = Leading(app=app)
    try:
        burst(s)
        assert s._sender.ledger.owing == N
        assert {p.entry_name for p in s._fence.pending_runs()} == set(app.conf.beat_schedule)
    finally:
        s.close()
