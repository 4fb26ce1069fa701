"""The beat's publisher confirms against RabbitMQ: a batch's sends, then their confirms.

tests/unit/test_confirms.py holds the bookkeeping to a scripted channel; here the broker
answers: every message of a batch acked in one wait, or every one nacked (a queue that
rejects publishes) and failed; in either of RabbitMQ's confirm modes (with
``broker_transport_options={"confirm_publish": True}``, py-amqp reads each ack inside the
publish, before :meth:`Confirms.after` is called: window 1 of issue 52).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from amqp.exceptions import MessageNacked
from kombu import Connection, Exchange, Producer, Queue

from celery_election.beat.confirms import Confirms, applies

from ..conftest import server_url

N = 2000


@pytest.fixture(params=[False, True], ids=["confirms-batched", "confirm_publish"])
def conn(request: pytest.FixtureRequest) -> Iterator[Connection]:
    """Either confirm mode: kombu's ``confirm_publish`` reads each ack inside the publish."""
    options = {"confirm_publish": request.param}
    with Connection(server_url("amqp"), transport_options=options) as c:  # type: ignore[no-untyped-call]
        yield c


def publish_batch(conn: Connection, queue: Queue) -> tuple[list[int], list[int]]:
    producer = Producer(conn.channel(), exchange=Exchange(""), auto_declare=False)
    assert applies(producer)
    confirms: Confirms[int] = Confirms(timeout=30)
    raised = []
    for i in range(N):
        mark = confirms.before(producer)
        try:
            producer.publish({"i": i}, routing_key=queue.name)
        except MessageNacked:  # confirm_publish: a nack raises in the publish (the beat owes it)
            raised.append(i)
            continue
        confirms.after(mark, i)
    acked, failed = confirms.wait()
    return acked, failed + raised


def test_a_batch_is_confirmed_in_one_wait(conn: Connection) -> None:
    queue = Queue(f"confirms.{uuid.uuid4().hex[:8]}", auto_delete=False)
    queue(conn.default_channel).declare()
    try:
        acked, failed = publish_batch(conn, queue)
        assert sorted(acked) == list(range(N)) and failed == []
        assert queue(conn.default_channel).queue_declare(passive=True).message_count == N
    finally:
        queue(conn.default_channel).delete()


def test_a_batch_the_broker_refuses_is_failed(conn: Connection) -> None:
    refusing = {"x-max-length": 0, "x-overflow": "reject-publish"}  # nacks every message
    queue = Queue(f"confirms.{uuid.uuid4().hex[:8]}", queue_arguments=refusing)
    queue(conn.default_channel).declare()
    try:
        acked, failed = publish_batch(conn, queue)
        assert acked == [] and sorted(failed) == list(range(N))
    finally:
        queue(conn.default_channel).delete()
