"""The run ledger on every backend: a claimed run is a row, claimed until the broker took it.

A claim of a run to send writes the run's row in its own transaction (state ``claimed``,
the claiming term, task id ``run_task_id`` of the new state). Until the row is confirmed
(the broker accepted a copy), started by a worker or dropped, the entry's next run cannot
be claimed (by this leader or the next), so a run claimed and never sent is found by
whoever leads next (``pending_runs``) instead of being skipped. A state stored with no send
(a run skipped by a catch-up policy, an operator's edit adopted) has no row.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from celery_election.backends import MemoryBackend
from celery_election.backends.base import PendingRun, RunRequest, RunState
from celery_election.backends.connection import LostRound
from celery_election.core.lease import Bid
from celery_election.core.runstate import CLAIMED, DROPPED, SENT, Delivery, run_key, run_task_id
from celery_election.errors import BackendUnavailableError

from ..conftest import EVERY_KIND, by_entry, claim_run, expire, make_backend, token

NS = "run-ledger"


@pytest.fixture(params=EVERY_KIND)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """Every backend, PostgreSQL and MariaDB through each of their drivers."""
    yield from make_backend(request.param, tmp_path)


def _lead(backend: Any) -> tuple[str, int]:
    me = token()
    return me, backend.elect(Bid(NS, me, "beat", 30.0)).lease.term


def _id(name: str, at: int) -> str:
    return run_task_id(NS, name, at)


def _row(backend: Any, name: str, at: int) -> Any:
    stored = backend.runs.load(NS, run_key(_id(name, at)))
    return None if stored is None else stored.row


def test_a_claimed_run_is_a_row_until_confirmed_and_blocks_the_next(backend: Any) -> None:
    store = backend.beat
    me, term = _lead(backend)
    first = claim_run(store, NS, me, term, "job", None, 1_000, pending=True, task_name="t.job")
    assert first.won
    row = _row(backend, "job", 1_000)
    assert (row.state, row.term, row.entry, row.due) == (CLAIMED, term, "job", 0)
    assert backend.runs.load(NS, run_key(_id("job", 1_000))).task_name == "t.job"
    (found,) = store.pending_runs(NS)
    assert found == PendingRun("job", 0, first.state, found.claimed_us, _id("job", 1_000))
    # the next run waits for this one: refused, the stored state reported as it is
    blocked = claim_run(store, NS, me, term, "job", first.state, 2_000, pending=True)
    assert not blocked.won and blocked.leading and blocked.state == first.state
    assert _row(backend, "job", 2_000) is None  # a refused claim writes no row
    assert backend.runs.confirm(NS, [_id("job", 1_000)]) == 1
    assert _row(backend, "job", 1_000).state == SENT
    assert store.pending_runs(NS) == []
    assert backend.runs.confirm(NS, [_id("job", 1_000)]) == 0  # once
    second = claim_run(store, NS, me, term, "job", first.state, 2_000, pending=True)
    assert second.won
    assert by_entry(store.pending_runs(NS))["job"].run == 1_000  # the key: the run it follows
    assert _row(backend, "job", 2_000).due == 1_000


def test_a_state_stored_without_a_send_has_no_row(backend: Any) -> None:
    store = backend.beat
    me, term = _lead(backend)
    stored = claim_run(store, NS, me, term, "skipped", None, 1_000)
    batch = store.claim_runs(NS, me, term, [RunRequest(f"s{i}", None, 5) for i in range(3)])
    assert stored.won and all(c.won for c in batch)
    assert store.pending_runs(NS) == []
    assert _row(backend, "skipped", 1_000) is None and _row(backend, "s0", 5) is None
    assert claim_run(store, NS, me, term, "skipped", stored.state, 2_000).won


def test_a_worker_that_starts_the_run_before_its_confirm_ends_the_hold(backend: Any) -> None:
    """A fast worker takes the claimed row: the run is on its way, the entry is free."""
    store = backend.beat
    me, term = _lead(backend)
    first = claim_run(store, NS, me, term, "job", None, 1_000, pending=True)
    d = Delivery("t.job", 0, _id("job", 1_000), "tok", None, False)
    assert backend.runs.start(NS, d, lambda w: True).run
    assert store.pending_runs(NS) == []
    assert backend.runs.confirm(NS, [_id("job", 1_000)]) == 0  # started: not claimed
    assert claim_run(store, NS, me, term, "job", first.state, 2_000, pending=True).won


def test_a_run_an_earlier_term_claimed_holds_the_next_leader_until_sent_or_dropped(
    backend: Any,
) -> None:
    store = backend.beat
    a, old = _lead(backend)
    claimed = claim_run(store, NS, a, old, "job", None, 1_000, pending=True)
    assert claimed.won
    expire(backend, NS)
    b = token()
    new = backend.elect(Bid(NS, b, "beat-b", 30.0)).lease.term
    found = by_entry(store.pending_runs(NS))["job"]
    assert found.state.term == old and found.run == 0
    # the new leader cannot claim past it: it must send it (or drop it) first
    assert not claim_run(store, NS, b, new, "job", claimed.state, 2_000, pending=True).won
    assert backend.runs.drop(NS, [_id("job", 1_000)], "expired") == 1
    row = _row(backend, "job", 1_000)
    assert (row.state, row.outcome) == (DROPPED, "expired")
    assert backend.runs.confirm(NS, [_id("job", 1_000)]) == 0  # dropped stays dropped
    assert claim_run(store, NS, b, new, "job", claimed.state, 2_000, pending=True).won


def test_a_batch_claims_runs_and_skips_an_entry_still_claimed(backend: Any) -> None:
    """Each request as alone: one claimed entry refuses only its own run (on MySQL the
    batch's winners are told from the rows it locked, the claimed runs' rows included)."""
    store = backend.beat
    me, term = _lead(backend)
    names = [f"e{i}" for i in range(6)]
    firsts = store.claim_runs(NS, me, term, [RunRequest(n, None, 10, pending=True) for n in names])
    assert all(c.won for c in firsts)
    assert {p.entry_name for p in store.pending_runs(NS)} == set(names)
    assert backend.runs.confirm(NS, [_id(n, 10) for n in names[1:]]) == 5  # e0 stays
    states = {n: c.state for n, c in zip(names, firsts, strict=True)}
    again = store.claim_runs(
        NS, me, term, [RunRequest(n, states[n], 20, pending=True) for n in names]
    )
    assert [c.won for c in again] == [False, True, True, True, True, True]
    assert again[0].state == states["e0"] and again[0].leading
    assert _row(backend, "e0", 20) is None and _row(backend, "e1", 20).state == CLAIMED
    pending = by_entry(store.pending_runs(NS))
    assert {n: p.run for n, p in pending.items()} == {"e0": 0, **{n: 10 for n in names[1:]}}
    assert pending["e3"].state == RunState(20, 2, term)


def test_a_batch_mixing_sends_and_stores_is_refused(backend: Any) -> None:
    store = backend.beat
    me, term = _lead(backend)
    mixed = [RunRequest("a", None, 1, pending=True), RunRequest("b", None, 1)]
    with pytest.raises(ValueError, match="all runs to send or all states to store"):
        store.claim_runs(NS, me, term, mixed)


def test_a_large_burst_writes_its_rows_and_confirms_them_in_batches(backend: Any) -> None:
    store = backend.beat
    me, term = _lead(backend)
    names = [f"burst-{i}" for i in range(1_200)]
    claims = store.claim_runs(NS, me, term, [RunRequest(n, None, 7, pending=True) for n in names])
    assert all(c.won for c in claims)
    assert len(store.pending_runs(NS)) == 1_200
    assert backend.runs.confirm(NS, [_id(n, 7) for n in names]) == 1_200
    assert store.pending_runs(NS) == []


def test_a_claimed_run_outlives_the_retention_until_it_is_sent(backend: Any) -> None:
    """The prune keeps a claimed row: it holds its entry until a leader sends it. A
    beat's rows are its schedule's history: only the history's prune deletes them."""
    me, term = _lead(backend)
    requests = [RunRequest(n, None, 7, pending=True) for n in ("a", "b")]
    assert all(c.won for c in backend.beat.claim_runs(NS, me, term, requests))
    assert backend.runs.confirm(NS, [_id("a", 7)]) == 1
    assert backend.runs.prune(NS, -3600) == 0  # a worker's prune: not the beat's runs
    assert backend.runs.prune(NS, -3600, history=True) == 1  # "a" only (all are old)
    assert _row(backend, "a", 7) is None and _row(backend, "b", 7).state == CLAIMED
    assert {p.entry_name for p in backend.beat.pending_runs(NS)} == {"b"}


class _Cut(Exception):
    """The connection lost after the claim's state was written, before its run's row."""


@pytest.mark.parametrize("batch", [False, True])
def test_a_claim_cut_before_its_row_is_written_claims_nothing(
    backend: Any, batch: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The entry's new state and its run's row commit together or not at all: a claim
    whose state committed without its row had moved the entry past a run nobody could
    find (no claimed row: no leader sends it, issue 52). Cut between the two, the claim
    fails, the state stays where it was, and the next claim wins and writes the row."""
    if isinstance(backend, MemoryBackend):
        pytest.skip("the memory store changes both under one lock")
    me, term = _lead(backend)
    first = claim_run(backend.beat, NS, me, term, "job", None, 1_000, pending=True)
    assert first.won and backend.runs.confirm(NS, [_id("job", 1_000)]) == 1

    def cut(*args: Any) -> None:
        raise _Cut()

    def claim() -> Any:
        if batch:
            request = RunRequest("job", first.state, 2_000, pending=True)
            return backend.beat.claim_runs(NS, me, term, [request])[0]
        return claim_run(backend.beat, NS, me, term, "job", first.state, 2_000, pending=True)

    with monkeypatch.context() as patched:
        patched.setattr(backend.runs, "write_claimed", cut)
        with pytest.raises(_Cut):
            claim()
    assert backend.beat.load_runs(NS)["job"] == first.state  # nothing moved
    assert _row(backend, "job", 2_000) is None
    again = claim()
    assert again.won and _row(backend, "job", 2_000).state == CLAIMED


def test_a_connection_lost_while_a_claim_opens_its_transaction_is_the_database_unavailable(
    backend: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Setting the transaction's isolation level talks to the server before any statement:
    a connection lost there is the database unavailable, as a statement's loss is (the
    driver's raw error escaped and stopped a beat: the chaos sample's MariaDB cut)."""
    if isinstance(backend, MemoryBackend) or backend.engine.dialect.name == "sqlite":
        pytest.skip("no isolation level to set: the transaction is the driver's own")
    dialect = backend.engine.dialect
    real = dialect.set_connection_execution_options

    def lost(connection: Any, opts: Any) -> None:
        if "isolation_level" in opts:
            raise dialect.loaded_dbapi.OperationalError("lost the connection")
        real(connection, opts)

    me, term = _lead(backend)
    monkeypatch.setattr(dialect, "set_connection_execution_options", lost)
    with pytest.raises(BackendUnavailableError, match="unavailable"):
        claim_run(backend.beat, NS, me, term, "job", None, 1_000, pending=True)
    monkeypatch.undo()
    assert claim_run(backend.beat, NS, me, term, "job", None, 1_000, pending=True).won


def test_a_claim_lost_to_contention_says_the_store_did_not_answer(
    backend: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A round lost to contention (a deadlock with a deposed leader's claim) wrote
    nothing and is no refusal: the beat checks its entry again at once (``answered``)
    instead of at its next check, an hour away for an hourly entry."""
    if isinstance(backend, MemoryBackend):
        pytest.skip("the memory store loses no rounds")
    me, term = _lead(backend)

    def contended(*args: Any) -> None:
        raise LostRound()

    with monkeypatch.context() as patched:
        patched.setattr(backend.runs, "write_claimed", contended)
        lost = backend.beat.claim_runs(NS, me, term, [RunRequest("job", None, 1_000, pending=True)])
    assert [(c.won, c.answered) for c in lost] == [(False, False)]
    assert "job" not in backend.beat.load_runs(NS)  # nothing written: the next claim wins
    again = claim_run(backend.beat, NS, me, term, "job", None, 2_000, pending=True)
    assert again.won and again.answered
