"""``Elector.transfer``: the leader hands its term to a named candidate (memory backend).

Fake time moves only when a test advances it; the tests wait (real time, bounded) for
what the electors announce. The write itself is held to its conditions on every backend
by tests/integration/test_transfer_suite.py.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from celery_election import Elector, RevokeReason
from celery_election.backends import MemoryBackend
from celery_election.core.clock import FakeClock
from celery_election.core.transfer import TransferRefusedError, node_of, pick_target
from celery_election.errors import NotLeaderError

from ..support.fake_electors import WAIT, clock, electors, make

__all__ = ["clock", "electors"]  # the fixtures, used by name


def settle_until(
    clock: FakeClock, electors: list[Elector], condition: Any, step: float = 0.01
) -> bool:
    """Step fake time by ``step`` (200 steps at most) until ``condition``; real time too,
    for the lock threads, which act in real time."""
    sleepers = [s for e in electors for s in e.sleepers()]
    for _ in range(200):
        if condition():
            return True
        clock.settled(sleepers)
        threading.Event().wait(0.005)
        if condition():
            return True
        clock.advance(step)
    return bool(condition())


@pytest.mark.parametrize("liveness", [False, True], ids=["lease", "liveness-lock"])
def test_the_leader_hands_over_and_its_belief_ends_before_the_target_believes(
    clock: FakeClock, electors: list[Elector], liveness: bool
) -> None:
    mem = MemoryBackend(clock, liveness=liveness)
    timings: dict[str, Any] = {"liveness": 1.0 if liveness else False}
    a = make(electors, mem, clock, "a", **timings).start()
    assert settle_until(clock, [a], lambda: a.is_leader)
    b = make(electors, mem, clock, "b", **timings)
    c = make(electors, mem, clock, "c", **timings)
    giver_believed: list[bool] = []
    b.watch_trust(lambda term, until: giver_believed.append(a.is_leader) if term else None)
    for e in (b, c):
        e.start()
    assert settle_until(clock, [a, b, c], lambda: len(mem.candidates("ns")) == 3)
    old = mem.current("ns")
    assert old is not None
    sa = a.subscribe()
    moved = a.transfer("b")
    assert moved.held_by(b.token) and moved.term > old.term
    revoked = sa.get(timeout=WAIT)
    assert revoked is not None and (revoked.kind, revoked.reason) == (
        "revoked",
        RevokeReason.TRANSFERRED,
    )
    assert settle_until(clock, [a, b, c], lambda: b.is_leader)
    assert b.term == moved.term and not a.is_leader and not c.is_leader
    assert giver_believed == [False]  # when b began to believe, a no longer did
    lease = mem.current("ns")
    assert lease is not None and lease.held_by(b.token) and lease.renewed_at_us is not None


def test_an_operators_request_is_made_at_the_leaders_next_renewal(
    clock: FakeClock, electors: list[Elector]
) -> None:
    mem = MemoryBackend(clock)
    a = make(electors, mem, clock, "a").start()
    assert a.wait_for_leadership(WAIT)
    b = make(electors, mem, clock, "b").start()
    assert settle_until(clock, [a, b], lambda: len(mem.candidates("ns")) == 2)
    lease = mem.current("ns")
    assert lease is not None
    [target] = [x for x in mem.candidates("ns") if x.candidate_id == "b"]
    assert mem.ask_transfer("ns", lease, target)  # what `celery election transfer` does
    # at a's next renewal (3 s): fake time in 50 ms steps
    assert settle_until(clock, [a, b], lambda: b.is_leader, step=0.05)
    assert not a.is_leader


def test_refusals_are_one_line_each(clock: FakeClock, electors: list[Elector]) -> None:
    mem = MemoryBackend(clock)
    a = make(electors, mem, clock, "w1@h:1:aa").start()
    assert a.wait_for_leadership(WAIT)
    idle = make(electors, mem, clock, "w2@h:2:bb", eligible=False).start()
    assert settle_until(clock, [a, idle], lambda: len(mem.candidates("ns")) == 2)
    with pytest.raises(TransferRefusedError, match=r"no live candidate 'w9' .*w1@h:1:aa"):
        a.transfer("w9")
    with pytest.raises(TransferRefusedError, match="'w2@h:2:bb' is not eligible to lead"):
        a.transfer("w2@h")  # by its node name
    with pytest.raises(TransferRefusedError, match="'w1@h:1:aa' already leads 'ns'"):
        a.transfer("w1@h:1:aa")
    with pytest.raises(NotLeaderError, match="does not lead"):
        idle.transfer("w1@h")
    assert a.is_leader  # a refusal changes nothing


def test_a_node_name_that_names_two_candidates_is_refused() -> None:
    from celery_election.core.lease import CandidateInfo

    two = [CandidateInfo(f"w1@h:{p}:aa", "h", p, 0, 0, token=str(p) * 32) for p in (1, 2)]
    with pytest.raises(TransferRefusedError, match="names 2 candidates"):
        pick_target(two, "w1@h", "ns", None)
    with pytest.raises(TransferRefusedError, match="cannot take a handed-over term"):
        pick_target(two[:1], "w1@h", "ns", None)  # no release: 0.1.0's row
    released = [CandidateInfo("w1@h:1:aa", "h", 1, 0, 0, token="1" * 32, release="0.2.0")]
    assert pick_target(released, "w1@h", "ns", None) is released[0]
    assert node_of("w1@h:12:ab") == "w1@h" and node_of("plain") == "plain"
