"""The election thread's decisions, as pure functions of what it knows and the time.

No I/O, no threads, no clock reads: the election thread (election/loop.py) reads the
clock and the lock, makes the call a function chooses, and feeds the answer back. Each
function is tested from a table (tests/unit/test_decisions.py) and each bound in it is a
mutation target (harness/mutations.py), so a maintainer can check the protocol here,
apart from threads.

The liveness rules (docs/design.md, "LockThread"), with ``delta`` the lock session's
silence bound:

* Whoever holds the lock pings it every ``delta / 4``. A ping that started at ``p`` and
  succeeded proves the server will not end the session before ``p + delta``; a leader
  whose term is tagged with its delta trusts itself until
  ``min(lease trust, p + delta x 11/12)`` (the 1/12 allows for clock rate error).
* A grant means the previous holder's session has ended, and with it, at most delta
  later, the previous leader's trust: so ``waited`` seconds after the grant a follower
  may take over a term tagged with a delta no longer than ``waited``.
* The lock comes before the election: the candidate holding the lock elects (its term is
  tagged from the start, so a leader that dies a moment after its election is replaced
  delta later, not a lease later); the others wait on the lock, and elect untagged only
  when a vacancy has lasted ``grace`` (a lock whose holder cannot elect must not stop
  the election: the lease stays the net).
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass

from .config import ElectionConfig
from .lease import CandidateInfo, ElectResult, Lease
from .transitions import Lead

__all__ = [
    "RATE_ALLOWANCE",
    "Call",
    "LockNews",
    "Next",
    "Proof",
    "Seen",
    "Wait",
    "after_elect",
    "after_renew",
    "defer_take",
    "extend",
    "follower_call",
    "follower_wait",
    "granted",
    "heartbeat_now",
    "look_after_wakeup",
    "look_now_after",
    "newer_release_lives",
    "release_key",
    "release_while_waiting",
    "renew_now_after",
    "renew_retry_wait",
    "transfer_asked",
    "trust_end",
]

#: A ping's proof lasts delta x (1 - this): clocks may run fast by up to 1/12 (chrony).
RATE_ALLOWANCE = 1 / 12


class LockNews(str, enum.Enum):
    """What the lock thread tells the election thread (election/lock_thread.py)."""

    #: the lock is ours (a new grant, pinged once)
    GRANTED = "granted"
    #: the grant was lost (the session ended, or a ping failed past its proof)
    LOST = "lost"
    #: a good ping of the held grant: its proof lasts longer (the lease is not involved)
    PINGED = "pinged"
    #: a standby slot was taken after a cold spell: waiting on the lock again
    HOT = "hot"
    #: a wait on the lock failed after going well: the grant may not come
    FAILING = "failing"
    #: the server cannot hold the lock: the lease alone from now on
    UNSUPPORTED = "unsupported"


@dataclass(frozen=True)
class Proof:
    """What this candidate's liveness lock proves, as one value (the lock thread's only).

    ``grant`` counts the grants seen (0: none yet); ``granted_at`` is the boot-time
    reading of the current one (None: not held). ``good_until`` is until when the last
    good ping of that grant proves the session alive, frozen once the grant is lost;
    ``previous`` is the final bound of the grant before, which a term tagged under that
    grant keeps until its leader renews under the new one.
    """

    grant: int = 0
    granted_at: float | None = None
    good_until: float = -math.inf
    previous: float = -math.inf

    @property
    def has_lock(self) -> bool:
        """Whether the lock is held, as last heard (and was pinged since the grant)."""
        return self.granted_at is not None

    def proven(self, now: float) -> bool:
        """Whether the lock is held at ``now``, as its last ping proves.

        A grant whose proof lapsed (a paused process, a lost session not yet noticed) says
        nothing: another may have had the lock, and won a term, since.
        """
        return self.granted_at is not None and now < self.good_until


def granted(proof: Proof, at: float, ping_started: float, delta: float) -> Proof:
    """The proof after a new grant whose first ping started at ``ping_started``."""
    return Proof(proof.grant + 1, at, ping_started + delta * (1 - RATE_ALLOWANCE), proof.good_until)


def extend(proof: Proof, started: float, done: float, delta: float) -> Proof:
    """The proof after a good ping (``started`` .. ``done``) of the held grant.

    Only a ping that returns while the last proof still holds extends it: a proof that
    lapsed stays lapsed, so trust that ended (and was announced ended) never comes back.
    """
    if not proof.has_lock or done >= proof.good_until:
        return proof
    return Proof(
        proof.grant,
        proof.granted_at,
        max(proof.good_until, started + delta * (1 - RATE_ALLOWANCE)),
        proof.previous,
    )


def trust_end(lead: Lead, proof: Proof) -> float:
    """Until when ``lead`` may be believed: its lease's bound, and its lock's if tagged."""
    if lead.grant is None:
        return lead.lease_until
    if proof.grant == lead.grant:
        bound = proof.good_until
    elif proof.grant == lead.grant + 1:
        bound = proof.previous  # re-granted since: the old grant's proof, frozen
    else:
        bound = -math.inf
    return min(lead.lease_until, bound)


@dataclass(frozen=True)
class Seen:
    """What a follower knows at ``now``: the row as last read, and its lock."""

    now: float
    lease: Lease | None
    token: str
    #: None when there is no liveness lock (off, or the server cannot hold one)
    proof: Proof | None
    #: since when every read of the row has found it vacant (None: not vacant)
    vacant_since: float | None = None
    #: no standby slot was free: this follower does not wait on the lock (no connection)
    cold: bool = False
    #: the server takes the lock from a holder that goes silent (not SQLite's file lock,
    #: which a stopped process keeps): a waiting follower is woken by the grant
    silent_holders_lose: bool = False
    #: it may take a term (``election_eligible``); an ineligible candidate only reads
    eligible: bool = True


class Call(str, enum.Enum):
    """What a follower sends when it looks."""

    #: try to take a vacant lease; the row comes back either way
    ELECT = "elect"
    #: take the term seen over, ``waited`` seconds after our grant (backend.take_over)
    TAKE_OVER = "take_over"
    #: only read the row: the lock's holder elects first
    LOOK = "look"


def _tagged_by_other(lease: Lease | None, token: str) -> bool:
    return (
        lease is not None and lease.held and lease.liveness_us is not None and lease.token != token
    )


def follower_call(seen: Seen, grace: float) -> tuple[Call, float]:
    """The statement a follower sends when it looks, and the seconds waited since its grant.

    An ineligible candidate only ever looks: it takes part (listed, reading who leads)
    but never takes a term, whatever the row says.
    """
    if not seen.eligible:
        return Call.LOOK, 0.0
    proof = seen.proof
    if proof is None:
        return Call.ELECT, 0.0
    if proof.proven(seen.now):
        # Nobody has had the lock since the grant, so the term in the row was won before
        # it, and its holder's trust ended delta after it.
        assert proof.granted_at is not None
        waited = seen.now - proof.granted_at
        lease = seen.lease
        if (
            _tagged_by_other(lease, seen.token)
            and lease is not None
            and lease.liveness_us is not None
            and waited * 1_000_000 >= lease.liveness_us
        ):
            return Call.TAKE_OVER, waited
        return Call.ELECT, 0.0
    if seen.vacant_since is not None and seen.now - seen.vacant_since >= grace:
        return Call.ELECT, 0.0  # the lock's holder had its chance: the lease decides
    return Call.LOOK, 0.0


@dataclass(frozen=True)
class Wait:
    """A follower's next look: ``wait`` seconds from now unless something wakes it."""

    wait: float
    #: a wakeup may push the next look back, but never past now + ``look_by``
    look_by: float
    #: whether to hold (or queue for) the liveness lock meanwhile
    want_lock: bool


def follower_wait(
    seen: Seen, config: ElectionConfig, *, healthy: bool, grace: float, spread: float
) -> Wait:
    """How long a follower waits after a look, and whether it wants the lock meanwhile.

    ``lease.remaining`` was computed by the database, so no host clock is compared with
    the lease. ``healthy``: wakeups (NOTIFY) arrive, so a resign wakes us early and the
    cap is the slow ``fallback_interval``; without them ``poll_interval`` bounds a
    handoff. ``spread`` in [0, 1) spreads candidates apart (the caller's random number).
    An ineligible candidate waits as one without a lock: holding the lock, or a standby
    slot, would keep it from those who may lead.
    """
    lease = seen.lease
    proof = seen.proof if seen.eligible else None
    fallback = config.fallback_interval
    held = lease is not None and lease.held
    if proof is not None and _tagged_by_other(lease, seen.token):
        assert lease is not None and lease.liveness_us is not None
        if proof.proven(seen.now):  # take it over once its delta has passed
            assert proof.granted_at is not None
            wait = max(0.0, proof.granted_at + lease.liveness_us / 1e6 - seen.now) + 0.001
            return Wait(wait, wait, True)
        if seen.cold:
            # Its lock thread tries for a standby slot once per fallback, and a slot
            # leads to the lock at once if nobody holds it: that is its look.
            return Wait(fallback, fallback, True)
        # The grant pokes us: a resign, a crash or a pause releases the lock. The lease
        # stays the net, read once per fallback (a wedged leader that still pings; a
        # wait on a link that died without a word, which keepalives and read timeouts
        # end), or once per lease where a stopped process keeps the lock (a file lock).
        if seen.silent_holders_lose:
            wait = fallback * (1 + config.jitter * (2 * spread - 1))
        else:
            wait = min(fallback, lease.remaining + spread * 0.05)
        return Wait(wait, max(wait, fallback if healthy else 0.0), True)
    if proof is not None and not held:
        # Vacant: the lock's holder elects; without a grant, elect once grace has passed.
        since = seen.now if seen.vacant_since is None else seen.vacant_since
        if proof.proven(seen.now):
            wait = config.poll_interval * (1 + config.jitter * (2 * spread - 1))
        else:
            wait = max(0.0, since + grace - seen.now)
        return Wait(wait, wait, True)
    # No lock, or a leader not bound by it (yet): let that leader have the lock.
    if not held:
        wait = config.poll_interval * (1 + config.jitter * (2 * spread - 1))
    else:
        assert lease is not None
        wait = lease.remaining + spread * min(0.05, lease.remaining * 0.01)
        wait = min(wait, fallback if healthy else config.poll_interval)
    return Wait(wait, max(wait, fallback if healthy else 0.0), False)


def heartbeat_now(
    now: float, due_at: float, *, following: bool, look_at: float, interval: float
) -> tuple[bool, bool]:
    """Whether to heartbeat now, and whether a follower's look comes forward to go with it.

    A waiting follower gives its connection back between looks, so a heartbeat and a look
    apart would each open one: whichever is due first brings the other forward when it
    is less than half an interval away (a look too early only reads the row).
    """
    half = interval / 2
    if now >= due_at:
        return True, following and look_at - now < half
    return following and now >= look_at and due_at - now < half, False


class Next(str, enum.Enum):
    """What the election thread does after an elect, take-over or renew comes back."""

    #: won in time: believe the new trust window
    LEAD = "lead"
    #: won too late, or the row says our term ran out: stop believing, resign the term
    GIVE_UP = "give_up"
    #: lost to contention and nothing known, still trusted: try again soon
    RETRY = "retry"
    #: the row is ours from a term we had given up on: renew it before trusting it
    RENEW = "renew"
    #: someone else's lease, or none: follow it (after a renew: leadership was lost)
    FOLLOW = "follow"
    #: the row is ours in a term we never held (handed to us: a transfer): renew it, then
    #: believe it from the renewal's start
    ACCEPT = "accept"


def after_elect(result: ElectResult, token: str, *, in_time: bool, had: int) -> Next:
    """After a follower's elect, take-over or look (``in_time``: its trust would still hold).

    ``had``: the greatest term this elector has held. A row held by its token in a later
    term was handed to it (a transfer, written after the giver's belief ended): it may
    believe that term once it has renewed it.
    """
    if result.won and result.lease is not None:
        return Next.LEAD if in_time else Next.GIVE_UP
    if result.lease is not None and result.lease.held_by(token):
        return Next.ACCEPT if result.lease.term > had else Next.RENEW
    return Next.FOLLOW


def transfer_asked(lease: Lease | None, token: str, term: int) -> str | None:
    """The token an operator asked this leader's term (``token``, ``term``) to go to, or None.

    Only a request on the row of exactly that term counts (a new term clears it), and
    never one naming the leader itself.
    """
    if lease is None or not lease.held_by(token) or lease.term != term:
        return None
    target = lease.transfer_to
    return target if target is not None and target != token else None


def after_renew(result: ElectResult, term: int, token: str, *, in_time: bool) -> Next:
    """After a leader's renew of ``term`` (``in_time``: its trust held when it returned)."""
    lease = result.lease
    if result.won:
        return Next.LEAD if in_time else Next.GIVE_UP
    if lease is None:
        return Next.RETRY if in_time else Next.GIVE_UP
    if lease.term == term and lease.token == token:
        return Next.GIVE_UP  # still ours but not renewable: it expired
    return Next.FOLLOW


# -- release preference: an older release defers to a newer one, for a while ---------------

_NUMBERS = re.compile(r"\d+(?:\.\d+)*")


def release_key(release: str | None) -> tuple[int, ...]:
    """A release's order: its leading dotted numbers (``0.2.0rc1`` is ``0.2.0``).

    None (a release that did not say, such as 0.1.0) and a release without numbers come
    before every numbered one.
    """
    found = _NUMBERS.search(release or "")
    if found is None:
        return ()
    parts = [int(p) for p in found.group().split(".")]
    while parts and parts[-1] == 0:  # 0.2 and 0.2.0 are one release
        parts.pop()
    return tuple(parts)


def newer_release_lives(release: str | None, live: Iterable[CandidateInfo], token: str) -> bool:
    """Whether another live candidate that may lead runs a newer release than ``release``."""
    mine = release_key(release)
    return any(c.eligible and c.token != token and release_key(c.release) > mine for c in live)


def defer_take(newer: bool, since: float | None, now: float, patience: float) -> bool:
    """Whether a follower about to take a term (vacant, expired or taken over) holds back.

    It does while a newer release lives (``newer``), for ``patience`` seconds from when it
    first held back (``since``; None: now): a newer candidate that cannot elect (wedged,
    or killed with its row not yet expired) delays an election that long at most.
    """
    return newer and (since is None or now - since < patience)


# -- when to look, renew or let go: the election thread's timing rules ---------------------


def renew_now_after(news: LockNews) -> bool:
    """Whether a leader renews at once on ``news`` from its lock.

    Granted: renew to tag the term; lost: renew untagged now, before the ping's trust runs
    out; unsupported: the lease alone from now on. A failing wait says nothing of a lock
    already held, and a good ping lengthens trust without the row.
    """
    return news in (LockNews.GRANTED, LockNews.LOST, LockNews.UNSUPPORTED, LockNews.HOT)


def look_now_after(news: LockNews) -> bool:
    """Whether a follower looks at once on ``news`` from its lock.

    Elect, take over, or plan the wait anew: a failing lock is no wake-up, so the lease
    is read again whenever it would end. A lost grant is followed by a wait on the lock.
    """
    return news in (LockNews.GRANTED, LockNews.UNSUPPORTED, LockNews.HOT, LockNews.FAILING)


def look_after_wakeup(
    kind: str,
    term: int | None,
    seen: Lease | None,
    *,
    held: int | None,
    lock_on: bool,
    now: float,
    look_at: float,
    look_by: float,
    spread: float,
) -> float:
    """When a follower looks next after a wakeup (``kind``, ``term``) from the backend.

    A wakeup only ever changes *when* it looks (``look_at``, a clock reading; 0: now).
    The leader it last read (``seen``) renewing pushes the look back by one lease length,
    never past ``look_by`` (a forged stream of these delays it that long at most); a
    renewal of a term not yet bound by the lock (``lock_on``) may be the one that tags it,
    so the follower looks, to wait on the lock rather than on the lease. Its own election
    changes nothing; anything else is looked at now. ``spread`` in [0, 1).
    """
    if kind == "renewed":
        if held is not None or seen is None or not seen.held:
            return look_at
        if term != seen.term:
            return look_at
        if not lock_on or seen.liveness_us is not None:
            start = seen.renewed_at_us or seen.acquired_at_us or seen.expires_at_us
            length = (seen.expires_at_us - start) / 1_000_000
            return min(max(look_at, now + length + spread * 0.02), look_by)
    if kind == "elected" and term is not None and term == held:
        return look_at  # our own
    return 0.0


def renew_retry_wait(trust_left: float, delay: float) -> float:
    """How long a leader whose renewal failed or lost to contention waits to retry.

    ``delay``: the back-off (or the poll interval); never more than a third of the trust
    left, so two more tries fit before the trust ends, and never a busy loop.
    """
    return min(delay, max(0.01, trust_left / 3))


def release_while_waiting(*, following: bool, wait: float, ttl: float) -> bool:
    """Whether to give the pooled connections back before a wait.

    A follower about to wait a lease or longer holds no connection meanwhile; shorter
    waits (and a leader's) keep theirs, since reconnecting would cost more than it saves.
    """
    return following and wait >= ttl
