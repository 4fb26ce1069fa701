"""The beat's publisher confirms, awaited per batch (celery_election/beat/confirms.py).

The bookkeeping (which send a delivery tag stands for, what a lost channel leaves) is held
here against a channel that confirms when told to; tests/integration/test_confirms.py runs
the same against RabbitMQ.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from celery_election.beat.confirms import UNTRACKED, Confirms, applies


class Channel:
    """A py-amqp channel as Confirms uses it: confirm mode, the confirm events, publish."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self.events: dict[str, set[Callable[[int, bool], None]]] = {
            "basic_ack": set(),
            "basic_nack": set(),
        }
        self.selected = False
        self.closed = False
        self.out = 0  # the broker's count of publishes on this channel

    def confirm_select(self) -> None:
        if self.connection.dead:
            raise ConnectionResetError("the connection is gone")
        self.selected = True

    def basic_publish(self, *_: Any, fail: bool = False, inside: bool = False) -> None:
        """``inside``: acked before it returns, as kombu's ``confirm_publish`` waits."""
        if fail:
            raise ConnectionError("connection reset (maybe after the frames went out)")
        self.out += 1
        if inside:
            self.ack(self.out, multiple=True)

    def ack(self, tag: int, multiple: bool = False) -> None:
        for cb in list(self.events["basic_ack"]):
            cb(tag, multiple)

    def nack(self, tag: int, multiple: bool = False) -> None:
        for cb in list(self.events["basic_nack"]):
            cb(tag, multiple)

    def close(self) -> None:
        self.closed = True


class Connection:
    """The connection: drain_events runs what the broker answers next (else times out)."""

    def __init__(self) -> None:
        self.answers: list[Callable[[], None]] = []
        self.dead = False
        self.transport = type("T", (), {"driver_type": "amqp"})()

    def channel(self) -> Channel:
        if self.dead:
            raise ConnectionResetError("the connection is gone")
        return Channel(self)

    def drain_events(self, timeout: float) -> None:
        if not self.answers:
            raise TimeoutError("timed out")
        self.answers.pop(0)()


class Producer:
    def __init__(self) -> None:
        self.connection = Connection()
        self.channel = self.connection.channel()

    def revive(self, channel: Channel) -> None:
        self.channel = channel

    def publish(self, **kwargs: Any) -> None:
        self.channel.basic_publish(**kwargs)


def send(c: Confirms[str], producer: Producer, item: str, **kwargs: Any) -> None:
    mark = c.before(producer)
    producer.publish(**kwargs)
    c.after(mark, item)


def test_each_send_waits_for_its_own_tag() -> None:
    p = Producer()
    c: Confirms[str] = Confirms(timeout=5)
    for name in "abcd":
        send(c, p, name)
    assert p.channel.selected and c.pending == 4
    ch = p.channel
    p.connection.answers += [lambda: ch.ack(2, multiple=True), lambda: ch.nack(3)]
    p.connection.answers.append(lambda: ch.ack(4))
    acked, failed = c.wait()
    assert acked == ["a", "b", "d"] and failed == ["c"]
    assert c.wait() == ([], [])


def test_a_confirm_read_inside_the_publish_settles_its_send() -> None:
    """kombu's ``confirm_publish``: py-amqp waits for the ack in the publish (window 1)."""
    p = Producer()
    c: Confirms[str] = Confirms(timeout=5)
    send(c, p, "a")  # confirmed later, in the wait
    send(c, p, "b", inside=True)  # its ack (multiple: "a" too) read before after() came
    send(c, p, "c", inside=True)
    assert c.pending == 0
    assert c.wait() == (["a", "b", "c"], [])


def test_what_is_unanswered_at_the_timeout_failed() -> None:
    p = Producer()
    c: Confirms[str] = Confirms(timeout=5)
    send(c, p, "a")
    send(c, p, "b")
    ch = p.channel
    p.connection.answers.append(lambda: ch.ack(1))  # then nothing more comes
    assert c.wait() == (["a"], ["b"])


def test_a_lost_connection_fails_the_pending_and_a_new_channel_is_used() -> None:
    p = Producer()
    c: Confirms[str] = Confirms(timeout=5)
    send(c, p, "a")
    old = p.channel

    def lost() -> None:
        raise ConnectionResetError("gone")

    p.connection.answers.append(lost)
    assert c.wait() == ([], ["a"])
    send(c, p, "b")
    assert p.channel is not old and p.channel.selected
    new = p.channel
    old.ack(1)  # a confirm the dropped channel still delivers: not b's
    p.connection.answers.append(lambda: new.nack(1))
    assert c.wait() == ([], ["b"])


def test_a_publish_that_raised_leaves_the_channel_untrusted() -> None:
    """Its frames may have gone out: the broker's tags and ours may differ from then on."""
    p = Producer()
    c: Confirms[str] = Confirms(timeout=5)
    send(c, p, "a")
    first = p.channel
    with pytest.raises(ConnectionError):
        send(c, p, "lost", fail=True)
    send(c, p, "b")  # on a new channel, with its own tags
    assert p.channel is not first
    second = p.channel
    first.ack(2, multiple=True)  # ignored: first's sends were failed when it was dropped
    p.connection.answers.append(lambda: second.nack(1))
    assert c.wait() == ([], ["a", "b"])


def test_a_send_revived_onto_another_channel_is_failed() -> None:
    """kombu's retry republishes on a fresh channel, not in confirm mode: no confirm comes."""
    p = Producer()
    c: Confirms[str] = Confirms(timeout=5)
    mark = c.before(p)
    p.revive(p.connection.channel())
    p.publish()
    c.after(mark, "a")
    assert c.wait() == ([], ["a"])


def test_a_send_that_did_not_publish_once_is_failed() -> None:
    """Its tag would be the send's before it (or after it): the confirm of another message."""
    p = Producer()
    c: Confirms[str] = Confirms(timeout=5)
    send(c, p, "x")
    mark = c.before(p)
    c.after(mark, "a")  # nothing went out: tag 1 is x's, not a's
    send(c, p, "b")
    ch = p.channel
    p.connection.answers += [lambda: ch.ack(1), lambda: ch.nack(2)]
    assert c.wait() == (["x"], ["a", "b"])


def test_a_channel_that_cannot_be_armed_leaves_the_send_to_kombu_untracked() -> None:
    """The connection died: arming a channel raises outside kombu's retry; the publish (in
    which kombu reconnects) goes on untracked, failed, and the next send is tracked."""
    p = Producer()
    c: Confirms[str] = Confirms(timeout=5)
    send(c, p, "a")
    dead = p.channel
    p.connection.dead = True
    p.connection.answers.append(lambda: (_ for _ in ()).throw(ConnectionResetError("gone")))
    assert c.wait() == ([], ["a"])  # the wait found the connection gone
    mark = c.before(p)  # a new channel cannot be opened
    assert mark == UNTRACKED
    p.connection.dead = False
    p.revive(p.connection.channel())  # what kombu's retry does inside the publish
    p.publish()
    c.after(mark, "b")
    send(c, p, "c")
    assert p.channel is not dead and p.channel.selected
    ch = p.channel
    p.connection.answers.append(lambda: ch.ack(1))
    assert c.wait() == (["c"], ["b"])


def test_only_amqp_is_confirmed() -> None:
    p = Producer()
    assert applies(p)
    p.connection.transport.driver_type = "redis"
    assert not applies(p)
    assert not applies(None)
