"""Publisher confirms, awaited per batch: a burst's messages go out, then their acks come in.

A run is confirmed (its row: sent) only once RabbitMQ accepted its message (docs/beat.md). py-amqp's
``confirm_publish`` waits for each message's confirm before the next publish: a round trip
per message (10,000 sends took 14.5 s, against 5 s unconfirmed). Here the beat's channel
is put in confirm mode once, each publish gets the delivery tag the broker counts for it
(1, 2, ... per channel), and :meth:`Confirms.wait` drains the confirms of everything out.
What is acked is sent; what is nacked, or unanswered when the connection is lost or
``timeout`` passes, is failed, and owed again under the same task id (a copy that did
arrive is one task id, which workers run once).

With kombu's ``confirm_publish`` (``broker_transport_options``), py-amqp waits for each
message's confirm inside the publish, before :meth:`Confirms.after` knows the send: that
confirm is kept for the publish in progress and settles the send when ``after`` comes
(unkept, every send counted as unconfirmed and was sent again forever).

A tag is trusted only while every publish on the channel went through this count: a
publish that raised may have left frames on the wire, so the channel's tags are then
uncertain, its pending sends are failed, and the next batch uses a new channel. Other
transports answer each command (Redis's reply): :func:`applies` is False for them.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from typing import Any, Generic, TypeVar

__all__ = ["Confirms", "applies"]

T = TypeVar("T")

#: The mark of a publish that is not tracked: no count of publishes is one more than it.
UNTRACKED = -2
#: Seconds a batch waits for its confirms; what is unanswered then is failed (owed).
TIMEOUT = 10.0


def applies(producer: Any) -> bool:
    """Whether ``producer`` publishes to RabbitMQ (py-amqp), where confirms are asked for."""
    try:
        return bool(producer.connection.transport.driver_type == "amqp")
    except AttributeError:  # no producer (Celery's own pool is used): nothing to confirm
        return False


class Confirms(Generic[T]):
    """The confirms of one producer's channel: the sends they stand for, by delivery tag."""

    def __init__(self, timeout: float = TIMEOUT) -> None:
        self.timeout = timeout
        self._channel: Any = None
        self._published = 0  # publishes on the armed channel: the last one's tag
        self._uncertain = False  # a publish raised: the channel's tags cannot be trusted
        self._publishing = False  # a publish is in progress (its tag: _published + 1)
        self._early: bool | None = None  # its confirm, read inside it (confirm_publish)
        self._pending: dict[int, T] = {}
        self._acked: list[T] = []
        self._failed: list[T] = []

    @property
    def pending(self) -> int:
        return len(self._pending)

    def before(self, producer: Any) -> int:
        """Ready ``producer``'s channel for a tracked publish; the count to pass to after().

        UNTRACKED: this publish cannot be tracked (the connection is gone: arming a channel would
        fail outside kombu's retry, which reconnects inside the publish); it is failed once
        it returned, and sent again on a channel armed then.
        """
        try:
            channel = producer.channel
            if channel is self._channel and self._uncertain:
                self._abandon()
                channel = producer.connection.channel()
                producer.revive(channel)
            if channel is not self._channel:
                self._abandon()
                channel.confirm_select()
                # bound to this channel: a dropped channel's late confirms count for nothing
                events = channel.events
                events["basic_ack"].add(lambda tag, many: self._on(channel, tag, many, True))
                events["basic_nack"].add(lambda tag, many: self._on(channel, tag, many, False))
                channel.basic_publish = self._counted(channel.basic_publish)
                self._channel, self._published, self._uncertain = channel, 0, False
        except Exception:
            self._abandon()
            return UNTRACKED
        return self._published

    def after(self, mark: int, item: T) -> None:
        """The publish returned: ``item`` waits for its tag's confirm.

        Unless the armed channel did not publish it exactly once (untracked, or kombu
        revived the producer after a connection error and published on a new channel, not
        in confirm mode and not counted): nothing will confirm it, and it is failed.
        """
        early, self._early = self._early, None
        if self._published != mark + 1:
            self._failed.append(item)
        elif early is None:
            self._pending[self._published] = item
        else:
            (self._acked if early else self._failed).append(item)

    def wait(self) -> tuple[list[T], list[T]]:
        """Wait for the pending confirms (at most ``timeout``): (acked, failed) since the last."""
        channel = self._channel
        if self._pending and channel is not None:
            deadline = time.monotonic() + self.timeout
            try:
                while self._pending:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    channel.connection.drain_events(timeout=left)
            except TimeoutError:  # socket.timeout: no confirm within the timeout
                pass
            except Exception:  # the connection or channel is gone: a new channel next time
                self._uncertain = True
            self._failed.extend(self._pending.values())
            self._pending.clear()
        acked, failed = self._acked, self._failed
        self._acked, self._failed = [], []
        return acked, failed

    def _counted(self, publish: Callable[..., Any]) -> Callable[..., Any]:
        def basic_publish(*args: Any, **kwargs: Any) -> Any:
            self._publishing, self._early = True, None
            try:
                result = publish(*args, **kwargs)
            except BaseException:
                self._uncertain = True
                raise
            finally:
                self._publishing = False
            self._published += 1
            return result

        return basic_publish

    def _on(self, channel: Any, tag: int, multiple: bool, ack: bool) -> None:
        """A confirm: ``tag`` (and, ``multiple``, every tag before it) acked or nacked."""
        if channel is not self._channel:
            return
        current = self._published + 1
        if self._publishing and (tag == current or (multiple and tag > current)):
            self._early = ack  # the publish in progress: after() settles it
        pending = self._pending
        tags = list(itertools.takewhile(lambda t: t <= tag, pending)) if multiple else [tag]
        into = self._acked if ack else self._failed
        for t in tags:
            item = pending.pop(t, None)
            if item is not None:
                into.append(item)

    def _abandon(self) -> None:
        """Fail what the current channel still owes, and forget the channel.

        Its confirms, if any still come, are not read; closing it could wait on a dead
        connection.
        """
        self._failed.extend(self._pending.values())
        self._pending.clear()
        self._channel, self._uncertain = None, False
