"""The send and settle steps of the beat's send path: the fence at each send, and after.

``LeaderSchedulerMixin`` gives its :class:`Sender` runs it claimed (or entries sent
unreserved: a "run now", an ``apply_async`` of an unreserved entry). For each, the sender
checks the fence at the send (:meth:`Sender.prepare`: a :class:`Send` value, or None: not
sent), publishes with Celery's own send (in this process, or handed to the
``election_beat_publishers``: ``beat/publish.py``) and settles what went out: counted,
told to the run policy (the history), recorded in ``election_history_file``.

The options of a send carry the election's headers: the term, and the run (the task can
see which run it is, ``self.request.election_run``, e.g. to deduplicate or fence its own
writes).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from typing import Any, NamedTuple

from celery.beat import logger as _celery_log

from .. import metrics
from ..core import tracing
from ..core.clock import boottime
from ..core.runstate import run_now_task_id
from ..election import shared_state
from ..election.shared_state import SharedLeadership
from ..errors import ElectionError
from ..runs.once import HEADER, RESENT, ROWS
from ..settings import ElectionSettings
from .answers import numeric
from .confirms import Confirms, applies
from .election import BeatTerm
from .fence import BeatFence
from .ledger import RECHECK_AGE, RECHECK_EVERY, RunLedger
from .policy import RunNow, RunPolicy
from .publish import FAILED, FENCED, SENT, BurstRouter, Job, Publishers, Reply
from .runs import NOT_LEADING, Claim, Run

__all__ = ["Send", "Sender"]

log = logging.getLogger("celery_election.beat")

#: A send the fence held: logged alike whether the beat or its publisher checked.
_NOT_LEADING_NOW = "beat election: %s: this process does not lead now; not sent"


class Send(NamedTuple):
    """A send the fence let through: under which lead, for which claim, with what."""

    lead: BeatTerm
    claim: Claim | None
    checked: float  # boot-time clock, read before the fence check
    options: dict[str, Any]
    run_now: int | None = None  # a "run now" request's key (the operable schedule's)
    span: Any = None  # the run's span (core/tracing.py), None when not tracing


class Sender:
    """The fence at each send, the publish, and what a send leaves behind.

    ``lead_now``: the scheduler's leadership to act under (it promotes a newly won term
    first); ``publish(entry, producer, **kwargs)``: Celery's own send of an entry.
    """

    def __init__(
        self,
        fence: BeatFence,
        policy: RunPolicy,
        lead_now: Callable[[], BeatTerm | None],
        publish: Callable[..., Any],
    ) -> None:
        self.fence, self.policy = fence, policy
        self._lead_now, self._publish = lead_now, publish
        self.router: BurstRouter | None = None  # the burst's router (see burst())
        self.publishers: Publishers | None = None  # election_beat_publishers
        self.handed: dict[int, tuple[Any, Send]] = {}  # a handed job's entry and send, by key
        self._jobs = itertools.count()
        self.ledger = RunLedger(fence)
        #: the sends out on RabbitMQ whose confirms are awaited (at the end of a batch)
        self.confirms: Confirms[tuple[Any, Send]] = Confirms()
        self._batching = False
        self._recheck_at = boottime() + RECHECK_EVERY  # the store's pending runs, read again

    # -- one send ---------------------------------------------------------------------------

    def prepare(self, entry: Any, claim: Claim | None, run_now: int | None = None) -> Send | None:
        """The fence at a send: its leadership and options, or None: not sent (logged).

        ``claim``: the claimed run's (None: an unreserved send, sent while this process
        leads in a term whose state it loaded).
        """
        checked = boottime()  # read before the check: the history's rule for an act
        leading = self._lead_now()  # a term won since the last tick is promoted first
        fence = self.fence
        lead = None if leading is None or fence.election is None else fence.may_send(claim)
        if lead is None:
            if claim is not None and not claim.won:
                log.debug("beat election: %s was not claimed by this leader; not sent", entry.name)
            else:
                log.warning(_NOT_LEADING_NOW, entry.name)
            held = "refused" if claim is not None and not claim.won else "fenced"
            tracing.beat_run_not_sent(fence, self.ledger, entry, claim, held)
            if run_now is not None:  # its row stays claimed: this leader's again, or the next's
                self.ledger.failed_now(entry, run_now, self._run_now_id(entry, run_now))
            return None
        headers = dict(entry.options.get("headers") or {})
        headers.update(self.policy.send_headers(entry))
        headers["election_term"] = lead.term
        options = {**entry.options, "headers": headers}
        expires = options.get("expires")
        if numeric(expires):
            options["expires"] = self._expires_at(float(expires))
        if claim is not None:
            headers[HEADER] = claim.run
            headers[ROWS] = fence.namespace  # its row: where the claim wrote it
            options["task_id"] = self.ledger.task_id(entry, claim)  # each send of the run
            attempt, recovered = self.ledger.resend_of(str(entry.name))
            if attempt > 1 or recovered is not None:  # may have gone out: not a redelivery
                headers[RESENT] = attempt
        elif run_now is not None:  # claimed as a row of its own (schedule/store.py)
            headers[HEADER], headers[ROWS] = run_now, fence.namespace
            headers["election_run_now"] = True  # its key is the click's time
            options["task_id"] = self._run_now_id(entry, run_now)
        if self.router is not None and "router" not in entry.options:
            options["router"] = self.router  # send_task(router=...): see BurstRouter
        span = tracing.beat_run(fence, self.ledger, entry, claim, lead.term, options)
        return Send(lead, claim, checked, options, run_now, span)

    def _run_now_id(self, entry: Any, run_now: int) -> str:
        return run_now_task_id(self.fence.namespace, str(entry.name), run_now)

    def _expires_at(self, seconds: float) -> datetime:
        """``expires`` seconds from now by the database's clock, as an absolute time.

        Celery turns a number of seconds into a time by the sender's clock, which workers
        then compare with theirs: a beat whose clock is an hour slow sent every run already
        expired (a chaos run lost them). The database's clock is the one the beat keeps
        the schedule by; a worker's own clock stays Celery's business.
        """
        fence = self.fence  # its offset is measured against Celery's clock (app.now)
        now_us = round(fence.app.now().timestamp() * 1_000_000) + fence.offset_us
        return datetime.fromtimestamp(now_us / 1e6, tz=timezone.utc) + timedelta(seconds=seconds)

    def send_now(self, run_now: RunNow, producer: Any) -> None:
        """Send a "run now" the policy won (unreserved, once), as Celery's apply_entry."""
        self._send_one(run_now.entry, None, producer, run_now.key)

    def publish(self, entry: Any, send: Send, producer: Any, **kwargs: Any) -> Any:
        """Celery's publish of ``entry`` with the fenced options, in this process.

        On RabbitMQ the send counts once the broker confirmed it: at the end of the batch
        it is part of, or at once outside one (:meth:`confirm`).
        """
        original = entry.options
        entry.options = send.options
        confirmed = applies(producer)
        try:
            mark = self.confirms.before(producer) if confirmed else 0
            with tracing.current(send.span):  # Celery's publish span: the run's child
                result = self._publish(entry, producer, **kwargs)
        except BaseException as exc:
            self.failed(entry, send, "publish_failed", exc)
            raise
        else:
            if not confirmed:
                self.sent(entry, send, send.checked)
            else:
                self.confirms.after(mark, (entry, send))
                if not self._batching:
                    self.confirm()
        finally:
            # Celery compares the schedule with a snapshot that holds this very entry: a
            # changed options dict there made every tick rebuild the whole heap.
            entry.options = original
        return result

    def confirm(self) -> None:
        """Wait for the broker's confirms of the sends out.

        Each acked one is sent; the others (nacked, unanswered, their connection lost)
        failed, and a claimed run owed again.
        """
        acked, failed = self.confirms.wait()
        for entry, send in acked:
            self.sent(entry, send, send.checked)
        for entry, send in failed:
            self.failed(entry, send, "publish_failed", "not confirmed by the broker")
            _celery_log.error("Message Error: %s was not confirmed by the broker", entry.name)

    @contextmanager
    def batch(self) -> Iterator[None]:
        """Sends whose confirms are awaited together, when the batch ends."""
        if self._batching:
            yield
            return
        self._batching = True
        try:
            yield
        finally:
            self._batching = False
            self.confirm()

    def failed(self, entry: Any, send: Send, outcome: str, error: Any = None) -> None:
        """A send that did not go out (or was not confirmed): a claimed run is owed."""
        self.count(entry, "publish_failed")
        tracing.beat_run_ended(send.span, outcome, error)
        if send.claim is not None:
            self.ledger.failed(entry, send.claim)
        elif send.run_now is not None:
            self.ledger.failed_now(entry, send.run_now, send.options["task_id"])

    def count(self, entry: Any, what: str) -> None:
        metrics.count(metrics.key(metrics.BEAT, self.fence.namespace, str(entry.name), what))

    def sent(self, entry: Any, send: Send, checked: float) -> None:
        """A run went out (here or from a publisher): count it, keep its history and record."""
        self.count(entry, "sent")
        tracing.beat_run_ended(send.span, "sent")  # the broker accepted it
        claim, term = send.claim, send.lead.term
        if claim is not None:
            self.ledger.sent(entry, claim)
        elif send.run_now is not None:
            self.ledger.sent_now(str(entry.name), send.options["task_id"])
        self.policy.sent(entry, term, None if claim is None else claim.run, send.run_now)
        election = self.fence.election
        if election is not None and election.recorder is not None and claim is not None:
            election.recorder.record("send", mono=checked, ns=election.namespace, term=term,
                                     entry=entry.name, run=claim.run, at=claim.at)  # fmt: skip

    # -- the run ledger: owed sends, recovered runs, the marks -------------------------------

    def recover(
        self,
        lead: BeatTerm,
        schedule: dict[str, Any],
        producer: Callable[[], Any],
        older_than: float | None = None,
    ) -> bool:
        """Send the runs earlier terms claimed and did not send; False: the store is unread.

        At promotion, before any claim of ``lead``; while leading (``older_than``: the
        recheck of :meth:`settle`), the runs the ledger lost track of. ``producer``: asked
        for only when a run is sent.
        """
        try:
            runs = self.ledger.recover(lead, schedule, older_than=older_than)
        except ElectionError as exc:  # read again at the next promotion or recheck
            log.warning("beat election: could not read the pending runs (%s)", exc)
            return False
        with self.batch():
            for entry, claim, run_now in runs:
                self._send_one(entry, claim, producer(), run_now)
        return True

    def settle(
        self,
        lead: BeatTerm | None,
        producer: Callable[[], Any],
        schedule: Callable[[], dict[str, Any]],
    ) -> None:
        """After a tick: send the owed runs due again, and mark what the broker took.

        Every ``RECHECK_EVERY`` seconds while leading, also the runs the store holds pending
        that this ledger lost track of (ledger.py). ``producer``: Celery's, asked for only
        when something is owed (a follower does not connect to the broker). ``schedule``:
        the entries as the tick last saw them (Celery's snapshot), not ``self.schedule``:
        reading django-celery-beat's schedule between ticks may reload it and empty the
        heap, which the next tick then keeps (its schedule compares equal).
        """
        with self.batch():
            for owed in self.ledger.owed_now(lead):
                self._send_one(owed.entry, owed.claim, producer(), owed.run_now)
            if lead is not None and boottime() >= self._recheck_at:
                self._recheck_at = boottime() + RECHECK_EVERY
                self.recover(lead, schedule(), producer, older_than=RECHECK_AGE)
        self.ledger.flush()

    def _send_one(
        self, entry: Any, claim: Claim | None, producer: Any, run_now: int | None = None
    ) -> None:
        """One send outside Celery's tick, logged as its apply_entry logs one.

        A failed publish is logged, not raised (a claimed run is owed again by publish).
        """
        _celery_log.info("Scheduler: Sending due task %s (%s)", entry.name, entry.task)
        send = self.prepare(entry, claim, run_now)
        if send is None:
            return
        try:
            self.publish(entry, send, producer)
        except Exception as exc:
            _celery_log.error("Message Error: %s", exc, exc_info=True)

    # -- a burst ----------------------------------------------------------------------------

    @contextmanager
    def burst(self, router: Any, producer: Any) -> Iterator[None]:
        """A burst's sends: through one router whose queues are bound once, confirmed together."""
        self.router = BurstRouter(router, producer)
        try:
            with self.batch():
                yield
        finally:
            self.router = None

    def start(self, app: Any) -> None:
        """At the scheduler's setup: say what the broker guarantees, fork the publishers."""
        try:
            driver = app.connection_for_write().transport.driver_type  # not connected yet
        except Exception:  # a broker URL kombu cannot read: Celery reports it itself
            driver = None
        if driver is not None and driver != "amqp":
            log.info(
                "beat election: the %s broker has no publisher confirms: a run counts as sent "
                "once the publish returned, and one the broker loses after that is not sent "
                "again (docs/beat.md, exactly once)",
                driver,
            )
        self.start_publishers(app)

    # -- publisher processes (election_beat_publishers) -------------------------------------

    def start_publishers(self, app: Any) -> None:
        """Fork the ``election_beat_publishers``, before any connection or thread opens."""
        try:
            count = ElectionSettings.from_app(app).beat_publishers
        except ElectionError:
            return  # the election reports the settings' problems, all at once
        if not count or self.publishers is not None:
            return
        record = shared_state.current()  # embedded: the worker's record
        if record is None:  # standalone: one that this beat's elector writes
            record = SharedLeadership.create(published=False)
            self.fence.publishers_record = record  # the election, once started, writes it too
        self.publishers = Publishers(app, record, count)

    def hand_off(self, runs: list[Run], producer: Any) -> int:
        """Hand the runs' sends to the publishers; act on the replies to the batch before.

        Returns how many sends were handed (Celery counts them towards its next sync).
        """
        publishers = self.publishers
        assert publishers is not None
        jobs = []
        for run in runs:
            entry = run.entry
            _celery_log.info("Scheduler: Sending due task %s (%s)", entry.name, entry.task)
            send = self.prepare(entry, run.claim or NOT_LEADING)
            if send is None:
                continue
            key = next(self._jobs)
            self.handed[key] = (entry, send)
            options = {k: v for k, v in send.options.items() if v is not self.router}
            args = (str(entry.name), entry.task, entry.args, entry.kwargs, options)
            jobs.append(Job(key, *args, send.lead.term))
        replies, kept = publishers.hand(jobs)
        self._settle(replies)
        for job in kept:  # no publisher took it: sent here, as apply_entry sends
            entry, send = self.handed.pop(job.key)
            try:
                self.publish(entry, send, producer)
            except Exception as exc:
                _celery_log.error("Message Error: %s", exc, exc_info=True)
        return len(jobs)

    def _settle(self, replies: list[Reply]) -> None:
        """Act on what the publishers did with the jobs handed to them."""
        for reply in replies:
            entry, send = self.handed.pop(reply.key)
            if reply.outcome == SENT:
                self.sent(entry, send, reply.checked)
            elif reply.outcome == FENCED:
                log.warning(_NOT_LEADING_NOW, entry.name)
                tracing.beat_run_ended(send.span, "fenced")
            else:  # FAILED, or LOST with its publisher (logged then): owed
                self.failed(entry, send, "publish_failed" if reply.outcome == FAILED else "lost",
                            reply.error)  # fmt: skip
                if reply.outcome == FAILED:
                    _celery_log.error("Message Error: %s", reply.error)

    def collect(self) -> None:
        """Wait for the replies the publishers owe (the burst is over, or the beat stops)."""
        if self.publishers is not None and self.handed:
            self._settle(self.publishers.collect())

    def close(self) -> None:
        """Stop the publishers, and mark what went out.

        What they sent goes into the final sync's history, and a beat stopped cleanly
        leaves no run for the next leader to send again.
        """
        publishers, self.publishers = self.publishers, None
        if publishers is not None:
            self._settle(publishers.close())
        self.confirm()
        if self.fence.election is not None:
            self.ledger.flush()

    def close_record(self) -> None:
        """The publishers' record goes after the election (its elector writes it to the end)."""
        record, self.fence.publishers_record = self.fence.publishers_record, None
        if record is not None:
            record.write(None, None)
            record.close()
