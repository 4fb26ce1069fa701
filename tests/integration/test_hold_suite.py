"""One hold, two uses: the election's lease and a singleton task's key, on every backend.

Both are the same steps (``sql_lease.hold_updates``, ``memory_hold``): take a vacant or
expired hold with a greater term, extend and release exactly the holder's term, take over
exactly the term seen once its holder's session ended. So one suite states the contract
once and runs it over both uses, each WHERE condition a test (River's one subtest per
condition), each a mutation in ``harness/mutations.py`` (``lease-``, ``keys-``,
``memory-``). What only one use has stays in its own suite: candidates, resign's NOTIFY,
install and the namespaces' collation (test_backend_suite.py); renewing every hold of a
token at once, an operator's release and the holder's lock (test_key_suite.py).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator
from typing import Any

import pytest

from celery_election.core.lease import Bid, ElectResult, Lease

from ..conftest import EVERY_KIND, expire, make_backend, token

NS = "holds"


@dataclasses.dataclass
class Use:
    """The steps of one use, as the hold's contract names them; ``key`` "": the lease."""

    backend: Any
    key: str

    def bid(self, holder: str, label: str, **kw: Any) -> Bid:
        return Bid(NS, holder, label, kw.pop("ttl", 30.0), self.key, **kw)

    def take(self, bid: Bid) -> ElectResult:
        return self.backend.keys.hold(bid) if self.key else self.backend.elect(bid)

    def take_over(self, bid: Bid, seen: Lease, waited: float) -> ElectResult:
        store = self.backend.keys if self.key else self.backend
        result: ElectResult = store.take_over(bid, seen, waited)
        return result

    def extend(self, holder: str, term: int, ttl: float = 30.0) -> bool:
        """Renew exactly (holder, term); a key's renewal is its token's, of all its keys."""
        if not self.key:
            return bool(self.backend.renew(NS, holder, term, ttl).won)
        renewed = self.backend.keys.renew(Bid(NS, holder, "", ttl))
        return any(h.key == self.key and h.term == term for h in renewed)

    def release(self, holder: str, term: int) -> bool:
        if self.key:
            return bool(self.backend.keys.release(NS, self.key, holder, term))
        return bool(self.backend.resign(NS, holder, term))

    def get(self) -> Lease | None:
        return self.backend.keys.get(NS, self.key) if self.key else self.backend.current(NS)

    def expire(self) -> None:
        expire(self.backend, NS, self.key)


@pytest.fixture(params=EVERY_KIND)
def backend(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[Any]:
    yield from make_backend(request.param, tmp_path)


@pytest.fixture(params=["lease", "key"])
def use(request: pytest.FixtureRequest, backend: Any) -> Use:
    return Use(backend, "" if request.param == "lease" else "report:7")


def test_the_first_take_creates_the_row_and_wins(use: Use) -> None:
    assert use.get() is None
    a = token()
    result = use.take(use.bid(a, "a"))
    assert result.won and result.lease is not None
    assert result.lease.held_by(a) and result.lease.leader_id == "a" and result.lease.term > 0
    assert result.lease.key == use.key
    assert 29.0 < result.lease.remaining <= 30.0
    assert use.get().held_by(a)  # type: ignore[union-attr]


def test_a_live_hold_is_never_taken(use: Use) -> None:
    a, b = token(), token()
    first = use.take(use.bid(a, "a"))
    second = use.take(use.bid(b, "b"))
    assert first.won and not second.won
    assert second.lease.held_by(a) and second.lease.term == first.lease.term  # type: ignore[union-attr]
    assert not use.take(use.bid(a, "a")).won  # its holder asking again: no new term


def test_an_expired_hold_is_taken_with_a_greater_term(use: Use) -> None:
    a, b = token(), token()
    first = use.take(use.bid(a, "a")).lease
    assert first is not None
    use.expire()
    assert not use.get().held  # type: ignore[union-attr]
    second = use.take(use.bid(b, "b")).lease
    assert second is not None and second.held_by(b) and second.term > first.term
    # the old holder can neither extend nor release the new hold, nor its own old one
    for term in (first.term, second.term):
        assert not use.extend(a, term)
        assert not use.release(a, term)
    assert use.get().held_by(b)  # type: ignore[union-attr]


def test_extend_needs_the_holders_token_and_an_unexpired_hold(use: Use) -> None:
    a, b = token(), token()
    held = use.take(use.bid(a, "a", ttl=5.0)).lease
    assert held is not None
    assert not use.extend(b, held.term)
    assert use.get().remaining <= 5.0  # type: ignore[union-attr]
    assert use.extend(a, held.term)
    assert use.get().remaining > 29.0 and use.get().term == held.term  # type: ignore[union-attr]
    use.expire()
    assert not use.extend(a, held.term)  # expired stays expired
    again = use.take(use.bid(a, "a")).lease
    assert again is not None and again.term > held.term


def test_release_needs_the_exact_token_and_term_and_the_term_stays(use: Use) -> None:
    a, b = token(), token()
    held = use.take(use.bid(a, "a")).lease
    assert held is not None
    assert not use.release(b, held.term)
    assert not use.release(a, held.term - 1)
    assert use.get().held_by(a)  # type: ignore[union-attr]
    assert use.release(a, held.term)
    assert not use.release(a, held.term)  # vacant already
    after = use.get()
    assert after is not None and not after.held and after.term == held.term
    assert after.leader_id is None
    again = use.take(use.bid(b, "b")).lease
    assert again is not None and again.term > held.term


def test_a_late_release_of_an_old_term_leaves_the_new_one(use: Use) -> None:
    """Scoped to (token, term): the same holder, taking again after its hold ran out, is
    not vacated by a release of its previous term arriving late."""
    a = token()
    old = use.take(use.bid(a, "a")).lease
    use.expire()
    new = use.take(use.bid(a, "a")).lease
    assert old is not None and new is not None and new.term > old.term
    assert not use.release(a, old.term)
    assert use.get().held and use.get().term == new.term  # type: ignore[union-attr]


def test_terms_strictly_increase_across_many_changes(use: Use) -> None:
    terms = []
    for i in range(12):
        t = token()
        result = use.take(use.bid(t, f"c{i}"))
        assert result.won and result.lease is not None
        terms.append(result.lease.term)
        if i % 2:
            assert use.release(t, result.lease.term)
        else:
            use.expire()
    assert all(x < y for x, y in itertools.pairwise(terms))


def test_take_over_needs_the_seen_term_holder_tag_and_wait(use: Use) -> None:
    """Each condition of take_over alone refuses it."""
    a, b = token(), token()
    held = use.take(use.bid(a, "a", liveness=1.0)).lease
    assert held is not None and held.liveness_us == 1_000_000
    refused = {
        "an older term": dataclasses.replace(held, term=held.term - 1),
        "another holder": dataclasses.replace(held, token=token()),
    }
    for why, seen in refused.items():
        assert not use.take_over(use.bid(b, "b"), seen, 2.0).won, why
    assert not use.take_over(use.bid(b, "b"), held, 0.999).won, "waited less than delta"
    assert use.get().held_by(a)  # type: ignore[union-attr]
    taken = use.take_over(use.bid(b, "b"), held, 1.0).lease  # waited exactly delta
    assert taken is not None and taken.held_by(b) and taken.term > held.term
    assert not use.extend(a, held.term)  # the old term is over
    assert not use.release(a, held.term)


def test_an_untagged_hold_is_never_taken_over(use: Use) -> None:
    a, b = token(), token()
    held = use.take(use.bid(a, "a")).lease  # liveness off: untagged
    assert held is not None and held.liveness_us is None
    assert not use.take_over(use.bid(b, "b"), held, 3600.0).won
    assert use.get().held_by(a)  # type: ignore[union-attr]


def test_a_floor_raises_the_new_term(use: Use) -> None:
    """The elector's floor (greatest term seen + 1, its host clock) wins over a database
    clock that is behind: a standby promoted with its clock late never reissues a term."""
    a, b, c = token(), token(), token()
    first = use.take(use.bid(a, "a", liveness=1.0)).lease
    assert first is not None
    floor = first.term + 10**12
    taken = use.take_over(use.bid(b, "b", floor=floor), first, 1.0)
    assert taken.won and taken.lease is not None and taken.lease.term == floor
    use.expire()
    again = use.take(use.bid(c, "c", floor=floor + 5))
    assert again.won and again.lease is not None and again.lease.term == floor + 5


def test_holds_of_other_namespaces_and_keys_are_apart(use: Use) -> None:
    a, b = token(), token()
    assert use.take(use.bid(a, "a")).won
    elsewhere = Bid("other-" + NS, b, "b", 30.0, use.key)
    assert use.take(elsewhere).won
    assert use.get().held_by(a)  # type: ignore[union-attr]
