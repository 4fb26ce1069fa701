"""A burst's sends are the messages stock beat sends, through kombu's memory transport.

The leader sends a burst through the app's router with its queues bound once to the
burst's producer channel (``BurstRouter``). What users rely on must not change: the
message (headers, properties, body), where it is routed (``task_routes``, the entry's
queue, routing key, priority, expires, headers) and the publish signals, one pair per
message. Each test sends the same entries with Celery's plain ``Scheduler.apply_async``
and with the leader's burst, and compares what the broker holds.
"""

from __future__ import annotations

import inspect
import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

import celery.beat
import pytest
from celery import Celery
from celery.beat import Scheduler
from celery.signals import after_task_publish, before_task_publish
from kombu import Exchange, Queue

from celery_election import process as process_module
from celery_election.backends import MemoryBackend
from celery_election.beat import sender as sender_module
from celery_election.beat.publish import FAILED, FENCED, SENT, BurstRouter, Job, Publisher, Reply
from celery_election.core.clock import boottime
from celery_election.election.shared_state import SharedLeadership

from ..support.beat import Due, Leading

NOW = datetime(2026, 11, 26, 12, 0, tzinfo=timezone.utc)
#: Headers the fenced send adds (the task reads them as self.request.election_*).
FENCE_HEADERS = {"election_term", "election_run", "election_rows"}
#: newer Celery marks a beat send with a header of its own (celery.beat's
#: ``celery_beat_task``, in 5.7); 5.3 does not, and then neither does the burst
CELERY_MARKS_BEAT_SENDS = "celery_beat_task" in inspect.getsource(celery.beat)


@pytest.fixture
def shared(monkeypatch: pytest.MonkeyPatch) -> MemoryBackend:
    backend = MemoryBackend()
    monkeypatch.setattr(process_module, "backend_from_url", lambda url, **kw: backend)
    return backend


def registered(x: int) -> int:
    """A task this app knows: beat sends it through ``Task.apply_async``."""
    return x


@pytest.fixture
def app() -> Iterator[Celery]:
    """Queues of each kind, a route, and entries with each routing option."""
    vhost = uuid.uuid4().hex[:8]  # the memory transport's state is per virtual host
    app = Celery(f"t{vhost}", broker=f"memory://localhost/{vhost}", set_as_current=False)
    topic = Exchange("ex.topic", type="topic")
    app.conf.update(
        election_url="memory://",
        election_ttl=30.0,  # never an expiry mid-burst (test_beat.make_app says why)
        task_default_queue="q.default",
        task_queues=[
            Queue("q.default"),
            Queue("q.routed"),
            Queue("q.other", max_priority=10),
            Queue("q.topic", topic, routing_key="topic.#"),
        ],
        task_routes={"t.routed": {"queue": "q.routed"}},
        beat_schedule={
            name: {"task": name, "schedule": Due(), **extra}
            for name, extra in {
                "t.plain": {},
                "t.routed": {},
                "t.queue": {"options": {"queue": "q.other", "priority": 7}},
                "t.topic": {"options": {"queue": "q.topic", "routing_key": "topic.key"}},
                "t.expires": {"options": {"expires": 120}},
                "t.headers": {"options": {"headers": {"x-custom": "yes"}}},
                "t.args": {"args": (1, "two"), "kwargs": {"three": 3.0}},
                "t.registered": {"args": (4,)},
            }.items()
        },
    )
    app.task(name="t.registered", shared=False)(registered)
    app.now = lambda: NOW  # type: ignore[method-assign]  # the same expiry in both sends
    yield app


def drain(app: Celery) -> dict[str, dict[str, Any]]:
    """Every message the broker holds, by task name: where it went and what it is."""
    out: dict[str, dict[str, Any]] = {}
    with app.connection_for_write() as conn:
        channel = conn.default_channel
        for name in app.amqp.queues:
            while (message := channel.basic_get(name, no_ack=True)) is not None:
                headers = dict(message.headers)
                properties = dict(message.properties)
                task_id = headers.pop("id")
                properties.pop("delivery_tag")  # the transport's own, per message
                assert headers.pop("root_id") == properties.pop("correlation_id") == task_id
                fence = {k: headers.pop(k) for k in FENCE_HEADERS if k in headers}
                info = message.delivery_info
                out[headers["task"]] = {
                    "queue": name,
                    "exchange": info["exchange"],
                    "routing_key": info["routing_key"],
                    "headers": headers,
                    "properties": properties,
                    "body": message.body,
                    "content": (message.content_type, message.content_encoding),
                    "fence": fence,
                }
    return out


@pytest.fixture
def signals() -> Iterator[list[tuple[str, dict[str, Any]]]]:
    """Each publish signal as it fired: (which, its keyword arguments)."""
    fired: list[tuple[str, dict[str, Any]]] = []

    def before(**kw: Any) -> None:
        fired.append(("before", kw))

    def after(**kw: Any) -> None:
        fired.append(("after", kw))

    before_task_publish.connect(before, weak=False)
    after_task_publish.connect(after, weak=False)
    yield fired
    before_task_publish.disconnect(before)
    after_task_publish.disconnect(after)


def by_task(fired: list[tuple[str, dict[str, Any]]], which: str) -> dict[str, dict[str, Any]]:
    out = {}
    for kind, kw in fired:
        if kind == which:
            out[kw["headers"]["task"]] = {
                "exchange": kw["exchange"],
                "routing_key": kw["routing_key"],
                "declare": kw.get("declare"),
            }
    return out


def stock_sends(
    app: Celery, signals: list[tuple[str, dict[str, Any]]]
) -> tuple[dict[str, dict[str, Any]], list[tuple[str, dict[str, Any]]]]:
    """What Celery's plain Scheduler sends for every entry, and the signals it fired."""
    stock = Scheduler(app=app)
    try:
        for entry in stock.schedule.values():
            if entry.name in app.conf.beat_schedule:
                stock.apply_async(entry, producer=stock.producer)
    finally:
        stock.close()
    sent, fired = drain(app), list(signals)
    signals[:] = []
    assert sorted(sent) == sorted(app.conf.beat_schedule)
    return sent, fired


def _database_expiry(burst_msg: dict[str, Any], stock_msg: dict[str, Any]) -> None:
    """The burst's ``expires`` is 120 s from the database's now (the memory backend: this
    host's real clock), stock's from the app's (frozen at NOW); the rest is the same."""
    burst_msg["headers"], stock_msg["headers"] = (
        dict(burst_msg["headers"]),
        dict(stock_msg["headers"]),
    )
    burst_msg["properties"] = dict(burst_msg["properties"])
    stock_msg["properties"] = dict(stock_msg["properties"])
    expires = datetime.fromisoformat(burst_msg["headers"].pop("expires")).timestamp()
    assert time.time() + 100 < expires < time.time() + 121
    stock_msg["headers"].pop("expires")
    burst_msg["properties"].pop("expiration"), stock_msg["properties"].pop("expiration")


def assert_sent_as_stock(
    app: Celery,
    sent_stock: dict[str, dict[str, Any]],
    fired_stock: list[tuple[str, dict[str, Any]]],
    signals: list[tuple[str, dict[str, Any]]],
) -> dict[str, dict[str, Any]]:
    """The broker holds stock's messages plus the fence's headers; stock's signals fired."""
    entries = sorted(app.conf.beat_schedule)
    sent_burst = drain(app)
    assert sorted(sent_burst) == entries
    for name in entries:
        stock_msg, burst_msg = dict(sent_stock[name]), dict(sent_burst[name])
        assert burst_msg.pop("fence").keys() == FENCE_HEADERS
        assert stock_msg.pop("fence") == {}
        if name == "t.expires":  # counted on the database's clock (README), not the app's
            _database_expiry(burst_msg, stock_msg)
        assert burst_msg == stock_msg, name
    assert sent_burst["t.queue"]["properties"]["priority"] == 7
    assert sent_burst["t.topic"]["routing_key"] == "topic.key"
    assert sent_burst["t.headers"]["headers"]["x-custom"] == "yes"
    assert sent_burst["t.expires"]["headers"]["expires"] is not None
    if CELERY_MARKS_BEAT_SENDS:  # Celery's own header on a beat send
        assert sent_burst["t.plain"]["headers"]["celery_beat_task"] is True
    # one pair of publish signals per message, with stock's routing and declarations
    assert [k for k, _ in signals] == ["before", "after"] * len(entries)
    for which in ("before", "after"):
        assert by_task(signals, which) == by_task(fired_stock, which)
    return sent_burst


def test_a_burst_sends_what_stock_sends(
    app: Celery,
    shared: MemoryBackend,
    signals: list[tuple[str, dict[str, Any]]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sent_stock, fired_stock = stock_sends(app, signals)

    binds: list[Any] = []
    bind = Queue.bind

    def counting(self: Queue, channel: Any) -> Queue:
        binds.append(self.name)
        return bind(self, channel)  # type: ignore[no-any-return]

    s = Leading(app=app)
    try:
        assert s.wait_for_leadership(5)
        monkeypatch.setattr(Queue, "bind", counting)
        assert s.tick() == 0  # every entry is due: one burst
        assert s._sender.router is None  # the burst's router lives as long as its sends
    finally:
        s.close()
    assert_sent_as_stock(app, sent_stock, fired_stock, signals)
    # each queue bound once for the burst, not once per send (stock: kombu copies it)
    assert binds and sorted(binds) == sorted(set(binds))


def test_a_queue_the_router_builds_per_send_is_bound_once_per_equal_queue(
    app: Celery, shared: MemoryBackend
) -> None:
    """A router function may build a new Queue for each send: equal queues share the
    bound copy (the same declaration), a queue of another name gets its own."""

    def route(name: str, args: Any, kwargs: Any, options: Any, task: Any = None, **kw: Any) -> Any:
        return {"queue": Queue("q.built" if name != "t.plain" else "q.plain")}

    app.conf.task_routes = (route,)
    s = Leading(app=app)
    try:
        assert s.wait_for_leadership(5)
        router = BurstRouter(app.amqp.Router(), s.producer)
        queues = [router.route({}, name)["queue"] for name in ("t.a", "t.b", "t.plain")]
    finally:
        s.close()
    assert queues[0] is queues[1] and queues[0].is_bound
    assert queues[2].name == "q.plain" and queues[2] is not queues[0]


# -- publisher processes (election_beat_publishers) ------------------------------------------


class Inline:
    """Publishers in this process: the real :class:`Publisher` (its fence and Celery's
    send) on the test's memory broker, without the fork (the forked ones:
    tests/integration/test_beat_publishers.py)."""

    made: list[Inline] = []
    alive = True

    def __init__(self, app: Celery, record: SharedLeadership, count: int) -> None:
        self.record = record
        self.publisher = Publisher(app, record)
        self.jobs: list[Job] = []
        Inline.made.append(self)

    def hand(self, jobs: list[Job]) -> tuple[list[Reply], list[Job]]:
        self.jobs += jobs
        return [self.publisher.publish(job) for job in jobs], []

    def collect(self) -> list[Reply]:
        return []

    def close(self) -> list[Reply]:
        self.publisher.close()
        return []


def test_a_burst_through_publishers_sends_what_stock_sends(
    app: Celery,
    shared: MemoryBackend,
    signals: list[tuple[str, dict[str, Any]]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every send of the burst goes through a publisher, fenced by the record that this
    beat's own elector writes, and the broker gets stock's messages."""
    sent_stock, fired_stock = stock_sends(app, signals)
    app.conf.election_beat_publishers = 1
    monkeypatch.setattr(sender_module, "Publishers", Inline)
    s = Leading(app=app)
    try:
        assert s.wait_for_leadership(5)
        record = s._fence.publishers_record
        assert record is not None and record.read().trusted()
        assert s.tick() == 0  # every entry is due: one burst, handed to the publisher
        assert s.tick() > 0
    finally:
        s.close()
    assert s._fence.publishers_record is None  # ended with the beat
    (inline,) = [i for i in Inline.made if i.record is record]
    assert sorted(job.name for job in inline.jobs) == sorted(app.conf.beat_schedule)
    sent = assert_sent_as_stock(app, sent_stock, fired_stock, signals)
    (term,) = {job.term for job in inline.jobs}  # the term that claimed the runs
    assert {m["fence"]["election_term"] for m in sent.values()} == {term}


def test_a_publisher_sends_only_while_the_claiming_term_is_trusted(
    app: Celery, monkeypatch: pytest.MonkeyPatch
) -> None:
    record = SharedLeadership.create(published=False)
    publisher = Publisher(app, record)
    token = uuid.uuid4().hex

    def job(key: int, term: int) -> Job:
        return Job(key, "t.plain", "t.plain", (), {}, {"headers": {"election_term": term}}, term)

    try:
        record.write(5, boottime() + 30, token)
        assert publisher.publish(job(1, 4)) == Reply(
            1, FENCED, checked=pytest.approx(boottime(), abs=5)
        )
        record.write(5, boottime() - 0.001, token)
        assert publisher.publish(job(2, 5)).outcome == FENCED  # its trust ran out
        record.write(None, None)
        assert publisher.publish(job(3, 5)).outcome == FENCED  # no longer leading
        assert drain(app) == {}

        record.write(5, boottime() + 30, token)
        sent = publisher.publish(job(4, 5))
        assert sent.outcome == SENT and sent.task_id is not None
        assert list(drain(app)) == ["t.plain"]

        def broken(*args: Any, **kwargs: Any) -> None:
            raise OSError("the broker went away")

        monkeypatch.setattr(publisher.producer, "publish", broken)
        failed = publisher.publish(job(5, 5))
        assert failed.outcome == FAILED
        assert failed.error is not None and "Couldn't apply scheduled task" in failed.error
    finally:
        publisher.close()
        record.close()


def test_a_send_its_publisher_fenced_is_not_counted_as_sent(
    app: Celery,
    shared: MemoryBackend,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A publisher whose record says another term sends nothing, and the beat says so."""

    class Elsewhere(Inline):
        def __init__(self, app: Celery, record: SharedLeadership, count: int) -> None:
            other = SharedLeadership.create(published=False)
            other.write(1, boottime() + 60, uuid.uuid4().hex)  # a term no claim was made in
            super().__init__(app, other, count)

    app.conf.election_beat_publishers = 1
    monkeypatch.setattr(sender_module, "Publishers", Elsewhere)
    s = Leading(app=app)
    try:
        assert s.wait_for_leadership(5)
        assert s.tick() == 0
        assert s._sender.handed == {}  # every reply was acted on
    finally:
        s.close()
    assert drain(app) == {}
    not_sent = [r for r in caplog.records if "does not lead now; not sent" in r.getMessage()]
    assert len(not_sent) == len(app.conf.beat_schedule)
