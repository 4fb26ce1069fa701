"""Belief, the one owner of leadership: each rule of election/belief.py, apart from any thread.

The Elector's tests (test_elector.py) show these through the protocol; here each guard is
hit directly, including the races the election thread meets only rarely (a term won while
a resign or stop is under way), so that removing one fails a test (harness/mutations.py).
"""

from __future__ import annotations

from celery_election.core.clock import FakeClock
from celery_election.core.decisions import Proof
from celery_election.core.transitions import Lead, RevokeReason, Transition
from celery_election.election.belief import Belief

TTL = 10.0


def make() -> tuple[Belief, FakeClock, list[Transition], list[tuple[int | None, float | None]]]:
    clock = FakeClock()
    posted: list[Transition] = []
    told: list[tuple[int | None, float | None]] = []
    belief = Belief("ns", "me", clock, Proof, posted.append)
    belief.watch(lambda term, until: told.append((term, until)))
    return belief, clock, posted, told


def lead(clock: FakeClock, term: int) -> Lead:
    return Lead(term, clock.monotonic() + TTL)


def kinds(posted: list[Transition]) -> list[tuple[str, int, RevokeReason | None]]:
    return [(t.kind, t.term, t.reason) for t in posted]


def test_a_term_won_is_believed_and_told_before_it_is_announced() -> None:
    belief, clock, _, told = make()
    order: list[str] = []
    belief.watch(lambda term, until: order.append("told"))
    belief._announce = lambda t: order.append(t.kind)
    won = lead(clock, 7)
    assert belief.begin(won)
    assert belief.trusted() == won and told == [(7, won.lease_until)]
    assert order == ["told", "elected"]


def test_belief_ends_at_its_trust_window_on_the_clock_alone() -> None:
    belief, clock, _, _ = make()
    belief.begin(lead(clock, 7))
    clock.advance(TTL - 0.001)
    assert belief.trusted() is not None
    clock.advance(0.001)
    assert belief.trusted() is None  # nobody called anything


def test_a_resigned_term_is_not_believed_when_the_election_thread_wins_it_late() -> None:
    """resign() vetoes the term held; the election thread's in-flight win must not begin it."""
    belief, clock, posted, _ = make()
    belief.end(RevokeReason.RESIGNED, veto=7)
    assert not belief.begin(lead(clock, 7))
    assert not belief.begin(lead(clock, 6))
    assert belief.trusted() is None and posted == []
    assert belief.begin(lead(clock, 8))  # a later term is a new election


def test_nothing_is_believed_between_stop_and_start() -> None:
    belief, clock, posted, _ = make()
    belief.end(RevokeReason.STOPPED, close=True)
    assert belief.closed
    assert not belief.begin(lead(clock, 9))
    belief.open()
    assert belief.begin(lead(clock, 9))
    assert kinds(posted) == [("elected", 9, None)]


def test_each_term_is_revoked_once_whoever_ends_it_first() -> None:
    """The caller's resign, the dispatcher's expiry and the loop's give-up meet: one line."""
    belief, clock, posted, told = make()
    belief.begin(lead(clock, 7))
    assert belief.end(RevokeReason.RESIGNED, veto=7) is not None
    clock.advance(TTL)
    assert belief.expire() == (None, None)
    assert belief.end(RevokeReason.EXPIRED) is None
    assert belief.end(RevokeReason.STOPPED, close=True) is None
    assert kinds(posted) == [("elected", 7, None), ("revoked", 7, RevokeReason.RESIGNED)]
    assert told[-1] == (None, None) and told.count((None, None)) == 1


def test_the_dispatcher_ends_belief_when_its_trust_runs_out() -> None:
    belief, clock, posted, _ = make()
    won = lead(clock, 7)
    belief.begin(won)
    left, ended = belief.expire()
    assert left == TTL and ended is None
    clock.advance(TTL)
    assert belief.expire() == (0.0, won)
    assert kinds(posted)[-1] == ("revoked", 7, RevokeReason.EXPIRED)


def test_trust_that_ran_out_never_comes_back() -> None:
    """A renewal that returns after the window ended must not revive belief in the term."""
    belief, clock, _, told = make()
    belief.begin(lead(clock, 7))
    clock.advance(TTL + 0.5)
    belief.extend(lead(clock, 7))  # the late renewal's window, from its own start
    assert belief.trusted() is None
    assert told == [(7, 1000.0 + TTL)]


def test_a_renewal_extends_the_term_believed_and_the_watchers_hear_it() -> None:
    belief, clock, _, told = make()
    belief.begin(lead(clock, 7))
    clock.advance(4.0)
    renewed = lead(clock, 7)
    belief.extend(renewed)
    belief.extend(Lead(8, renewed.lease_until + 1))  # another term: not this belief's
    assert belief.trusted() == renewed and told[-1] == (7, renewed.lease_until)
