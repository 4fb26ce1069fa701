"""The run ledger on every backend: a claimed run is pending until the broker took it.

A run a leader claims to send stays pending in the store until ``mark_sent``; while it is,
the entry's next run cannot be claimed (by this leader or the next), so a run that was
claimed and never sent is found by whoever leads next (``pending_runs``) instead of being
skipped. A state stored with no send (a run skipped by a catch-up policy, an operator's
edit adopted) is never pending.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from celery_election.backends.base import PendingRun, RunRequest, RunState

from ..conftest import EVERY_KIND, expire, make_backend, token

NS = "run-ledger"


@pytest.fixture(params=EVERY_KIND)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """Every backend, PostgreSQL and MariaDB through each of their drivers."""
    yield from make_backend(request.param, tmp_path)


def _lead(backend: Any) -> tuple[str, int]:
    me = token()
    return me, backend.elect(NS, me, "beat", 30.0).lease.term


def test_a_claimed_run_is_pending_until_marked_sent_and_blocks_the_next(backend: Any) -> None:
    store = backend.beat
    me, term = _lead(backend)
    first = store.claim_run(NS, me, term, "job", None, 1_000, pending=True)
    assert first.won
    assert store.pending_runs(NS) == {
        "job": PendingRun("job", 0, first.state, store.pending_runs(NS)["job"].claimed_us)
    }
    # the next run waits for this one: refused, the stored state reported as it is
    blocked = store.claim_run(NS, me, term, "job", first.state, 2_000, pending=True)
    assert not blocked.won and blocked.leading and blocked.state == first.state
    assert store.mark_sent(NS, term, ["job"]) == 1
    assert store.pending_runs(NS) == {}
    assert store.mark_sent(NS, term, ["job"]) == 0  # once
    second = store.claim_run(NS, me, term, "job", first.state, 2_000, pending=True)
    assert second.won
    assert store.pending_runs(NS)["job"].run == 1_000  # the key: the run it follows


def test_a_state_stored_without_a_send_is_not_pending(backend: Any) -> None:
    store = backend.beat
    me, term = _lead(backend)
    stored = store.claim_run(NS, me, term, "skipped", None, 1_000)
    batch = store.claim_runs(NS, me, term, [RunRequest(f"s{i}", None, 5) for i in range(3)])
    assert stored.won and all(c.won for c in batch)
    assert store.pending_runs(NS) == {}
    assert store.claim_run(NS, me, term, "skipped", stored.state, 2_000).won


def test_only_the_claiming_term_marks_its_runs_sent(backend: Any) -> None:
    store = backend.beat
    a, old = _lead(backend)
    claimed = store.claim_run(NS, a, old, "job", None, 1_000, pending=True)
    assert claimed.won
    expire(backend, NS)
    b = token()
    new = backend.elect(NS, b, "beat-b", 30.0).lease.term
    assert store.mark_sent(NS, new, ["job"]) == 0  # not its run: still pending
    found = store.pending_runs(NS)["job"]
    assert found.state.term == old and found.run == 0
    # the new leader cannot claim past it: it must send it first
    assert not store.claim_run(NS, b, new, "job", claimed.state, 2_000, pending=True).won
    assert store.mark_sent(NS, found.state.term, ["job"]) == 1
    assert store.claim_run(NS, b, new, "job", claimed.state, 2_000, pending=True).won


def test_a_batch_claims_pending_runs_and_skips_an_entry_still_pending(backend: Any) -> None:
    """Each request as alone: one pending entry refuses only its own run (on MySQL the
    batch's winners are told from the rows it locked, pending ones included)."""
    store = backend.beat
    me, term = _lead(backend)
    names = [f"e{i}" for i in range(6)]
    firsts = store.claim_runs(NS, me, term, [RunRequest(n, None, 10, pending=True) for n in names])
    assert all(c.won for c in firsts)
    assert set(store.pending_runs(NS)) == set(names)
    assert store.mark_sent(NS, term, names[1:]) == 5  # e0 stays pending
    states = {n: c.state for n, c in zip(names, firsts, strict=True)}
    again = store.claim_runs(
        NS, me, term, [RunRequest(n, states[n], 20, pending=True) for n in names]
    )
    assert [c.won for c in again] == [False, True, True, True, True, True]
    assert again[0].state == states["e0"] and again[0].leading
    pending = store.pending_runs(NS)
    assert {n: p.run for n, p in pending.items()} == {"e0": 0, **{n: 10 for n in names[1:]}}
    assert pending["e3"].state == RunState(20, 2, term)


def test_a_batch_mixing_sends_and_stores_is_refused(backend: Any) -> None:
    store = backend.beat
    me, term = _lead(backend)
    mixed = [RunRequest("a", None, 1, pending=True), RunRequest("b", None, 1)]
    with pytest.raises(ValueError, match="all runs to send or all states to store"):
        store.claim_runs(NS, me, term, mixed)


def test_marks_of_a_large_burst_go_in_batches(backend: Any) -> None:
    store = backend.beat
    me, term = _lead(backend)
    names = [f"burst-{i}" for i in range(1_200)]
    claims = store.claim_runs(NS, me, term, [RunRequest(n, None, 7, pending=True) for n in names])
    assert all(c.won for c in claims)
    assert store.mark_sent(NS, term, names) == 1_200
    assert store.pending_runs(NS) == {}
