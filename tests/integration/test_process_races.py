"""Separate OS processes racing ``elect`` on one namespace: exactly one wins each round.

Threads in one process (the backend suite) share the interpreter lock and one engine;
here every racer is its own process with its own engine and connections, so the only
thing serialising them is the database. Round 0 races for a namespace whose lease row
does not exist yet (the idempotent insert, then the conditional UPDATE); every later
round races for a lease the parent has just expired on the database clock.
"""

from __future__ import annotations

import itertools
import multiprocessing
import queue as queue_mod
import time
import traceback
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from threading import BrokenBarrierError
from typing import Any

from celery_election.backends import SQLBackend, backend_from_url
from celery_election.core.lease import Bid

from ..conftest import expire, token, unique_prefix

TTL = 30.0
#: Spawned children import SQLAlchemy and a driver before the first barrier.
STARTUP_TIMEOUT = 60.0
ROUND_TIMEOUT = 30.0
JOIN_TIMEOUT = 15.0


@dataclass(frozen=True)
class Report:
    """What one racer saw in one round."""

    round: int
    index: int
    won: bool
    held: bool | None
    term: int | None
    token: str | None


def _racer(
    url: str,
    prefix: str,
    namespace: str,
    index: int,
    label: str,
    own_token: str,
    rounds: int,
    barrier: Any,
    results: Any,
) -> None:
    """Child process: one elect per round, between the parent's two barriers."""
    backend = None
    try:
        backend = backend_from_url(url, table_prefix=prefix)
        results.put(("ready", index))
        for r in range(rounds):
            barrier.wait(ROUND_TIMEOUT)
            result = backend.elect(Bid(namespace, own_token, label, TTL))
            lease = result.lease
            results.put(
                (
                    "ok",
                    index,
                    r,
                    result.won,
                    None if lease is None else lease.held,
                    None if lease is None else lease.term,
                    None if lease is None else lease.token,
                )
            )
            barrier.wait(ROUND_TIMEOUT)
    except BrokenBarrierError:
        pass  # the parent (or another racer) gave up: it reports why
    except BaseException:
        results.put(("error", index, traceback.format_exc()))
        barrier.abort()
    finally:
        if backend is not None:
            backend.close()


def _receive(
    results: Any, children: Sequence[Any], kind: str, wait: float
) -> dict[int, tuple[Any, ...]]:
    """One ``kind`` message from every child, by index; fail fast if a child dies first."""
    got: dict[int, tuple[Any, ...]] = {}
    deadline = time.monotonic() + wait
    while len(got) < len(children):
        try:
            item = results.get(timeout=0.5)
        except queue_mod.Empty:
            # A child flushes what it put before it exits: dead, silent and nothing left
            # in the pipe means its message is never coming.
            dead = [
                c.name for i, c in enumerate(children) if i not in got and c.exitcode is not None
            ]
            if dead and results.empty():
                raise AssertionError(f"{dead} exited before sending {kind!r}") from None
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"only {len(got)} of {len(children)} racers sent {kind!r} in {wait}s"
                ) from None
            continue
        if item[0] == "error":
            raise AssertionError(f"racer {item[1]} failed:\n{item[2]}")
        assert item[0] == kind and item[1] not in got, item
        got[item[1]] = item[2:]
    return got


def _race(url: str, labels: Sequence[str], rounds: int) -> tuple[list[list[Report]], list[str]]:
    """Race ``len(labels)`` processes for ``rounds`` rounds; check each round.

    Returns every round's reports and the racers' tokens.
    """
    n = len(labels)
    prefix = unique_prefix()
    namespace = f"race-{uuid.uuid4().hex[:8]}"
    tokens = [token() for _ in labels]
    parent = backend_from_url(url, table_prefix=prefix)
    assert isinstance(parent, SQLBackend)
    parent.install()
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(n + 1)
    results = ctx.Queue()
    children = [
        ctx.Process(
            target=_racer,
            args=(url, prefix, namespace, i, label, tokens[i], rounds, barrier, results),
            name=f"racer-{i}",
            daemon=True,
        )
        for i, label in enumerate(labels)
    ]
    history: list[list[Report]] = []
    try:
        for child in children:
            child.start()
        _receive(results, children, "ready", STARTUP_TIMEOUT)
        last_term = 0
        for r in range(rounds):
            if r > 0:
                expire(parent, namespace)
                before = parent.current(namespace)
                assert before is not None and not before.held
            else:
                assert parent.current(namespace) is None  # the row does not exist yet
            barrier.wait(ROUND_TIMEOUT)  # go
            barrier.wait(ROUND_TIMEOUT)  # everyone has elected and reported
            received = _receive(results, children, "ok", ROUND_TIMEOUT)
            reports = [Report(rnd, i, *rest) for i, (rnd, *rest) in sorted(received.items())]
            assert [rep.round for rep in reports] == [r] * n, reports
            history.append(reports)

            winners = [rep for rep in reports if rep.won]
            assert len(winners) == 1, f"round {r}: {len(winners)} winners: {reports}"
            win = winners[0]
            assert win.held and win.token == tokens[win.index], win
            assert win.term is not None and win.term > last_term, (r, last_term, win)
            for rep in reports:
                if rep.won or rep.term is None:
                    continue  # a loser that could not read the row reports no lease
                # A loser never sees a newer term than the winner's, and if it saw the
                # lease held, it saw the winner holding it.
                assert rep.term <= win.term, (r, rep, win)
                if rep.held:
                    assert (rep.token, rep.term) == (win.token, win.term), (r, rep, win)
            stored = parent.current(namespace)
            assert stored is not None and stored.held_by(tokens[win.index]), (r, stored)
            assert stored.term == win.term and stored.leader_id == labels[win.index]
            last_term = win.term
        for child in children:
            child.join(JOIN_TIMEOUT)
            assert child.exitcode == 0, f"{child.name} exited with {child.exitcode}"
    finally:
        barrier.abort()  # release any racer still waiting on the parent
        for child in children:
            if child.pid is not None:
                child.join(JOIN_TIMEOUT)
                if child.is_alive():
                    child.terminate()
                    child.join(JOIN_TIMEOUT)
        results.close()
        results.join_thread()
        parent.uninstall()
        parent.close()
    return history, tokens


def test_eight_processes_race_elect_exactly_one_per_round(sql_url: str) -> None:
    history, _ = _race(sql_url, [f"p{i}" for i in range(8)], rounds=4)
    assert len(history) == 4
    terms = [next(rep.term for rep in reports if rep.won) for reports in history]
    assert all(a is not None and b is not None and a < b for a, b in itertools.pairwise(terms))


def test_processes_sharing_a_candidate_id_never_both_win(sql_url: str) -> None:
    # The label is for people; identity is the per-instance token (docs/design.md, rule 5).
    history, tokens = _race(sql_url, ["worker@host", "worker@host"], rounds=6)
    assert tokens[0] != tokens[1]
    for reports in history:
        assert [rep.won for rep in reports].count(True) == 1, reports
        (loser,) = [rep for rep in reports if not rep.won]
        # same label, but the loser never sees its own token holding the lease
        assert not (loser.held and loser.token == tokens[loser.index]), reports
