"""The transfer steps every backend passes: memory, SQLite, PostgreSQL, MariaDB, each driver.

``transfer`` (the leader's hand-over) and ``ask_transfer`` (an operator's request) are one
conditional write each, naming the target; one test per condition of their WHERE clause
(harness/mutations.py removes each, ``transfer-*``): the exact holder token, the exact
term, an unexpired lease, and a target that is a live, eligible candidate of this
namespace.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from celery_election.core.lease import Bid, CandidateInfo, Lease

from ..conftest import EVERY_KIND, expire, expire_candidates, make_backend, token

NS = "handover"
TTL = 30.0


@pytest.fixture(params=EVERY_KIND)
def backend(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[Any]:
    yield from make_backend(request.param, tmp_path)


def _setup(
    backend: Any, *, eligible: bool = True, namespace: str = NS
) -> tuple[str, Lease, CandidateInfo]:
    """``a`` leads NS; ``b`` is a candidate of ``namespace`` (listed there)."""
    a, b = token(), token()
    lease = backend.elect(Bid(NS, a, "a", TTL)).lease
    backend.register(NS, a, "a", "host-a", 1, TTL)
    backend.register(namespace, b, "b", "host-b", 2, TTL, eligible=eligible)
    [target] = [c for c in backend.candidates(namespace) if c.token == b]
    return a, lease, target


def test_the_leader_hands_its_term_to_a_live_eligible_target(backend: Any) -> None:
    a, lease, b = _setup(backend)
    result = backend.transfer(NS, a, lease.term, b, TTL)
    moved = result.lease
    assert result.won and moved.held_by(b.token) and moved.leader_id == "b"
    assert moved.term > lease.term and moved.liveness_us is None  # untagged: no take-over
    assert TTL - 1 < moved.remaining <= TTL
    assert backend.current(NS).held_by(b.token)
    # the giver can neither renew its old term nor touch the new one
    assert not backend.renew(NS, a, lease.term, TTL).won
    assert not backend.renew(NS, a, moved.term, TTL).won
    assert not backend.resign(NS, a, moved.term)
    # nobody can elect in between: the term is held, not vacant
    assert not backend.elect(Bid(NS, token(), "c", TTL)).won
    # the target renews it (then believes it: election/loop.py ``_accept``)
    assert backend.renew(NS, b.token, moved.term, TTL).won


def test_a_transfer_needs_the_holders_token(backend: Any) -> None:
    _, lease, b = _setup(backend)
    assert not backend.transfer(NS, token(), lease.term, b, TTL).won
    assert backend.current(NS).term == lease.term and not backend.current(NS).held_by(b.token)


def test_a_transfer_needs_the_exact_term(backend: Any) -> None:
    a, lease, b = _setup(backend)
    for term in (lease.term - 1, lease.term + 1):
        assert not backend.transfer(NS, a, term, b, TTL).won
    assert backend.current(NS).held_by(a)


def test_an_expired_term_is_not_transferred(backend: Any) -> None:
    a, lease, b = _setup(backend)
    expire(backend, NS)
    assert not backend.transfer(NS, a, lease.term, b, TTL).won
    assert not backend.current(NS).held


def test_a_target_whose_heartbeat_expired_is_refused(backend: Any) -> None:
    a, lease, b = _setup(backend)
    expire_candidates(backend, NS)
    assert not backend.transfer(NS, a, lease.term, b, TTL).won
    assert backend.current(NS).held_by(a)


def test_an_ineligible_target_is_refused(backend: Any) -> None:
    a, lease, b = _setup(backend, eligible=False)
    assert not backend.transfer(NS, a, lease.term, b, TTL).won
    assert backend.current(NS).held_by(a)


def test_a_candidate_of_another_namespace_is_refused(backend: Any) -> None:
    a, lease, b = _setup(backend, namespace="elsewhere")
    assert not backend.transfer(NS, a, lease.term, b, TTL).won
    assert backend.current(NS).held_by(a)


def test_an_unknown_target_is_refused(backend: Any) -> None:
    a, lease, _ = _setup(backend)
    ghost = CandidateInfo("ghost", "h", 3, 0, 0, token=token())
    assert not backend.transfer(NS, a, lease.term, ghost, TTL).won
    assert backend.current(NS).held_by(a)


def test_an_operator_asks_and_the_request_lives_for_that_term_only(backend: Any) -> None:
    a, lease, b = _setup(backend)
    assert backend.ask_transfer(NS, lease, b)
    assert backend.current(NS).transfer_to == b.token
    renewed = backend.renew(NS, a, lease.term, TTL)
    assert renewed.won and renewed.lease.transfer_to == b.token  # the leader reads it here
    moved = backend.transfer(NS, a, lease.term, b, TTL).lease
    assert moved.transfer_to is None  # the hand-over clears it
    assert backend.ask_transfer(NS, moved, CandidateInfo("a", "h", 1, 0, 0, token=a)) is True
    assert backend.resign(NS, b.token, moved.term)
    assert backend.current(NS).transfer_to is None  # so does a resign
    assert backend.elect(Bid(NS, a, "a", TTL)).lease.transfer_to is None  # and a new term


@pytest.mark.parametrize("why", ["holder", "term", "expired", "not live", "ineligible", "unknown"])
def test_an_ask_is_refused_as_the_transfer_would_be(backend: Any, why: str) -> None:
    a, lease, b = _setup(backend, eligible=why != "ineligible")
    seen = lease
    if why == "holder":
        seen = Lease(NS, lease.term, "x", lease.expires_at_us, lease.db_now_us, token=token())
    elif why == "term":
        seen = Lease(NS, lease.term - 1, "a", lease.expires_at_us, lease.db_now_us, token=a)
    elif why == "expired":
        expire(backend, NS)
    elif why == "not live":
        expire_candidates(backend, NS)
    elif why == "unknown":
        b = CandidateInfo("ghost", "h", 3, 0, 0, token=token())
    assert not backend.ask_transfer(NS, seen, b)
    assert backend.current(NS).transfer_to is None
