"""A seeded simulation of a beat run's life: beats, a broker, workers, faults, one clock.

    .venv/bin/python -m harness.runsim --schedules 100000          # seeds 0..N-1
    .venv/bin/python -m harness.runsim --seed 123 --trace          # replay one, step by step
    .venv/bin/python -m harness.runsim --revert 3 --schedules 2000 # a window's fix undone

Each schedule (one seed) draws a small world: one to three entries with a few due runs
each, operators' "run now" requests, two beats, one to three workers, acks early or late,
and fault rates. It then takes random steps on one virtual clock, each step one action of
one actor, until every due time has passed, turns the faults off, and runs on until
nothing moves. The runs live in :class:`~celery_election.backends.memory_runs.MemoryRuns`,
the transitions in :mod:`celery_election.core.runstate`: the code the beat and the workers use.

Faults: a statement that fails before it commits, or commits and loses its answer; a
broker that drops a message it has not confirmed, nacks one, loses a confirm, delivers a
message twice or out of order, and redelivers what a dead worker had not acknowledged; a
beat or a
worker killed between any two of its steps, or paused past its lease or its liveness
(then seen dead: its message given back, its run taken over); a busy singleton key that
puts a started run off. The beats publish through the sender's own publisher confirms
(:class:`~celery_election.beat.confirms.Confirms`, on a channel that counts delivery tags
as RabbitMQ does), read after a batch or, with kombu's ``confirm_publish``, inside each
publish. A world may have a worker without the run-once check (no ``--election``): it
runs what it receives, and must say so (``once.warn_unchecked``).

The invariants, checked after quiescence (and the second one at every step):

1. every due run and every "run now" ran its body to the end exactly once;
2. never two bodies of one run at once;
3. nothing pending forever: no run left claimed, sent or started, and no message still
   going round (a leader that sends its confirmed runs again for ever never quiesces);
4. a run's row ends only once its body ended, and says so: a run whose body ended is not
   recorded as lost;
5. a send the broker confirmed counts as sent, and one it did not confirm is owed (else
   the leader sends a delivered run again and again, or loses one the broker dropped).

Except where the acknowledgement mode itself gives the run up, counted as *excused*: a
worker killed after an early acknowledgement and before its body ended (at most once: the
message is gone), or killed under ``acks_late`` after its body ended and before the end
was recorded (at least once: the broker delivers it again); and a worker paused past its
liveness while it held the run (seen dead, its run taken over, then it wakes: its body
and the other may both run, the only two bodies at once allowed; the row still ends by
the delivery that holds it); and a run a worker without the check received, if that
worker warned (a WARNING naming ``--election``): it runs as often as it is delivered and
its row is not ended. docs/beat.md's table says so.

``--revert N`` puts back the behaviour of 50bbd93 behind window N of issue 52 (what
REVERTS says), to show the simulation finds it.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import logging
import random
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any
from unittest import mock

from celery_election.backends.memory_runs import MemoryRuns
from celery_election.beat.confirms import Confirms
from celery_election.core import runstate
from celery_election.runs import once

NS = "sim"
#: virtual milliseconds: a lease, the time a dead worker takes to be seen dead, a put-off
TTL, LIVENESS, DEFER = 3000, 1500, 500
#: steps after the faults stop before a run still open counts as pending forever
QUIET_STEPS = 3000

REVERTS = {
    1: "the confirm kombu's confirm_publish reads inside the publish is not kept: the send "
    "counts as unconfirmed and is sent again",
    2: "a busy singleton key's requeue keeps the start (no release): the copy never runs",
    3: "the owed runs are read at promotion only: a claim whose answer was lost is never sent",
    4: "an acks_late copy finding the run started is skipped (no put-off): a dead worker's run "
    "is lost when the broker's redelivery arrives before its death is seen",
    5: "an acks_late delivery takes a started run over without asking whether its worker lives",
    6: "a put-off copy names only the last try that put it off",
    7: "a claim that failed gives up the due run (the entry moves on to the next)",
    8: "a due run is refused while an earlier term's run of its entry is unsent, and the "
    "entry moves on",
    9: "a 'run now' is consumed, then sent with no claim",
    10: "a skipped copy closes the run's row",
    11: "a worker without the run-once check runs beat runs and says nothing",
}

#: the task a worker without the check runs (``once.warn_unchecked`` reads its name and header)
TASK = "sim.tick"


class DBError(Exception):
    """A statement that failed (before its commit, or after it: the answer was lost)."""


class PublishError(Exception):
    """``confirm_publish``: the publish raised (nacked, or no confirm within its wait)."""


class Channel:
    """A channel as py-amqp gives it to the sender: RabbitMQ counts its publishes (the
    delivery tags 1, 2, ...) and confirms them, read when the connection is drained, or
    inside the publish with kombu's ``confirm_publish``."""

    def __init__(self, world: World) -> None:
        self.world, self.connection = world, self
        self.events: dict[str, set[Callable[[int, bool], None]]] = {
            "basic_ack": set(), "basic_nack": set()}  # fmt: skip
        self.tag = 0
        self.answers: dict[int, bool] = {}  # tag -> acked (True) or nacked: what was sent
        self.unread: list[tuple[int, bool]] = []

    def confirm_select(self) -> None:
        pass

    def basic_publish(self, msg: Msg) -> None:
        self.tag += 1
        answer = self.world.take(msg)
        if answer is not None:
            self.answers[self.tag] = answer
            if self.world.in_publish:
                self.confirmed(self.tag, answer)
            else:
                self.unread.append((self.tag, answer))
        if self.world.in_publish and answer is not True:
            raise PublishError("nacked" if answer is False else "no confirm")

    def drain_events(self, timeout: float | None = None) -> None:
        if not self.unread:
            raise TimeoutError  # nothing more will come: the wait's timeout, at once
        self.confirmed(*self.unread.pop(0))

    def confirmed(self, tag: int, ack: bool) -> None:
        for callback in list(self.events["basic_ack" if ack else "basic_nack"]):
            callback(tag, False)


class Connection:
    def __init__(self, world: World) -> None:
        self.world = world

    def channel(self) -> Channel:
        return Channel(self.world)


class Producer:
    """The beat's producer: its channel, and a new one when the sender asks."""

    def __init__(self, world: World) -> None:
        self.connection = Connection(world)
        self.channel = Channel(world)

    def revive(self, channel: Channel) -> None:
        self.channel = channel


class KeptNoEarly(Confirms[str]):
    """Revert 1 (50bbd93): the confirm read inside the publish is not kept."""

    def after(self, mark: int, item: str) -> None:
        self._early = None
        super().after(mark, item)


@dataclass
class Msg:
    entry: str
    due: int
    task_id: str
    put_off: tuple[str, ...] = ()
    at: int = 0  # deliverable from (a put-off copy comes back later)


@dataclass
class Beat:
    name: str
    alive: bool = True
    paused_until: int = 0
    term: int = 0  # the term it believes it leads (0: none)
    known: set[tuple[str, int]] = field(default_factory=set)  # runs it knows are claimed
    sent: list[str] = field(default_factory=list)  # task ids confirmed, mark pending
    read_owed: bool = False  # revert 3: the owed runs were read once, at promotion
    producer: Producer | None = None  # its connection to the broker, made at its first send
    confirms: Confirms[str] | None = None  # the sender's, over that producer's channel


@dataclass
class Worker:
    index: int
    gen: int = 0
    alive: bool = True
    msg: Msg | None = None
    stage: str = "idle"  # received, started, busy, body, ended
    delivery: str = ""
    paused_at: int = 0
    paused_until: int = 0  # paused (SIGSTOP) until then
    lapsed: bool = False  # paused past its liveness: seen dead, its message given back
    checked: bool = True  # started with --election: each delivery asks the run's row

    @property
    def name(self) -> str:
        return f"w{self.index}.{self.gen}"


class UncheckedTask:
    """What ``once.warn_unchecked`` reads of a task: its name, its request's beat header."""

    name = TASK

    def __init__(self, run: str) -> None:
        self.request = SimpleNamespace(**{once.HEADER: run})


class Said(logging.Handler):
    """The warnings a worker process logged."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


class Failure(AssertionError):
    """An invariant broken: the message names the seed that replays it."""


class World:
    """One schedule: the seed decides the world, its faults and every step."""

    def __init__(self, seed: int, revert: frozenset[int] = frozenset(), trace: bool = False):
        self.seed, self.revert, self.trace = seed, revert, trace
        rng = self.rng = random.Random(seed)
        self.now = 0
        self.acks_late = rng.random() < 0.5
        self.dues: dict[str, list[int]] = {}
        for e in range(rng.randint(1, 3)):
            period = rng.choice((400, 700, 1000))
            self.dues[f"e{e}"] = [period * k for k in range(1, rng.randint(2, 4) + 1)]
        self.horizon = max(d for ds in self.dues.values() for d in ds) + 200
        self.requests = sorted(rng.randrange(self.horizon) for _ in range(rng.randint(0, 2)))
        self.asked = list(self.requests)  # every "run now" an operator asked for
        self.pending_requests: list[int] = []
        level = rng.choice((0.0, 0.02, 0.08))
        self.p_db = level  # each statement: fails before, or after, its commit
        self.p_broker = level  # each publish: dropped, confirm lost, duplicated
        self.p_crash = level / 2  # each step of an actor: killed
        self.p_busy = level  # each start: the singleton key is busy
        self.faults = True
        self.lease_term, self.lease_holder, self.lease_until = 0, "", 0
        self.beats = [Beat("b0"), Beat("b1")]
        self.workers = [Worker(i) for i in range(rng.randint(1, 3))]
        self.workers[0].checked = rng.random() >= 0.1  # at times, one without --election
        self.in_publish = rng.random() < 0.5  # kombu's confirm_publish
        self.dead_at: dict[str, int] = {}
        self.queue: list[Msg] = []
        self.unacked: dict[str, Msg] = {}  # worker name -> the message it holds
        self.tokens = itertools.count(1)
        # revert 5: every starter looks dead, so any delivery takes a started run over
        self.store = MemoryRuns(self._leads)
        self.alive = (lambda w: False) if 5 in revert else self._alive
        self.completions: Counter[tuple[str, int]] = Counter()
        self.running: Counter[tuple[str, int]] = Counter()
        self.excused: dict[tuple[str, int], str] = {}
        self.bodies: dict[tuple[str, int], set[str]] = {}  # the deliveries running a body
        self.lapsed: set[str] = set()  # deliveries of workers paused past their liveness
        self.unrecorded: set[tuple[str, int]] = set()  # runs whose body's end was lost
        # runs a worker without the check received: whether each such process said so
        self.unguarded: dict[tuple[str, int], bool] = {}
        self.said: set[str] = set()  # the worker processes that warned
        self.warned: defaultdict[str, set[str]] = defaultdict(set)  # once's, per process
        self.said_deliveries: set[str] = set()  # their deliveries
        self.seen: Counter[str] = Counter()  # what happened: the faults and each verdict

    # -- the database's view ----------------------------------------------------------------

    def _leads(self, namespace: str, term: int) -> bool:
        return term == self.lease_term and self.now < self.lease_until

    def _alive(self, worker: str) -> bool:
        died = self.dead_at.get(worker)
        return died is None or self.now < died + LIVENESS

    def call(self, fn: Callable[[], Any]) -> Any:
        """A statement: it may fail before its commit, or commit and lose its answer."""
        if self.faults and self.rng.random() < self.p_db:
            if self.rng.random() < 0.5:
                self.seen["statement failed"] += 1
                raise DBError("before commit")
            fn()
            self.seen["answer lost"] += 1
            raise DBError("after commit")
        return fn()

    def log(self, *what: Any) -> None:
        if self.trace:
            print(f"{self.now:6d}", *what)

    # -- beats ------------------------------------------------------------------------------

    def step_beat(self, beat: Beat) -> None:
        rng = self.rng
        if not beat.alive:
            if not self.faults or rng.random() < 0.05:
                self.beats[self.beats.index(beat)] = Beat(beat.name)  # restarted, nothing kept
                self.log(beat.name, "restarted")
            return
        if self.now < beat.paused_until:
            return
        if self.faults and rng.random() < self.p_crash:
            beat.alive = False
            self.seen["beat killed"] += 1
            self.log(beat.name, "killed")
            return
        if self.faults and rng.random() < self.p_crash / 4:
            beat.paused_until = self.now + TTL + rng.randrange(TTL)
            self.seen["beat paused"] += 1
            self.log(beat.name, "paused")
            return
        # the election: renew its own lease, or take a vacant or expired one
        if self.lease_holder == beat.name and beat.term == self.lease_term:
            if self.now < self.lease_until:
                self.lease_until = self.now + TTL
        elif self.now >= self.lease_until or not self.lease_holder:
            self.lease_term += 1
            self.lease_holder, self.lease_until = beat.name, self.now + TTL
            beat.term, beat.known, beat.sent, beat.read_owed = self.lease_term, set(), [], False
            self.log(beat.name, "leads, term", beat.term)
            return
        elif beat.term and beat.term != self.lease_term and rng.random() < 0.5:
            beat.term = 0  # it has looked at the lease: it does not lead
        if not beat.term:
            return
        action = rng.random()
        if action < 0.4:
            self.beat_claim(beat)
        elif action < 0.8:
            self.beat_send(beat)
        elif action < 0.95:
            self.beat_mark(beat)
        else:
            with contextlib.suppress(DBError):
                self.call(lambda: self.store.reap(NS, self.alive))
            for row in self.store.rows(NS):
                if row.state == runstate.ENDED:
                    self.check_closed((row.entry, row.due))

    def beat_claim(self, beat: Beat) -> None:
        due = [(e, d) for e, ds in self.dues.items() for d in ds
               if d <= self.now and (e, d) not in beat.known]  # fmt: skip
        if 8 in self.revert:
            held = {r.entry for r in self.store.rows(NS)
                    if r.state == runstate.CLAIMED and r.term < beat.term}  # fmt: skip
            beat.known.update(run for run in due if run[0] in held)
            due = [run for run in due if run[0] not in held]
        requests = [r for r in self.requests if r <= self.now]
        self.requests = [r for r in self.requests if r > self.now]
        self.pending_requests += requests
        if 9 in self.revert and self.pending_requests:
            self.beat_run_now_unclaimed(beat)
        now_runs = [("now", -r) for r in self.pending_requests]  # a "run now": a run of its own
        runs = [(e, d, f"{e}@{d}") for e, d in due + now_runs]
        if not runs:
            return

        def claim() -> list[bool]:
            won = self.store.claim(NS, beat.term, runs)
            if self.store.leads(NS, beat.term):  # the request is consumed with its claim
                self.pending_requests = []
            return won

        try:
            won = self.call(claim)
        except DBError:
            if 7 in self.revert:
                beat.known.update(due)
            return
        beat.known.update(due + now_runs)
        self.log(beat.name, "claimed", [r[:2] for r, w in zip(runs, won, strict=True) if w])

    def beat_run_now_unclaimed(self, beat: Beat) -> None:
        """Revert 9: consume the requests, then publish them with no claim (50bbd93)."""
        requests, self.pending_requests = self.pending_requests, []
        for r in requests:
            self.take(Msg("now", -r, f"now@{-r}"))  # lost if the broker drops it

    def beat_send(self, beat: Beat) -> None:
        """Publish the owed runs as the sender does, and read the broker's confirms."""
        if 3 in self.revert and beat.read_owed:
            owed = [r for r in self.store.rows(NS) if runstate.owes(r, beat.term)
                    and (r.entry, r.due) in beat.known]  # fmt: skip
        else:
            try:
                owed = self.call(lambda: self.store.owed(NS, beat.term))
            except DBError:
                return
            beat.read_owed = True
        if not owed:
            return
        if beat.producer is None or beat.confirms is None:
            beat.producer = Producer(self)
            beat.confirms = KeptNoEarly() if 1 in self.revert else Confirms()
        producer, confirms = beat.producer, beat.confirms
        out: list[tuple[str, Channel, int]] = []  # what the channel took: its tag
        for row in owed:
            mark = confirms.before(producer)
            channel = producer.channel
            try:
                channel.basic_publish(Msg(row.entry, row.due, row.task_id))
            except PublishError:
                continue  # failed: the run is still owed
            confirms.after(mark, row.task_id)
            out.append((row.task_id, channel, channel.tag))
        acked, _ = confirms.wait()
        for task_id, channel, tag in out:  # invariant 5
            if channel.answers.get(tag) is True and task_id not in acked:
                raise Failure(f"{task_id}: the broker confirmed it, the beat counts it "
                              "unconfirmed (and sends it again)")  # fmt: skip
            if channel.answers.get(tag) is not True and task_id in acked:
                raise Failure(f"{task_id}: counted as sent, the broker never confirmed it")
        beat.sent += acked
        self.log(beat.name, "sent", [(r.entry, r.due) for r in owed], "confirmed", acked)

    def beat_mark(self, beat: Beat) -> None:
        if not beat.sent:
            return
        sent = list(beat.sent)
        try:
            self.call(lambda: self.store.confirm(NS, sent))
        except DBError:
            return
        del beat.sent[: len(sent)]

    def take(self, msg: Msg) -> bool | None:
        """The broker takes ``msg``: its confirm (acked, nacked), or None if none comes."""
        rng = self.rng
        if self.faults and rng.random() < self.p_broker:
            fault = rng.randrange(4)
            what = ("message dropped", "message nacked", "confirm lost", "message twice")[fault]
            self.seen[what] += 1
            if fault == 0:
                return None  # lost before it was confirmed
            if fault == 1:
                return False
            self.queue.append(msg)
            if fault == 2:
                return None  # in the queue; the confirm was lost
            self.queue.append(Msg(msg.entry, msg.due, msg.task_id, msg.put_off, msg.at))
            return True
        self.queue.append(msg)
        return True

    # -- workers ----------------------------------------------------------------------------

    def step_worker(self, w: Worker) -> None:
        rng = self.rng
        if not w.alive:
            if not self.faults or rng.random() < 0.1:
                w.gen, w.alive, w.msg, w.stage = w.gen + 1, True, None, "idle"
            return
        if self.now < w.paused_until:
            if not w.lapsed and self.now - w.paused_at >= LIVENESS:
                self.lapse(w)
            return
        if w.lapsed and w.msg is None:  # woke up idle, a new process already
            w.lapsed = False
        if self.faults and rng.random() < self.p_crash:
            self.kill(w)
            return
        if self.faults and rng.random() < self.p_crash / 4:
            w.paused_at, w.paused_until = self.now, self.now + rng.randrange(2 * LIVENESS)
            self.seen["worker paused"] += 1
            self.log(w.name, "paused", w.stage)
            return
        if w.stage == "idle":
            ready = [i for i, m in enumerate(self.queue) if m.at <= self.now]
            if not ready:
                return
            i = ready[0] if rng.random() < 0.7 else rng.choice(ready)  # out of order at times
            w.msg, w.stage = self.queue.pop(i), "received"
            w.delivery = f"d{next(self.tokens)}"  # acknowledged at once, unless acks_late
            self.log(w.name, w.delivery, "received", (w.msg.entry, w.msg.due), w.msg.put_off)
            if self.acks_late:
                self.unacked[w.name] = w.msg
        elif w.stage == "received":
            if w.checked:
                self.worker_start(w)
            else:
                self.worker_unchecked(w)
        elif w.stage == "busy":
            self.worker_put_off(w)
        elif w.stage == "started":
            key = (w.msg.entry, w.msg.due)  # type: ignore[union-attr]
            self.running[key] += 1
            others = self.bodies.setdefault(key, set())
            free = self.lapsed | self.said_deliveries
            if others and not (w.delivery in free or others <= free):
                raise Failure(f"two bodies of {key} at once")
            others.add(w.delivery)
            w.stage = "body"
        elif w.stage == "body":
            key = (w.msg.entry, w.msg.due)  # type: ignore[union-attr]
            self.running[key] -= 1
            self.bodies[key].discard(w.delivery)
            self.completions[key] += 1
            w.stage = "ended"
        elif w.stage == "ended":
            if w.checked:
                self.worker_finish(w)
            else:
                self.done(w)  # nothing records its end

    def worker_start(self, w: Worker) -> None:
        m = w.msg
        assert m is not None
        d = runstate.Delivery(m.entry, m.due, m.task_id, w.delivery, w.name, self.acks_late,
                              m.put_off)  # fmt: skip
        try:
            decided = self.call(lambda: self.store.start(NS, d, self.alive))
        except DBError:
            self.defer(w, may_have_started=True)
            return
        if 4 in self.revert and decided.verdict == "defer":
            decided = runstate.Start("skip", "running", None)
        self.log(w.name, w.delivery, (m.entry, m.due), decided.verdict, decided.reason)
        self.seen[f"{decided.verdict}: {decided.reason}"] += 1
        if decided.verdict == "run":
            busy = self.faults and self.rng.random() < self.p_busy
            w.stage = "busy" if busy else "started"
            self.seen["busy key"] += busy
        elif decided.verdict == "defer":
            self.defer(w, may_have_started=False)
        else:
            if 10 in self.revert:  # closed by task id, whichever delivery started it
                row = next(r for r in self.store.rows(NS) if (r.entry, r.due) == (m.entry, m.due))
                if row.delivery is not None:
                    self.store.finish(NS, d.key, row.delivery, "IGNORED")
                    self.check_closed((m.entry, m.due))
            self.done(w)

    def worker_unchecked(self, w: Worker) -> None:
        """No --election: the run is not asked for; the warning is the process's to give."""
        m = w.msg
        assert m is not None
        self.seen["ran unchecked"] += 1
        if 11 not in self.revert:
            said = Said()
            once.log.addHandler(said)
            try:
                with mock.patch.object(once, "_unchecked_warned", self.warned[w.name]):
                    once.warn_unchecked(UncheckedTask(m.task_id))
            finally:
                once.log.removeHandler(said)
            if any("--election" in line for line in said.lines):
                self.said.add(w.name)
        key, warned = (m.entry, m.due), w.name in self.said
        self.unguarded[key] = self.unguarded.get(key, True) and warned
        if warned:
            self.said_deliveries.add(w.delivery)
            self.excused[key] = "run by a worker without the check, which said so"
        w.stage = "started"

    def worker_put_off(self, w: Worker) -> None:
        """A busy singleton key: give the run back, and come back later."""
        m = w.msg
        assert m is not None
        if 2 not in self.revert:
            # if it fails, the copy names this try: it finds the run its own
            with contextlib.suppress(DBError):
                self.call(lambda: self.store.release(NS, runstate.run_key(m.task_id), w.delivery))
        self.defer(w, may_have_started=2 not in self.revert)

    def defer(self, w: Worker, may_have_started: bool) -> None:
        """Publish the delivery again a little later, then acknowledge this one."""
        m = w.msg
        assert m is not None
        tries = (*m.put_off, w.delivery) if may_have_started else m.put_off
        if 6 in self.revert:
            tries = tries[-1:]
        self.queue.append(Msg(m.entry, m.due, m.task_id, tries, self.now + DEFER))
        self.log(w.name, w.delivery, (m.entry, m.due), "put off, again as", tries)
        self.done(w)

    def worker_finish(self, w: Worker) -> None:
        m = w.msg
        assert m is not None
        try:
            self.call(
                lambda: self.store.finish(NS, runstate.run_key(m.task_id), w.delivery, "SUCCESS")
            )
        except DBError:
            return  # tried again at its next step (the worker knows the outcome)
        self.check_closed((m.entry, m.due))
        self.done(w)

    def done(self, w: Worker) -> None:
        self.unacked.pop(w.name, None)  # acks_late: acknowledged now
        w.msg, w.stage = None, "idle"
        if w.lapsed:  # its liveness lapsed while paused: it comes back as a new process
            w.gen, w.lapsed = w.gen + 1, False

    def lapse(self, w: Worker) -> None:
        """Paused past its liveness: seen dead, and the broker gives its message back."""
        self.seen[f"worker lapsed ({w.stage})"] += 1
        self.log(w.name, w.delivery, "paused past its liveness", w.stage)
        self.dead_at[w.name] = w.paused_at
        w.lapsed = True
        if w.msg is None:  # nothing in hand: it comes back as a new process
            w.gen += 1
            return
        self.lapsed.add(w.delivery)
        held = self.unacked.pop(w.name, None)
        if held is not None:
            self.queue.append(held)
        self.excuse(w, "paused past its liveness")
        if w.stage != "ended":
            # its body and a taking-over one may run at once (only with this one): nothing
            # stops a running body (docs/beat.md); the row must still know who ends it
            self.excused[(w.msg.entry, w.msg.due)] = "paused past its liveness mid-run"

    def excuse(self, w: Worker, what: str) -> None:
        """What the acknowledgement mode gives up when ``w`` stops where it is."""
        if w.msg is None:
            return
        key = (w.msg.entry, w.msg.due)
        if not self.acks_late and w.stage in ("received", "busy", "started", "body"):
            self.excused[key] = f"acked early, {what} before its body ended"
        if self.acks_late and w.stage == "ended":
            self.excused[key] = f"acks_late, {what} after its body, before its end was recorded"
        if w.stage == "ended":  # its end is not recorded: reaped, it may read "lost"
            self.unrecorded.add(key)

    def kill(self, w: Worker) -> None:
        m = w.msg
        self.log(w.name, "killed", w.stage, m and (m.entry, m.due))
        self.seen[f"worker killed ({w.stage})"] += 1
        if m is not None:
            key = (m.entry, m.due)
            if w.stage == "body":
                self.running[key] -= 1
                self.bodies[key].discard(w.delivery)
            self.excuse(w, "killed")
        held = self.unacked.pop(w.name, None)
        if held is not None:
            self.queue.append(held)  # the broker delivers it again
        self.dead_at[w.name] = self.now
        w.alive, w.msg, w.stage = False, None, "idle"

    # -- the run ----------------------------------------------------------------------------

    def check_closed(self, key: tuple[str, int]) -> None:
        """Invariant 4: a row that ended is not the row of a body still running."""
        row = next((r for r in self.store.rows(NS) if (r.entry, r.due) == key), None)
        if row is None or row.state != runstate.ENDED:
            return
        if row.outcome == runstate.LOST and row.delivery in self.lapsed:
            return  # reaped as lost, its worker paused, not dead: its end will say so
        if row.delivery in self.bodies.get(key, ()):
            raise Failure(f"{key}'s row ended while its body runs")

    def step(self) -> None:
        self.now += self.rng.randint(1, 40)
        actors: list[Any] = [*self.beats, *self.workers]
        actor = self.rng.choice(actors)
        if isinstance(actor, Beat):
            self.step_beat(actor)
        else:
            self.step_worker(actor)

    def run(self) -> None:
        while self.now < self.horizon:
            self.step()
        self.faults = False
        for _ in range(QUIET_STEPS):
            self.step()
            if self.settled():
                break
        self.judge()

    def settled(self) -> bool:
        if self.queue or self.requests or self.pending_requests:
            return False
        if any(w.msg is not None for w in self.workers):
            return False
        open_rows = [r for r in self.store.rows(NS) if r.state in runstate.OPEN
                     and (r.entry, r.due) not in self.excused]  # fmt: skip
        return not open_rows and len(self.store.rows(NS)) >= self.expected()

    def expected(self) -> int:
        return sum(len(ds) for ds in self.dues.values()) + len(self.asked)

    def judge(self) -> None:
        if self.queue or self.requests or self.pending_requests:
            raise Failure(f"still going round after {QUIET_STEPS} quiet steps: "
                          f"{len(self.queue)} messages queued")  # fmt: skip
        runs = [(e, d) for e, ds in self.dues.items() for d in ds]
        runs += [("now", -r) for r in self.asked]
        rows = {(r.entry, r.due): r for r in self.store.rows(NS)}
        for key in runs:
            n, why = self.completions[key], self.excused.get(key)
            if key in self.unguarded:  # invariant 1 does not hold: it must have been said
                row = rows.get(key)
                if not self.unguarded[key] and (n != 1 or row is None
                                                or row.state in runstate.OPEN):  # fmt: skip
                    raise Failure(f"{key} ran {n} times, its row {row and row.state}, on a "
                                  "worker without the check that said nothing")  # fmt: skip
                continue
            if n == 1 or (why and (n == 0 if not self.acks_late else n >= 1)):
                continue
            raise Failure(f"{key} ran {n} times" + (f" ({why})" if why else ""))
        for key in runs:
            row = rows.get(key)
            if key in self.unguarded:
                continue  # judged above
            if row is None or (row.state in runstate.OPEN and key not in self.excused):
                raise Failure(f"{key} pending forever: {row}")
            if (
                row.outcome == runstate.LOST
                and self.completions[key]
                and key not in self.unrecorded
            ):
                raise Failure(f"{key} recorded lost, though its body ended: {row}")


def check(
    seed: int,
    revert: frozenset[int] = frozenset(),
    trace: bool = False,
    seen: Counter[str] | None = None,
) -> str | None:
    """Run one schedule: None if every invariant held, else what broke.

    ``seen``: add to it what happened (the faults, each start's verdict and reason).
    """
    world = World(seed, revert, trace)
    try:
        world.run()
    except Failure as exc:
        return str(exc)
    finally:
        if seen is not None:
            seen.update(world.seen)
            seen["excused"] += len(world.excused)
            seen["runs"] += sum(world.completions.values())
    return None


def explore(
    seeds: range, revert: frozenset[int] = frozenset(), seen: Counter[str] | None = None
) -> tuple[int, str] | None:
    """The first seed in ``seeds`` that breaks an invariant, and what broke."""
    for seed in seeds:
        broke = check(seed, revert, seen=seen)
        if broke is not None:
            return seed, broke
    return None


def replay_command(seed: int, revert: frozenset[int] = frozenset()) -> str:
    reverts = "".join(f" --revert {r}" for r in sorted(revert))
    return f"python -m harness.runsim --seed {seed}{reverts} --trace"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--schedules", type=int, default=10_000)
    parser.add_argument("--first", type=int, default=0, help="the first seed")
    parser.add_argument("--seed", type=int, help="replay one schedule")
    parser.add_argument("--trace", action="store_true")
    parser.add_argument("--revert", type=int, action="append", default=[],
                        help=f"undo a window's fix: {sorted(REVERTS)}")  # fmt: skip
    args = parser.parse_args()
    revert = frozenset(args.revert)
    if args.seed is not None:
        broke = check(args.seed, revert, args.trace)
        print(broke or "every invariant held")
        sys.exit(1 if broke else 0)
    start = time.monotonic()
    seen: Counter[str] = Counter()
    found = explore(range(args.first, args.first + args.schedules), revert, seen)
    took = time.monotonic() - start
    for what, n in sorted(seen.items()):
        print(f"{n:10d}  {what}")
    if found is None:
        print(f"{args.schedules} schedules, every invariant held ({took:.1f} s)")
        return
    seed, broke = found
    print(f"seed {seed}: {broke}\nreplay: {replay_command(seed, revert)}")
    sys.exit(1)


if __name__ == "__main__":
    main()
