r"""A run's life as one row, and each of its transitions as a pure function.

A beat run is one row from its claim to its end, unique per (namespace, entry, due time):

    CLAIMED --confirm--> SENT --start--> STARTED --finish--> ENDED
       |                  ^                 |  \--release--> SENT   (put off: it never ran)
       |                  |                 \--reap--> ENDED        (early ack, starter dead)
       +--drop--> DROPPED +-- start also takes a CLAIMED row (a worker faster than the confirm)

No I/O, no clock, no threads: a store (memory or SQL) applies a function to the row it
holds, in one statement or under one lock, and writes what it returns; ``None`` means the
row does not change. Each guard is a mutation target (harness/mutations.py), table-tested
(tests/unit/test_runstate.py), and the seeded simulation (harness/runsim.py) finds a lost,
doubled or stuck run when most of them are removed (the mutation table says why not for
the others). What each guard closes, by the windows of issue 52:

* a run belongs to the term that owes it: only that term sends it and drops it, a later
  leader adopts it (:func:`adopt`), and the owed rows are read from the store, never
  kept only in memory (windows 3, 8, 9: a claim whose answer was lost, a catch-up run
  refused, a "run now" sent with no claim);
* a start names its delivery (a token drawn per try) and the worker process running it;
  another delivery takes a started run over only when the starter is dead and the run
  is acknowledged late, and waits (is put off) while the starter lives (windows 4, 5, 6:
  the redelivery of a resent copy skipped, a second first delivery run again, a put-off
  copy that lost its owner);
* a run ends by the delivery that started it, and a put-off start gives the run back
  (windows 2 and 10: a busy singleton key's requeue, a skipped copy that closed the run).
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Callable, Collection
from dataclasses import dataclass, replace
from typing import Any

__all__ = [
    "CLAIMED",
    "DROPPED",
    "ENDED",
    "SENT",
    "STARTED",
    "Delivery",
    "Row",
    "Start",
    "adopt",
    "claim",
    "confirm",
    "drop",
    "finish",
    "owes",
    "reap",
    "release",
    "run_key",
    "run_now_task_id",
    "run_task_id",
    "start",
]

CLAIMED, SENT, STARTED, ENDED, DROPPED = "claimed", "sent", "started", "ended", "dropped"
#: The outcome of a reaped run: acknowledged early, its worker died (maybe mid-body).
LOST = "LOST"
#: The states a run is still on its way in (a run in them is pending).
OPEN = frozenset({CLAIMED, SENT, STARTED})


#: uuid5 namespace of the beat runs' task ids (a fixed random UUID: ids of no other scheme)
_RUNS = uuid.UUID("8f1d0b62-4a36-4d1c-9d57-3c3c1b1a7e65")


def run_task_id(namespace: str, entry: str, at: int) -> str:
    """The task id of every send of the beat run of ``entry`` stored at ``at`` (epoch us).

    Drawn at the claim, which writes the run's row under it (:func:`run_key`): every
    copy of the run, whoever sends it, names that one row.
    """
    return str(uuid.uuid5(_RUNS, f"{namespace}\0{entry}\0{at}"))


def run_now_task_id(namespace: str, entry: str, requested_at: int) -> str:
    """The task id of every send of the "run now" of ``entry`` requested at ``requested_at``."""
    return str(uuid.uuid5(_RUNS, f"{namespace}\0{entry}\0now\0{requested_at}"))


def run_key(task_id: str, retries: int = 0) -> str:
    """A run's key in its store: a hash of the task id and its retry number.

    A retry is a run of its own; the hash fits a MySQL key. Every copy of a beat run
    carries one task id, drawn from (namespace, entry, due) at the claim.
    """
    return hashlib.sha1(f"{task_id}/{retries}".encode()).hexdigest()


@dataclass(frozen=True)
class Row:
    """One run: who owes it, how far it got, and which delivery runs it."""

    entry: str
    due: int  # the run's key: its due time (epoch us), or the "run now" request's time
    task_id: str
    term: int  # the term that owes it: claimed it, or adopted it
    state: str = CLAIMED
    attempt: int = 0  # bodies started (more than one only under acks_late, after a death)
    delivery: str | None = None  # the try that started it (a token drawn per delivery)
    worker: str | None = None  # the worker process running it (its liveness is looked up)
    acks_late: bool = False
    outcome: str | None = None


@dataclass(frozen=True)
class Delivery:
    """One delivery of a run, as its worker's start names it."""

    entry: str
    due: int
    task_id: str
    token: str  # drawn per try: a copy put off and delivered again is a new try
    worker: str | None  # its process's liveness token (None: it has no liveness session)
    acks_late: bool
    #: the tries that put this copy off before (each wrote, or may have written, its own
    #: start before the database stopped answering): a row one of them started is its own
    put_off: Collection[str] = ()
    retries: int = 0  # Celery's retry number: a retry is a run of its own
    claimed: bool = False  # a beat run: its claim wrote the row (the store tries it first)

    @property
    def key(self) -> str:
        """The run's key in its store (:func:`run_key`)."""
        return run_key(self.task_id, self.retries)


@dataclass(frozen=True)
class Start:
    """What a delivery's start decided: run the body, skip it, or put it off."""

    verdict: str  # "run", "skip" or "defer"
    reason: str
    row: Row | None  # the row to write (None: unchanged)

    @property
    def run(self) -> bool:
        return self.verdict == "run"


# -- the beat's side ------------------------------------------------------------------------


def claim(existing: Row | None, entry: str, due: int, task_id: str, term: int) -> Row | None:
    """The leader's claim of the run of ``entry`` due at ``due``: a new row, once.

    The store checks the lease (token, term, expiry) in the same statement; here, the row
    is unique per run: a second claim of it (a split brain, a retried batch whose first
    answer was lost) changes nothing.
    """
    if existing is not None:
        return None
    return Row(entry, due, task_id, term)


def adopt(row: Row, term: int) -> Row | None:
    """A later leader takes over a run an earlier term claimed and did not send."""
    if row.state == CLAIMED and row.term < term:
        return replace(row, term=term)
    return None


def owes(row: Row, term: int) -> bool:
    """Whether ``term`` sends this run (again): claimed under it and not confirmed yet."""
    return row.state == CLAIMED and row.term == term


def confirm(row: Row) -> Row | None:
    """The broker accepted a copy of the run: it is sent (whoever sent that copy)."""
    if row.state == CLAIMED:
        return replace(row, state=SENT)
    return None


def drop(row: Row, term: int, why: str) -> Row | None:
    """The owing term gives up a run it has not sent (expired, entry removed)."""
    if owes(row, term):
        return replace(row, state=DROPPED, outcome=why)
    return None


# -- the workers' side ----------------------------------------------------------------------


def start(row: Row | None, d: Delivery, starter_alive: Callable[[str], bool]) -> Start:
    """Delivery ``d`` of the run is about to run its body: run, skip or put it off.

    ``starter_alive(worker)``: whether the worker process named in the row still lives
    (the store looks it up, only when the answer decides; a paused worker looks dead once
    its liveness lapses). A start that named no worker (it ran where no liveness session
    could be had) cannot be waited for: under ``acks_late`` it is taken over, as before.
    """
    if row is None:  # a run no beat claimed (a once task), or an older version's
        row = Row(d.entry, d.due, d.task_id, 0)
    if row.state in (CLAIMED, SENT):
        return Start("run", "started", _by(d, row, state=STARTED, attempt=row.attempt + 1,
                                           acks_late=d.acks_late))  # fmt: skip
    if row.delivery in d.put_off:
        # its own try had started it, then was put off before the body: its run (also
        # when that try's worker died since and the row was reaped as lost). A try that
        # put its copy off never ran a body, so the row it is named on is this copy's.
        return Start("run", "own", _by(d, row, state=STARTED, outcome=None))
    if row.state != STARTED:
        return Start("skip", "finished" if row.state == ENDED else "dropped", None)
    if not row.acks_late:
        return Start("skip", "started", None)  # acknowledged early: at most once
    if row.worker is not None and starter_alive(row.worker):
        return Start("defer", "running", None)  # back once it ended, or its worker died
    return Start("run", "taken over", _by(d, row, attempt=row.attempt + 1))


def _by(d: Delivery, row: Row, **changes: Any) -> Row:
    """``row`` as delivery ``d`` holds it (with ``changes``)."""
    return replace(row, delivery=d.token, worker=d.worker, **changes)


def release(row: Row, delivery: str) -> Row | None:
    """A started delivery put itself off before its body (a busy singleton key): give back."""
    if row.state == STARTED and row.delivery == delivery:
        return replace(row, state=SENT, attempt=row.attempt - 1, delivery=None, worker=None)
    return None


def finish(row: Row, delivery: str, outcome: str) -> Row | None:
    """The run's body ended in ``delivery``: the row closes (another copy's end does not).

    Also a row reaped as lost: its worker was paused past its liveness, not dead, and
    its body went on to this end.
    """
    if row.delivery == delivery and (row.state == STARTED or row.outcome == LOST):
        return replace(row, state=ENDED, outcome=outcome)
    return None


def reap(row: Row, starter_alive: Callable[[str], bool]) -> Row | None:
    """A run acknowledged early whose worker died mid-body: ended, lost (at most once).

    Under ``acks_late`` the broker delivers the run again and that delivery takes it
    over (:func:`start`); acknowledged early, nothing comes back, so the row is closed.
    """
    if (
        row.state == STARTED
        and not row.acks_late
        and row.worker is not None
        and not starter_alive(row.worker)
    ):
        return replace(row, state=ENDED, outcome=LOST)
    return None
