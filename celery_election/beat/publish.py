"""How a leading beat publishes a burst: its router, and its publisher processes.

A burst of thousands of due entries is CPU-bound in one process: per send, Celery's
publish is about half and the scheduler's own questions (is it due, reserve, the claim,
the history) the rest. With ``election_beat_publishers = N`` the scheduler forks N
processes when it starts (before it opens a connection or starts a thread) and hands
each batch's sends to them: they publish batch k while the leader claims batch k + 1.

The fence holds in the publisher: a send goes out only if, at the send, the shared
leadership record (the worker's for a beat embedded in it, else one the beat's own
elector writes) says that the term which claimed the run is still trusted. The publish
is Celery's own (``Scheduler.apply_async``: the task's ``apply_async`` when the beat
knows the task, the entry's options, ``before_task_publish``/``after_task_publish``),
in the publisher's process, through its own broker connection.

A publisher that dies or stops answering leaves the runs it had not answered for owed
(they may or may not have gone out): the beat sends them again under their task ids
(``ledger.py``), and sends by itself from then on.
"""

from __future__ import annotations

import logging
import multiprocessing
import pickle
import signal
from multiprocessing.connection import Connection
from typing import Any, NamedTuple

from celery.beat import Scheduler
from kombu.entity import Queue

from ..core import tracing
from ..core.clock import boottime
from ..election.shared_state import SharedLeadership
from .confirms import Confirms, applies

__all__ = ["BurstRouter", "Job", "Publisher", "Publishers", "Reply"]

log = logging.getLogger("celery_election.beat")

#: A publisher that has not answered for its batch in this many seconds is given up.
ANSWER_WITHIN = 60.0

SENT, FENCED, FAILED, LOST = "sent", "fenced", "failed", "lost"


class BurstRouter:
    """The app's router, whose queues come bound to the burst's producer channel.

    Celery routes a send to the app's own (unbound) ``Queue`` and asks kombu to declare
    it; kombu's ``maybe_declare`` then copies the queue and its exchange to bind the copy
    to the channel, only to find it in the connection's cache of declared entities: a
    quarter of Celery's publish cost in a burst. Bound once per burst, the queue is
    declared (if the connection has not declared it yet) at its first send and found in
    the cache at once after that. The message, the signals' arguments and the routing
    are the app router's: the bound copy equals the queue it copies. A publish retried
    after a reconnect finds the copy's channel closed and kombu re-binds it to the new
    one, as it does with the exchange it declared before the reconnect.
    """

    def __init__(self, router: Any, producer: Any) -> None:
        self.router, self.producer = router, producer
        # keyed by equality (the same declaration: what Celery reads from the queue to
        # route, and kombu's declared cache is by name alone) and type (a Broadcast)
        self._bound: dict[tuple[type, Queue], Queue] = {}

    def route(
        self,
        options: dict[str, Any],
        name: str,
        args: Any = (),
        kwargs: Any = None,
        task_type: Any = None,
    ) -> Any:
        options = self.router.route(options, name, args, kwargs, task_type)
        queue = options.get("queue")
        if isinstance(queue, Queue) and not queue.is_bound:
            key = (type(queue), queue)
            bound = self._bound.get(key)
            if bound is None:
                try:
                    bound = queue.bind(self.producer.channel)  # type: ignore[no-untyped-call]
                except Exception:  # no channel yet: the publish connects (and retries)
                    return options
                self._bound[key] = bound
            options["queue"] = bound
        return options


class Job(NamedTuple):
    """One send handed to a publisher: the entry as Celery sends it, and its term."""

    key: int  # the beat's key for the send, answered back
    name: str
    task: str
    args: Any
    kwargs: Any
    options: dict[str, Any]  # the entry's, with the election's headers
    term: int  # the term that claimed the run: sent only while it is trusted


class Reply(NamedTuple):
    """What became of a job: SENT (with the task id), FENCED, FAILED (why) or LOST."""

    key: int
    outcome: str
    task_id: str | None = None
    error: str | None = None
    checked: float = 0.0  # boot-time clock, read before the fence check (the act's time)


class _Entry(NamedTuple):
    """What ``Scheduler.apply_async`` reads of an entry."""

    name: str
    task: str
    args: Any
    kwargs: Any
    options: dict[str, Any]


class _Sender:
    """The ``self`` Celery's ``Scheduler.apply_async`` needs: the app, and no sync."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self._tasks_since_sync = 0

    def send_task(self, *args: Any, **kwargs: Any) -> Any:
        return self.app.send_task(*args, **kwargs)

    def should_sync(self) -> bool:
        return False  # the beat syncs its own schedule: a publisher holds none


class Publisher:
    """A publisher's means: its broker connection, the burst's router, Celery's send."""

    def __init__(self, app: Any, record: SharedLeadership) -> None:
        self.record = record
        self.connection = app.connection_for_write()
        self.producer = app.amqp.Producer(self.connection, auto_declare=False)
        self.router = BurstRouter(app.amqp.router, self.producer)
        self._sender = _Sender(app)
        self._confirms: Confirms[Reply] = Confirms()

    def publish_all(self, jobs: list[Job]) -> list[Reply]:
        """Send each job (:meth:`publish`), then wait for the broker's confirms of them all.

        A send RabbitMQ did not confirm (nacked, unanswered, its connection lost) is
        FAILED: the beat owes it again.
        """
        replies = [self.publish(job) for job in jobs]
        _, failed = self._confirms.wait()
        lost = {r.key for r in failed}
        return [
            r._replace(outcome=FAILED, error="not confirmed by the broker") if r.key in lost else r
            for r in replies
        ]

    def publish(self, job: Job) -> Reply:
        """Send ``job`` if its term is trusted now (the fence), as Celery's beat sends."""
        checked = boottime()
        reading = self.record.read()
        if not reading.trusted(checked) or reading.term != job.term:
            return Reply(job.key, FENCED, checked=checked)
        options = job.options
        if "router" not in options:
            options = {**options, "router": self.router}
        entry = _Entry(job.name, job.task, job.args, job.kwargs, options)
        confirmed = applies(self.producer)
        try:
            mark = self._confirms.before(self.producer) if confirmed else 0
            with tracing.from_headers(options.get("headers")):  # the beat's run span
                result = Scheduler.apply_async(
                    self._sender, entry, producer=self.producer, advance=False
                )
        except Exception as exc:  # Celery's SchedulingError: the beat logs it as apply_entry
            return Reply(job.key, FAILED, error=str(exc), checked=checked)
        reply = Reply(job.key, SENT, task_id=getattr(result, "id", None), checked=checked)
        if confirmed:  # SENT once confirmed (publish_all)
            self._confirms.after(mark, reply)
        return reply

    def close(self) -> None:
        self.connection.close()


def _serve(app: Any, record: SharedLeadership, conn: Connection, inherited: list[Any]) -> None:
    """A publisher's life: batches of pickled jobs in, their replies out, until EOF."""
    for other in inherited:  # the beat's ends: its death must reach this process as EOF
        other.close()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # ^C stops the beat, which stops us
    publisher = Publisher(app, record)
    try:
        while True:
            try:
                blobs = conn.recv()
            except (EOFError, OSError):
                return
            conn.send(publisher.publish_all([pickle.loads(blob) for blob in blobs]))
    finally:
        publisher.close()


class _Child:
    """One publisher process and the jobs it has not answered for."""

    def __init__(self, proc: Any, conn: Connection) -> None:
        self.proc, self.conn = proc, conn
        self.pending: list[int] = []


class Publishers:
    """The beat's publisher processes: one batch in flight each (the pipeline's depth)."""

    def __init__(self, app: Any, record: SharedLeadership, count: int) -> None:
        ctx = multiprocessing.get_context("fork")
        self._all: list[_Child] = []
        ends: list[Connection] = []
        for n in range(count):
            mine, theirs = ctx.Pipe()
            proc = ctx.Process(
                target=_serve,
                args=(app, record, theirs, [*ends, mine]),
                name=f"celery-election-publisher-{n + 1}",
                daemon=True,
            )
            proc.start()
            theirs.close()
            ends.append(mine)
            self._all.append(_Child(proc, mine))
        self._next = 0

    @property
    def alive(self) -> bool:
        return bool(self._all)

    def hand(self, jobs: list[Job]) -> tuple[list[Reply], list[Job]]:
        """Hand ``jobs`` out; returns the replies of the batch before and the jobs kept.

        Each publisher answers for its previous batch first (so at most one batch is in
        flight per publisher). Jobs that cannot be pickled, or that no publisher took
        (all gone), come back for the beat to send itself.
        """
        replies = self.collect()
        if not self._all:
            return replies, list(jobs)
        kept: list[Job] = []
        shares: list[list[tuple[Job, bytes]]] = [[] for _ in self._all]
        for job in jobs:
            try:
                blob = pickle.dumps(job, pickle.HIGHEST_PROTOCOL)
            except Exception:  # e.g. an argument that does not pickle: the beat sends it
                kept.append(job)
                continue
            self._next = (self._next + 1) % len(self._all)
            shares[self._next].append((job, blob))
        for publisher, share in zip(list(self._all), shares, strict=True):
            if not share:
                continue
            try:
                publisher.conn.send([blob for _, blob in share])
            except OSError as exc:
                replies += self._lost(publisher, f"it could not be reached ({exc})")
                kept += [job for job, _ in share]  # never read: the beat sends them
                continue
            publisher.pending = [job.key for job, _ in share]
        return replies, kept

    def collect(self) -> list[Reply]:
        """Wait for every publisher's replies to the jobs it holds.

        A publisher that died, or did not answer within :data:`ANSWER_WITHIN`, is given
        up: its jobs are LOST.
        """
        replies: list[Reply] = []
        for publisher in list(self._all):
            if not publisher.pending:
                continue
            try:
                if not publisher.conn.poll(ANSWER_WITHIN):
                    replies += self._lost(publisher, f"it did not answer in {ANSWER_WITHIN:g}s")
                    continue
                answered: list[Reply] = publisher.conn.recv()
            except (EOFError, OSError) as exc:
                replies += self._lost(publisher, f"it is gone ({str(exc) or type(exc).__name__})")
                continue
            publisher.pending = []
            replies += answered
        return replies

    def _lost(self, publisher: _Child, why: str) -> list[Reply]:
        """Give a publisher up: the jobs it did not answer for may or may not have gone."""
        self._all.remove(publisher)
        lost, publisher.pending = publisher.pending, []
        log.error(
            "beat election: publisher pid %s: %s; %d sends it held may or may not have gone "
            "out (owed: sent again under their task ids); %s",
            publisher.proc.pid, why, len(lost),
            "the beat sends by itself now" if not self._all else "the others go on",
        )  # fmt: skip
        self._stop(publisher)
        return [Reply(key, LOST) for key in lost]

    @staticmethod
    def _stop(publisher: _Child) -> None:
        publisher.conn.close()
        publisher.proc.join(2.0)
        if publisher.proc.is_alive():
            publisher.proc.kill()
            publisher.proc.join(2.0)

    def close(self) -> list[Reply]:
        """The replies still owed, then the publishers stop (EOF on their pipes)."""
        replies = self.collect()
        for publisher in self._all:
            self._stop(publisher)
        self._all = []
        return replies
