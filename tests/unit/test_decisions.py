"""The election thread's decisions, from tables: what it does given what it knows.

Each row is one situation; the functions are pure (core/decisions.py), so no thread, clock or
backend is involved. Every bound here is also a mutation target (harness/mutations.py).
"""

from __future__ import annotations

import dataclasses
import math

import pytest

from celery_election.core.config import ElectionConfig
from celery_election.core.decisions import (
    RATE_ALLOWANCE,
    Call,
    LockNews,
    Next,
    Proof,
    Seen,
    after_elect,
    after_renew,
    defer_take,
    extend,
    follower_call,
    follower_wait,
    granted,
    heartbeat_now,
    look_after_wakeup,
    look_now_after,
    newer_release_lives,
    release_key,
    release_while_waiting,
    renew_now_after,
    renew_retry_wait,
    transfer_asked,
    trust_end,
)
from celery_election.core.lease import CandidateInfo, ElectResult, Lease
from celery_election.core.transitions import Lead

ME, OTHER = "me" * 16, "other" * 6
NOW = 100.0
DELTA = 1.0
CFG = ElectionConfig(ttl=10, jitter=0, liveness=DELTA)  # poll 1, fallback 60


def lease(
    token: str | None = OTHER, term: int = 7, left: float = 6.0, tag: float | None = DELTA
) -> Lease:
    """A row read at db time 1e12 us with ``left`` seconds to run (vacant if token None)."""
    now_us = 10**12
    return Lease(
        "ns", term, "x", now_us + round(left * 1e6), now_us, now_us - 4_000_000, None, token,
        None if tag is None else round(tag * 1e6),
    )  # fmt: skip


HELD = Proof(grant=3, granted_at=NOW - 0.4, good_until=NOW + 0.5)
#: held, and pinged since: proven through every time the follower tables use
PROVEN = Proof(grant=3, granted_at=NOW - 0.4, good_until=NOW + 10)
#: the grant as last heard, but its proof has lapsed (a paused process: its session ended)
LAPSED = Proof(grant=3, granted_at=NOW - 9.4, good_until=NOW - 8)
WAITING = Proof(grant=3, granted_at=None, good_until=NOW - 5)


@pytest.mark.parametrize(
    ("why", "seen", "expected"),
    [
        ("no lock: the lease alone", Seen(NOW, lease(), ME, None), (Call.ELECT, 0.0)),
        ("granted, tagged leader, delta not yet passed", Seen(NOW, lease(), ME, PROVEN),
         (Call.ELECT, 0.0)),
        ("granted, tagged leader, delta passed", Seen(NOW + 0.6, lease(), ME, PROVEN),
         (Call.TAKE_OVER, pytest.approx(1.0))),
        ("granted exactly delta ago", Seen(NOW + 0.6, lease(tag=1.0), ME, PROVEN),
         (Call.TAKE_OVER, pytest.approx(1.0))),
        ("granted, tag longer than waited", Seen(NOW + 0.6, lease(tag=1.5), ME, PROVEN),
         (Call.ELECT, 0.0)),
        ("granted, untagged leader: never taken over", Seen(NOW + 9, lease(tag=None), ME, PROVEN),
         (Call.ELECT, 0.0)),
        ("granted, our own term", Seen(NOW + 9, lease(token=ME), ME, PROVEN), (Call.ELECT, 0.0)),
        ("granted, lease expired", Seen(NOW + 9, lease(left=-1), ME, PROVEN), (Call.ELECT, 0.0)),
        ("a lapsed grant takes nothing over: another may have had the lock since",
         Seen(NOW, lease(), ME, LAPSED), (Call.LOOK, 0.0)),
        ("a lapsed grant, vacant for grace: the lease decides",
         Seen(NOW, lease(token=None), ME, LAPSED, NOW - 1.0), (Call.ELECT, 0.0)),
        ("granted, vacant: elect, tagged", Seen(NOW, lease(token=None), ME, PROVEN),
         (Call.ELECT, 0.0)),
        ("waiting, vacant for less than grace: the holder elects",
         Seen(NOW, lease(token=None), ME, WAITING, NOW - 0.5), (Call.LOOK, 0.0)),
        ("waiting, vacant for grace: the lease decides",
         Seen(NOW, lease(token=None), ME, WAITING, NOW - 1.0), (Call.ELECT, 0.0)),
        ("waiting, held: only look", Seen(NOW, lease(), ME, WAITING), (Call.LOOK, 0.0)),
        ("waiting, never read", Seen(NOW, None, ME, WAITING), (Call.LOOK, 0.0)),
        # an ineligible candidate (election_eligible=False) never takes a term
        ("ineligible, vacant: only look", Seen(NOW, lease(token=None), ME, None, eligible=False),
         (Call.LOOK, 0.0)),
        ("ineligible, expired: only look", Seen(NOW, lease(left=-1), ME, None, eligible=False),
         (Call.LOOK, 0.0)),
        ("ineligible, never read: only look", Seen(NOW, None, ME, None, eligible=False),
         (Call.LOOK, 0.0)),
        ("ineligible, granted past the leader's delta: no take-over",
         Seen(NOW + 0.6, lease(), ME, PROVEN, eligible=False), (Call.LOOK, 0.0)),
        ("ineligible, granted, vacant for grace: still only look",
         Seen(NOW, lease(token=None), ME, PROVEN, NOW - 5, eligible=False), (Call.LOOK, 0.0)),
    ],
)  # fmt: skip
def test_what_a_follower_sends(why: str, seen: Seen, expected: tuple[Call, float]) -> None:
    assert follower_call(seen, grace=DELTA) == expected, why


@pytest.mark.parametrize(
    ("why", "seen", "healthy", "wait", "look_by", "want"),
    [
        ("no lock, held: until the lease ends, capped by poll", Seen(NOW, lease(), ME, None),
         False, 1.0, 1.0, False),
        ("no lock, held, wakeups: until the lease ends", Seen(NOW, lease(), ME, None),
         True, 6.0, 60.0, False),
        ("no lock, vacant: poll", Seen(NOW, lease(token=None), ME, None), False, 1.0, 1.0, False),
        ("tagged leader, granted: until delta after the grant",
         Seen(NOW, lease(), ME, PROVEN), False, pytest.approx(0.601), pytest.approx(0.601), True),
        ("tagged leader, waiting on a file lock: the lease end as net (a paused holder "
         "keeps the lock)", Seen(NOW, lease(), ME, WAITING), False, 6.0, 6.0, True),
        ("tagged leader, waiting on a file lock, wakeups: look by fallback",
         Seen(NOW, lease(), ME, WAITING), True, 6.0, 60.0, True),
        ("tagged leader, waiting on a server's lock: the grant wakes it, the lease once "
         "per fallback", Seen(NOW, lease(), ME, WAITING, silent_holders_lose=True), False,
         60.0, 60.0, True),
        ("tagged leader, waiting on a server's lock, lease nearly over: still the grant",
         Seen(NOW, lease(left=0.5), ME, WAITING, silent_holders_lose=True), True, 60.0, 60.0,
         True),
        ("tagged leader, a lapsed grant: no take-over to wait for, the lock again",
         Seen(NOW, lease(), ME, LAPSED, silent_holders_lose=True), False, 60.0, 60.0, True),
        ("tagged leader, cold standby: its slot tries are its looks",
         Seen(NOW, lease(), ME, WAITING, cold=True), False, 60.0, 60.0, True),
        ("untagged leader: let it have the lock", Seen(NOW, lease(tag=None), ME, WAITING),
         False, 1.0, 1.0, False),
        ("vacant, waiting: until grace has passed",
         Seen(NOW, lease(token=None), ME, WAITING, NOW - 0.25), False, 0.75, 0.75, True),
        ("vacant, granted but lost the elect: poll",
         Seen(NOW, lease(token=None), ME, PROVEN, NOW), False, 1.0, 1.0, True),
        ("never read, waiting: grace from now", Seen(NOW, None, ME, WAITING), False, 1.0, 1.0,
         True),
        # ineligible: never the lock (it would keep the lock from those who may lead)
        ("ineligible, tagged leader, granted: the lease's end, no lock",
         Seen(NOW, lease(), ME, PROVEN, eligible=False), False, 1.0, 1.0, False),
        ("ineligible, tagged leader, wakeups: until the lease ends, no lock",
         Seen(NOW, lease(), ME, WAITING, eligible=False), True, 6.0, 60.0, False),
        ("ineligible, vacant: poll, no lock",
         Seen(NOW, lease(token=None), ME, WAITING, NOW - 0.25, eligible=False), False, 1.0,
         1.0, False),
    ],
)  # fmt: skip
def test_how_long_a_follower_waits(
    why: str, seen: Seen, healthy: bool, wait: float, look_by: float, want: bool
) -> None:
    got = follower_wait(seen, CFG, healthy=healthy, grace=DELTA, spread=0.0)
    assert (got.wait, got.look_by, got.want_lock) == (wait, look_by, want), why


def test_spread_only_delays_by_a_bounded_amount() -> None:
    low = follower_wait(Seen(NOW, lease(), ME, WAITING), CFG, healthy=True, grace=1, spread=0)
    high = follower_wait(Seen(NOW, lease(), ME, WAITING), CFG, healthy=True, grace=1, spread=0.99)
    assert 0 < high.wait - low.wait <= 0.05


@pytest.mark.parametrize(
    ("why", "result", "in_time", "had", "expected"),
    [
        ("won in time", ElectResult(True, lease(token=ME)), True, 0, Next.LEAD),
        ("won too late", ElectResult(True, lease(token=ME)), False, 0, Next.GIVE_UP),
        ("won, row unknown", ElectResult(True, None), True, 0, Next.FOLLOW),
        ("lost, row ours from before", ElectResult(False, lease(token=ME)), True, 7, Next.RENEW),
        ("lost, row ours from a later term than ours", ElectResult(False, lease(token=ME)), True,
         9, Next.RENEW),
        ("lost, row ours in a term never held: handed to us", ElectResult(False, lease(token=ME)),
         True, 6, Next.ACCEPT),
        ("handed to us, the first term we ever see", ElectResult(False, lease(token=ME)), False,
         0, Next.ACCEPT),
        ("lost, row ours but expired", ElectResult(False, lease(token=ME, left=-1)), True, 0,
         Next.FOLLOW),
        ("lost to another", ElectResult(False, lease()), True, 0, Next.FOLLOW),
        ("lost to contention", ElectResult(False, None), True, 0, Next.FOLLOW),
    ],
)  # fmt: skip
def test_after_an_elect(
    why: str, result: ElectResult, in_time: bool, had: int, expected: Next
) -> None:
    assert after_elect(result, ME, in_time=in_time, had=had) is expected, why


def _asked(to: str | None, token: str | None = ME, term: int = 7, left: float = 6.0) -> Lease:
    return dataclasses.replace(lease(token=token, term=term, left=left), transfer_to=to)


@pytest.mark.parametrize(
    ("why", "row", "expected"),
    [
        ("nobody asked", _asked(None), None),
        ("asked for our term", _asked(OTHER), OTHER),
        ("asked for another term", _asked(OTHER, term=6), None),
        ("asked of another holder", _asked(ME, token=OTHER), None),
        ("our term, expired", _asked(OTHER, left=-1), None),
        ("asked to hand it to ourselves", _asked(ME), None),
        ("no row", None, None),
    ],
)  # fmt: skip
def test_a_leader_acts_on_a_transfer_asked_of_its_own_term_only(
    why: str, row: Lease | None, expected: str | None
) -> None:
    assert transfer_asked(row, ME, 7) == expected, why


@pytest.mark.parametrize(
    ("why", "result", "in_time", "expected"),
    [
        ("renewed in time", ElectResult(True, lease(token=ME)), True, Next.LEAD),
        ("renewed after trust ended", ElectResult(True, lease(token=ME)), False, Next.GIVE_UP),
        ("contention, still trusted", ElectResult(False, None), True, Next.RETRY),
        ("contention, trust ended", ElectResult(False, None), False, Next.GIVE_UP),
        ("our term, not renewable: expired", ElectResult(False, lease(token=ME, left=-1)), True,
         Next.GIVE_UP),
        ("another term of ours", ElectResult(False, lease(token=ME, term=8)), True, Next.FOLLOW),
        ("same term, other holder", ElectResult(False, lease(term=7)), True, Next.FOLLOW),
        ("taken by another", ElectResult(False, lease(term=9)), True, Next.FOLLOW),
    ],
)  # fmt: skip
def test_after_a_renew(why: str, result: ElectResult, in_time: bool, expected: Next) -> None:
    assert after_renew(result, 7, ME, in_time=in_time) is expected, why


@pytest.mark.parametrize(
    ("why", "lead", "proof", "end"),
    [
        ("untagged: the lease", Lead(7, 108.0), HELD, 108.0),
        ("tagged: the earlier of lease and ping", Lead(7, 108.0, grant=3), HELD, NOW + 0.5),
        ("tagged, lease earlier", Lead(7, 100.2, grant=3), HELD, 100.2),
        ("grant lost: the frozen proof", Lead(7, 108.0, grant=3), WAITING, NOW - 5),
        ("re-granted since: the old grant's final proof", Lead(7, 108.0, grant=2),
         Proof(3, NOW, NOW + 0.9, previous=NOW + 0.1), NOW + 0.1),
        ("two grants since: nothing", Lead(7, 108.0, grant=1), HELD, -math.inf),
        ("tagged before any grant", Lead(7, 108.0, grant=0), Proof(), -math.inf),
    ],
)  # fmt: skip
def test_trust_end(why: str, lead: Lead, proof: Proof, end: float) -> None:
    assert trust_end(lead, proof) == end, why


def test_a_grant_starts_a_new_proof_and_keeps_the_old_ones_end() -> None:
    after = granted(Proof(2, None, 50.0), at=NOW, ping_started=NOW, delta=DELTA)
    assert after == Proof(3, NOW, NOW + DELTA * (1 - RATE_ALLOWANCE), previous=50.0)


@pytest.mark.parametrize(
    ("why", "started", "done", "good_until"),
    [
        ("a ping back in time extends", NOW + 0.2, NOW + 0.3, NOW + 0.2 + DELTA * 11 / 12),
        ("a ping back after the proof lapsed: trust stays ended", NOW + 0.2, NOW + 0.5,
         NOW + 0.5),
        ("an older ping never shortens", NOW - 1, NOW, NOW + 0.5),
    ],
)  # fmt: skip
def test_a_ping_extends_only_a_proof_that_still_holds(
    why: str, started: float, done: float, good_until: float
) -> None:
    assert extend(HELD, started, done, DELTA).good_until == pytest.approx(good_until), why


def test_a_lost_grant_is_never_extended() -> None:
    assert extend(WAITING, NOW - 5.4, NOW - 5.3, DELTA) == WAITING  # would reach NOW - 4.48


@pytest.mark.parametrize(
    ("why", "now", "following", "look_at", "expected"),
    [
        ("due, follower's look far off: heartbeat alone", 100.0, True, 140.0, (True, False)),
        ("due, look within half an interval: the look comes along", 100.0, True, 129.0,
         (True, True)),
        ("due, a leader: heartbeat alone", 100.0, False, 101.0, (True, False)),
        ("not due, look now, heartbeat within half: heartbeat along", 71.0, True, 71.0,
         (True, False)),
        ("not due, look now, heartbeat further than half", 69.0, True, 69.0, (False, False)),
        ("not due, look later", 80.0, True, 90.0, (False, False)),
        ("not due, a leader", 99.0, False, 0.0, (False, False)),
    ],
)  # fmt: skip
def test_a_followers_heartbeat_goes_with_its_look(
    why: str, now: float, following: bool, look_at: float, expected: tuple[bool, bool]
) -> None:
    got = heartbeat_now(now, 100.0, following=following, look_at=look_at, interval=60.0)
    assert got == expected, why


# -- the election thread's timing rules ------------------------------------------------------

LATER, BY = NOW + 1.0, NOW + 60.0  # the look as planned, and the latest a wakeup may push it


@pytest.mark.parametrize(
    ("why", "kind", "term", "seen", "held", "lock_on", "look_by", "spread", "expected"),
    [
        ("the leader read renewed (tagged): nothing to look at for one lease length",
         "renewed", 7, lease(), None, True, BY, 0.0, NOW + 10.0),
        ("the same without a lock", "renewed", 7, lease(tag=None), None, False, BY, 0.0,
         NOW + 10.0),
        ("spread delays it by 0.02 s at most", "renewed", 7, lease(), None, True, BY, 0.999,
         pytest.approx(NOW + 10.02, abs=1e-3)),
        ("never past look_by: a forged stream delays the look that long at most",
         "renewed", 7, lease(), None, True, NOW + 5.0, 0.0, NOW + 5.0),
        ("an untagged renewal with the lock on may be the tagging one: look now",
         "renewed", 7, lease(tag=None), None, True, BY, 0.0, 0.0),
        ("a renewal of a term not read: the look as planned", "renewed", 8, lease(), None,
         True, BY, 0.0, LATER),
        ("a renewal while holding a term: the look as planned", "renewed", 7, lease(), 7, True,
         BY, 0.0, LATER),
        ("a renewal of a row read vacant: the look as planned", "renewed", 7,
         lease(token=None), None, True, BY, 0.0, LATER),
        ("our own election: the look as planned", "elected", 9, lease(), 9, True, BY, 0.0,
         LATER),
        ("another's election: look now", "elected", 9, lease(), None, True, BY, 0.0, 0.0),
        ("a resign: look now", "resigned", 7, lease(), None, True, BY, 0.0, 0.0),
        ("the listener reconnected (events may be lost): look now", "reconnected", None,
         lease(), None, True, BY, 0.0, 0.0),
    ],
)  # fmt: skip
def test_when_a_follower_looks_after_a_wakeup(
    why: str,
    kind: str,
    term: int | None,
    seen: Lease,
    held: int | None,
    lock_on: bool,
    look_by: float,
    spread: float,
    expected: float,
) -> None:
    got = look_after_wakeup(
        kind, term, seen, held=held, lock_on=lock_on, now=NOW, look_at=LATER,
        look_by=look_by, spread=spread,
    )  # fmt: skip
    assert got == expected, why


@pytest.mark.parametrize(
    ("news", "renew", "look"),
    [
        # a leader renews to tag its term, to drop the tag before the ping's trust ends,
        # or to go on with the lease alone; a follower elects, takes over or plans anew
        (LockNews.GRANTED, True, True),
        (LockNews.LOST, True, False),  # a follower waits on the lock again
        (LockNews.UNSUPPORTED, True, True),
        (LockNews.HOT, True, True),
        (LockNews.FAILING, False, True),  # no wake-up will come: read the lease
        (LockNews.PINGED, False, False),  # trust lengthens without the row
    ],
)  # fmt: skip
def test_what_lock_news_brings_forward(news: LockNews, renew: bool, look: bool) -> None:
    assert (renew_now_after(news), look_now_after(news)) == (renew, look)


@pytest.mark.parametrize(
    ("why", "trust_left", "delay", "expected"),
    [
        ("plenty of trust: the back-off", 9.0, 1.0, 1.0),
        ("little trust: a third of it, so two more tries fit", 0.6, 1.0, pytest.approx(0.2)),
        ("none: never a busy loop", 0.0, 1.0, 0.01),
    ],
)  # fmt: skip
def test_how_long_a_leader_waits_to_renew_again(
    why: str, trust_left: float, delay: float, expected: float
) -> None:
    assert renew_retry_wait(trust_left, delay) == expected, why


@pytest.mark.parametrize(
    ("why", "following", "wait", "expected"),
    [
        ("a follower waiting a lease or more gives its connections back", True, 10.0, True),
        ("a shorter wait keeps them", True, 9.9, False),
        ("a leader keeps them", False, 30.0, False),
    ],
)  # fmt: skip
def test_when_the_connections_go_back_to_the_pool(
    why: str, following: bool, wait: float, expected: bool
) -> None:
    assert release_while_waiting(following=following, wait=wait, ttl=10.0) is expected, why


@pytest.mark.parametrize(
    ("older", "newer"),
    [
        ("0.1.0", "0.2.0"),
        ("0.2.0", "0.10.0"),  # numbers, not strings
        ("0.2.0", "1.0"),
        (None, "0.1.0"),  # a release that did not say is the oldest
        ("nightly", "0.0.1"),
        ("0.2.0", "0.2.1"),
    ],
)
def test_release_order(older: str | None, newer: str) -> None:
    assert release_key(older) < release_key(newer)


@pytest.mark.parametrize(("a", "b"), [("0.2", "0.2.0"), ("0.2.0rc1", "0.2.0"), ("v1.2", "1.2.0")])
def test_one_release_spelled_two_ways(a: str, b: str) -> None:
    assert release_key(a) == release_key(b)


def _cand(release: str | None, *, token: str = OTHER, eligible: bool = True) -> CandidateInfo:
    return CandidateInfo("x", "h", 1, 0, 0, token=token, eligible=eligible, release=release)


@pytest.mark.parametrize(
    ("why", "live", "expected"),
    [
        ("a newer one lives", [_cand("0.3.0")], True),
        ("the same release", [_cand("0.2.0")], False),
        ("an older one", [_cand("0.1.0"), _cand(None)], False),
        ("a newer one that may not lead", [_cand("0.3.0", eligible=False)], False),
        ("only ourselves, registered newer (a restart)", [_cand("0.3.0", token=ME)], False),
        ("nobody", [], False),
    ],
)  # fmt: skip
def test_a_newer_release_lives(why: str, live: list[CandidateInfo], expected: bool) -> None:
    assert newer_release_lives("0.2.0", live, ME) is expected, why


@pytest.mark.parametrize(
    ("why", "newer", "since", "expected"),
    [
        ("none newer: take it", False, None, False),
        ("newer, first seen now: hold back", True, None, True),
        ("newer, held back a while", True, NOW - 9.9, True),
        ("newer, held back for the whole patience: take it", True, NOW - 10.0, False),
    ],
)  # fmt: skip
def test_an_older_release_holds_back_a_bounded_time(
    why: str, newer: bool, since: float | None, expected: bool
) -> None:
    assert defer_take(newer, since, NOW, patience=10.0) is expected, why
