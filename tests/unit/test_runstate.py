"""A run's transitions, from tables: what each step does to the row, given the row.

The functions are pure (core/runstate.py): no store, clock or thread. Each guard here is also a
mutation target (harness/mutations.py), killed by these rows and by the simulation
(test_run_simulation.py).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from celery_election.core import runstate
from celery_election.core.runstate import CLAIMED, DROPPED, ENDED, LOST, SENT, STARTED, Row

CLAIM = Row("e", 100, "tid", term=3)
SENT_ROW = replace(CLAIM, state=SENT)
STARTED_ROW = replace(SENT_ROW, state=STARTED, attempt=1, delivery="d1", worker="w1")
LATE = replace(STARTED_ROW, acks_late=True)
ENDED_ROW = replace(STARTED_ROW, state=ENDED, outcome="SUCCESS")


def test_a_run_is_claimed_once() -> None:
    assert runstate.claim(None, "e", 100, "tid", 3) == CLAIM
    for row in (CLAIM, SENT_ROW, STARTED_ROW, ENDED_ROW):
        assert runstate.claim(row, "e", 100, "tid", 4) is None


@pytest.mark.parametrize(
    ("row", "term", "adopted", "owed"),
    [
        (CLAIM, 4, replace(CLAIM, term=4), True),  # a later leader takes it over
        (CLAIM, 3, None, True),  # its own
        (replace(CLAIM, term=5), 4, None, False),  # a later term's: never taken back
        (SENT_ROW, 4, None, False),  # sent: nobody owes it
        (STARTED_ROW, 4, None, False),
        (ENDED_ROW, 4, None, False),
    ],
)
def test_who_owes_a_run(row: Row, term: int, adopted: Row | None, owed: bool) -> None:
    assert runstate.adopt(row, term) == adopted
    assert runstate.owes(adopted or row, term) is owed


@pytest.mark.parametrize(
    ("row", "after"),
    [
        (CLAIM, SENT_ROW),
        (SENT_ROW, None),
        (STARTED_ROW, None),  # a worker started it before the confirm came: not back
        (ENDED_ROW, None),
    ],
)
def test_a_confirm_marks_only_a_claimed_run(row: Row, after: Row | None) -> None:
    assert runstate.confirm(row) == after


def test_only_the_owing_term_drops_a_run() -> None:
    assert runstate.drop(CLAIM, 3, "expired") == replace(CLAIM, state=DROPPED, outcome="expired")
    assert runstate.drop(CLAIM, 4, "expired") is None  # not adopted yet
    assert runstate.drop(SENT_ROW, 3, "expired") is None


def start(row: Row | None, *, acks_late: bool = False, alive: bool = True,
          put_off: tuple[str, ...] = ()) -> runstate.Start:  # fmt: skip
    d = runstate.Delivery("e", 100, "tid", "d2", "w2", acks_late, put_off)
    return runstate.start(row, d, lambda worker: alive)


MINE = {"delivery": "d2", "worker": "w2"}


@pytest.mark.parametrize(
    ("row", "kwargs", "verdict", "reason", "written"),
    [
        # no row: a once task no beat claimed, or a run an older version sent
        (None, {}, "run", "started", Row("e", 100, "tid", 0, STARTED, 1, "d2", "w2")),
        (CLAIM, {}, "run", "started", replace(CLAIM, state=STARTED, attempt=1, **MINE)),
        (SENT_ROW, {"acks_late": True}, "run", "started",
         replace(SENT_ROW, state=STARTED, attempt=1, acks_late=True, **MINE)),
        # started by another delivery
        (STARTED_ROW, {}, "skip", "started", None),  # acknowledged early: at most once
        (STARTED_ROW, {"alive": False}, "skip", "started", None),
        (LATE, {"acks_late": True}, "defer", "running", None),  # its worker lives
        (LATE, {"acks_late": True, "alive": False}, "run", "taken over",
         replace(LATE, attempt=2, **MINE)),
        # started where no liveness session could be had: cannot be waited for
        (replace(LATE, worker=None), {"acks_late": True}, "run", "taken over",
         replace(LATE, attempt=2, **MINE)),
        # a copy its own try put off
        (STARTED_ROW, {"put_off": ("d0", "d1")}, "run", "own", replace(STARTED_ROW, **MINE)),
        (LATE, {"put_off": ("d1",), "acks_late": True}, "run", "own", replace(LATE, **MINE)),
        (replace(STARTED_ROW, state=ENDED, outcome=LOST), {"put_off": ("d1",), "alive": False},
         "run", "own", replace(STARTED_ROW, **MINE)),  # reaped meanwhile: never ran
        (ENDED_ROW, {"put_off": ("d9",)}, "skip", "finished", None),  # another try's
        (replace(STARTED_ROW, state=ENDED, outcome=LOST), {}, "skip", "finished", None),
        (ENDED_ROW, {"acks_late": True, "alive": False}, "skip", "finished", None),
        (replace(CLAIM, state=DROPPED), {}, "skip", "dropped", None),
    ],
)  # fmt: skip
def test_a_start(
    row: Row | None, kwargs: dict, verdict: str, reason: str, written: Row | None
) -> None:
    decided = start(row, **kwargs)
    assert (decided.verdict, decided.reason, decided.row) == (verdict, reason, written)
    assert decided.run is (verdict == "run")


@pytest.mark.parametrize(
    ("row", "delivery", "released", "finished"),
    [
        (STARTED_ROW, "d1", SENT_ROW, replace(STARTED_ROW, state=ENDED, outcome="SUCCESS")),
        (STARTED_ROW, "d2", None, None),  # another delivery's start: not this one's to end
        (SENT_ROW, "d1", None, None),
        (ENDED_ROW, "d1", None, None),  # ended once
        # reaped as lost (its worker seemed dead: paused), its own body's end is recorded
        (
            replace(STARTED_ROW, state=ENDED, outcome=LOST),
            "d1",
            None,
            replace(STARTED_ROW, state=ENDED, outcome="SUCCESS"),
        ),
        (replace(STARTED_ROW, state=ENDED, outcome=LOST), "d2", None, None),
    ],
)
def test_release_and_finish_belong_to_the_starting_delivery(
    row: Row, delivery: str, released: Row | None, finished: Row | None
) -> None:
    assert runstate.release(row, delivery) == released
    assert runstate.finish(row, delivery, "SUCCESS") == finished


@pytest.mark.parametrize(
    ("row", "alive", "reaped"),
    [
        (STARTED_ROW, False, replace(STARTED_ROW, state=ENDED, outcome=LOST)),
        (STARTED_ROW, True, None),  # its body may still run
        (replace(STARTED_ROW, worker=None), False, None),  # no worker named: nothing to ask
        (LATE, False, None),  # acks_late: the broker delivers it again, which takes it over
        (SENT_ROW, False, None),
        (ENDED_ROW, False, None),
    ],
)
def test_reap(row: Row, alive: bool, reaped: Row | None) -> None:
    assert runstate.reap(row, lambda worker: alive) == reaped


def test_the_open_states() -> None:
    assert {CLAIMED, SENT, STARTED} == runstate.OPEN


def test_the_memory_store_fences_the_claim_and_the_owed_runs_by_the_lease() -> None:
    """A term that no longer leads claims nothing and is owed nothing (a stale leader's
    view of the schedule, an entry edited since, must not make a run); the leading term
    adopts what earlier terms left claimed. The simulation cannot tell these apart (rows
    are unique per run either way): its schedule never changes."""
    from celery_election.backends.memory_runs import MemoryRuns

    leading = {"term": 2}
    runs = MemoryRuns(lambda ns, term: term == leading["term"])
    assert runs.claim("ns", 1, [("e", 100, "t1")]) == [False]  # a term over
    assert runs.rows("ns") == []
    assert runs.claim("ns", 2, [("e", 100, "t1"), ("e", 200, "t2")]) == [True, True]
    leading["term"] = 4  # term 2 died with its runs unsent; term 3 was deposed, paused
    assert runs.owed("ns", 3) == []  # the paused one neither adopts nor sends them
    assert {r.term for r in runs.rows("ns")} == {2}
    assert [(r.due, r.term) for r in runs.owed("ns", 4)] == [(100, 4), (200, 4)]
