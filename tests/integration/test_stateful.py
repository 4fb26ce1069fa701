"""A hypothesis state machine drives a real backend against a model of one lease.

The model is the protocol in a few lines: a namespace's row has a holder (a candidate's
token, or none), a term and an "expired" flag. ``elect`` wins iff the lease is vacant or
expired, and then with a term strictly greater than every term seen before; ``renew``
succeeds iff (token, term) is the current holder's and the lease has not expired;
``resign`` iff (token, term) is the current holder's. After every step the stored row must
agree with the model (invariant 1: at most one holder, the predicted one) and its term
must never go back (invariant 2).

Time never passes for the lease on its own: the ttl is long, and only the ``expire`` rule
(an UPDATE on the database clock, see ``conftest.expire``) ends a lease.
"""

from __future__ import annotations

import uuid
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from celery_election.backends import MemoryBackend
from celery_election.core.lease import Bid, Lease

from ..conftest import expire, token

TTL = 60.0
N_CANDIDATES = 4

_COMMON: dict[str, Any] = {"deadline": None, "database": None, "derandomize": True}
SETTINGS = {
    "memory": settings(max_examples=150, stateful_step_count=50, **_COMMON),
    "sql": settings(max_examples=25, stateful_step_count=30, **_COMMON),
}

candidates = st.integers(min_value=0, max_value=N_CANDIDATES - 1)
#: Which term a renew or resign presents: the last one this candidate held, the row's
#: current term (maybe someone else's), an older term it once held, or a future one.
term_choices = st.sampled_from(["own", "current", "stale", "next"])
#: For the holder, mostly its own (current) term: the renewal that should succeed.
holder_term_choices = st.sampled_from(["own", "own", "own", "stale", "next"])


def make_machine(backend: Any) -> type[RuleBasedStateMachine]:
    """A state machine class bound to ``backend``; each example gets a fresh namespace."""

    class LeaseMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.backend = backend
            self.ns = f"sm-{uuid.uuid4().hex[:12]}"
            self.tokens = [token() for _ in range(N_CANDIDATES)]
            # the model
            self.exists = False  # the row is created by the first elect
            self.holder: int | None = None  # index of the candidate whose token is stored
            self.term = 0
            self.expired = False
            self.held: dict[int, set[int]] = {c: set() for c in range(N_CANDIDATES)}
            self.seen: set[int] = {0}
            self.last_read_term = 0

        # -- helpers ------------------------------------------------------------------------

        def live_holder(self) -> int | None:
            return None if self.expired else self.holder

        def label(self, c: int) -> str:
            return f"c{c}"

        def pick_term(self, c: int, which: str, data: st.DataObject) -> int:
            if which == "own":
                return max(self.held[c], default=self.term)
            if which == "current":
                return self.term
            if which == "stale":
                stale = sorted(self.held[c] - {self.term})
                if not stale:
                    return max(self.term - 1, 0)
                return data.draw(st.sampled_from(stale), label="stale term")
            return self.term + 1

        def check_reported(self, lease: Lease | None) -> None:
            """A lease reported by a step that lost is the row as the model has it."""
            assert lease is not None, "no contention here: the row must be readable"
            assert lease.term == self.term, (lease, self.term)
            expected = None if self.holder is None else self.tokens[self.holder]
            assert lease.token == expected, (lease, self.holder)
            assert lease.held == (self.live_holder() is not None), (lease, self.expired)

        # -- rules --------------------------------------------------------------------------

        @rule(c=candidates)
        def elect(self, c: int) -> None:
            should_win = self.live_holder() is None
            result = self.backend.elect(Bid(self.ns, self.tokens[c], self.label(c), TTL))
            assert result.won == should_win, (c, result, self.holder, self.expired)
            if not result.won:
                self.check_reported(result.lease)
                return
            lease = result.lease
            assert lease is not None and lease.held_by(self.tokens[c])
            assert lease.leader_id == self.label(c)
            # invariant 2: a new term is greater than every term ever seen here
            assert lease.term > max(self.seen), (lease.term, sorted(self.seen))
            self.exists, self.holder, self.term, self.expired = True, c, lease.term, False
            self.held[c].add(lease.term)
            self.seen.add(lease.term)

        @rule(c=candidates, which=term_choices, via_elect=st.booleans(), data=st.data())
        def renew(self, c: int, which: str, via_elect: bool, data: st.DataObject) -> None:
            self._renew(c, which, via_elect, data)

        @precondition(lambda self: self.holder is not None)
        @rule(which=holder_term_choices, via_elect=st.booleans(), data=st.data())
        def holder_renews(self, which: str, via_elect: bool, data: st.DataObject) -> None:
            # The holder is 1 candidate in N: aim at it often, expired or not.
            assert self.holder is not None
            self._renew(self.holder, which, via_elect, data)

        def _renew(self, c: int, which: str, via_elect: bool, data: st.DataObject) -> None:
            term = self.pick_term(c, which, data)
            should_win = self.live_holder() == c and term == self.term
            if via_elect:  # elect(term=...) is the same renewal
                result = self.backend.elect(
                    Bid(self.ns, self.tokens[c], self.label(c), TTL), term=term
                )
            else:
                result = self.backend.renew(self.ns, self.tokens[c], term, TTL)
            assert result.won == should_win, (c, which, term, result, self.holder, self.term)
            if not self.exists:
                assert result.lease is None
                return
            if result.won:
                lease = result.lease
                assert lease is not None and lease.held_by(self.tokens[c])
                assert lease.term == self.term
                assert TTL - 1 < lease.remaining <= TTL
            self.check_reported(result.lease)

        @rule(c=candidates, which=term_choices, data=st.data())
        def resign(self, c: int, which: str, data: st.DataObject) -> None:
            self._resign(c, which, data)

        @precondition(lambda self: self.holder is not None)
        @rule(which=term_choices, data=st.data())
        def holder_resigns(self, which: str, data: st.DataObject) -> None:
            assert self.holder is not None
            self._resign(self.holder, which, data)

        def _resign(self, c: int, which: str, data: st.DataObject) -> None:
            term = self.pick_term(c, which, data)
            # An expired lease can still be resigned by its holder; the term stays.
            should_win = self.holder == c and term == self.term
            assert self.backend.resign(self.ns, self.tokens[c], term) == should_win, (
                c,
                which,
                term,
                self.holder,
                self.term,
            )
            if should_win:
                self.holder = None

        @rule()
        def expire(self) -> None:
            expire(self.backend, self.ns)
            if self.exists:
                self.expired = True

        @rule()
        def current(self) -> None:
            lease = self.backend.current(self.ns)
            if not self.exists:
                assert lease is None
                return
            assert lease is not None and lease.namespace == self.ns
            if lease.held:
                assert self.holder is not None
                assert lease.leader_id == self.label(self.holder)
                assert 0 < lease.remaining <= TTL
                assert lease.acquired_at_us is not None and lease.renewed_at_us is not None
                assert lease.acquired_at_us <= lease.renewed_at_us < lease.expires_at_us
            else:
                assert lease.remaining == 0.0
            if self.holder is None:
                assert lease.leader_id is None

        # -- invariants ---------------------------------------------------------------------

        @invariant()
        def backend_agrees_with_model(self) -> None:
            lease = self.backend.current(self.ns)
            if not self.exists:
                assert lease is None, lease
                return
            assert lease is not None
            # invariant 1: at most one holder, and exactly the one the model predicts
            holders = [c for c in range(N_CANDIDATES) if lease.held_by(self.tokens[c])]
            live = self.live_holder()
            assert holders == ([] if live is None else [live]), (lease, self.holder)
            self.check_reported(lease)
            # invariant 2: the stored term never goes back
            assert lease.term >= self.last_read_term, (lease.term, self.last_read_term)
            self.last_read_term = lease.term

    return LeaseMachine


def test_backend_follows_the_lease_model(backend: Any) -> None:
    """Every backend (the conftest's fixture: memory, SQLite, PostgreSQL, MariaDB)."""
    kind = "memory" if isinstance(backend, MemoryBackend) else "sql"
    run_state_machine_as_test(make_machine(backend), settings=SETTINGS[kind])
