"""Two real ``celery worker --election`` on each driver's URL: ``postgresql://`` with only
psycopg2 importable (psycopg 3 hidden), ``postgresql+psycopg2://``, ``mysql://`` with only
mysqlclient (PyMySQL hidden), ``mysql+mysqldb://`` (the last two borrowed, as by default,
from the app's ``db+`` result backend). On each: one leader; a SIGKILL of the leader is
replaced through the liveness lock (the new term starts, on the database's clock, before
the dead leader's lease would have ended); and on psycopg2 a clean stop hands over through
NOTIFY (liveness off, followers that would look again only a minute later).

These tests assert what happened, never how fast: the seconds each driver takes are
measured by benchmarks/driver_failover.py.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.cluster import ROOT, Cluster, wait_until

from ..conftest import failed, server_url
from ..services import with_driver

pytestmark = [pytest.mark.slow, pytest.mark.tier2]

#: id -> (server, the URL's driver name, the driver hidden from the workers, the one used)
CASES = {
    "postgresql": ("postgresql", "postgresql", "psycopg", "psycopg2"),
    "postgresql+psycopg2": ("postgresql", "postgresql+psycopg2", None, "psycopg2"),
    "mysql": ("mysql", "mysql", "pymysql", "mysqldb"),
    "mysql+mysqldb": ("mysql", "mysql+mysqldb", None, "mysqldb"),
}
#: The crash test's lease: at the kill at least 0.6 x TTL of it is left (the leader renews
#: every 0.4 x TTL), which the lock path (delta = 1 s after the grant) beats by far.
TTL = 30.0
#: The NOTIFY test: without a wake-up a follower reads the lease again only when it would
#: end or after its poll, whichever is first: at the earliest POLL after its last look
#: (the lease it sees has at least 0.6 x NOTIFY_TTL = 60 s left).
NOTIFY_TTL = 100.0
POLL = 60.0


def _cluster(tmp: Path, case: str, ttl: float = TTL, **env: str) -> Cluster:
    server, driver, hidden, used = CASES[case]
    url = with_driver(server_url(server), driver)
    # Celery's result backend and the test's records name the driver: on SQLAlchemy 2.1 a
    # bare postgresql:// means psycopg 3, hidden here
    named = with_driver(server_url(server), f"{server}+{used}")
    c = Cluster(tmp, server_url("amqp"), url, f"db+{named}", ttl=ttl)
    path = str(ROOT)
    if hidden is not None:  # the workers import only the other driver
        shim = tmp / "hidden" / hidden
        shim.mkdir(parents=True)
        (shim / "__init__.py").write_text(f"raise ImportError('{hidden} hidden by the test')\n")
        path = f"{shim.parent}:{path}"
    else:  # a named driver: election_url is left unset, the db+ result backend borrowed
        env = {"E2E_BORROW": "1", **env}
    c.env.update(PYTHONPATH=path, E2E_RECORD=named, **env)
    c.url = url  # type: ignore[attr-defined]
    return c


@pytest.fixture
def clusters(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[list[Cluster]]:
    made: list[Cluster] = []
    yield made
    for c in made:
        if failed(request):
            print(c.logs())
        c.close()


def _driver_in_workers(c: Cluster) -> str:
    """The SQLAlchemy driver the workers' election backend resolves to (their env)."""
    code = (
        "from celery_election.backends import backend_from_url as b; import sys; "
        "print(b(sys.argv[1]).engine.dialect.driver)"
    )
    url = c.env["E2E_RESULTS"] if c.env.get("E2E_BORROW") else c.url  # type: ignore[attr-defined]
    done = subprocess.run(
        [sys.executable, "-c", code, url], env=c.env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.mark.parametrize("case", list(CASES))
def test_sigkill_of_the_leader_fails_over_through_the_liveness_lock(
    case: str, tmp_path: Path, clusters: list[Cluster]
) -> None:
    c = _cluster(tmp_path, case)
    clusters.append(c)
    assert _driver_in_workers(c) == CASES[case][3]
    w1, w2 = _names()
    c.start(w1)
    c.start(w2)
    c.wait_candidates(2)
    leader = c.wait_leader(30)
    wait_until(lambda: (c.lease() or _NO).liveness_us is not None, 10, "a lease bound by the lock")
    follower = w2 if leader == w1 else w1
    before = c.lease()
    assert before is not None
    c.signal(leader, signal.SIGKILL)
    c.wait_exit(leader)
    # the lease alone would elect the follower too, a little after before.expires_at_us:
    # the assertion below tells the two paths apart, this deadline only bounds the wait
    assert c.wait_leader(TTL + 10, other_than=leader) == follower
    new = c.lease()
    assert new is not None and new.term > before.term and new.acquired_at_us is not None
    # through the lock: the new term began (database clock) before the dead leader's
    # lease, as read just before the kill, would have ended (a renewal after that read
    # only ends it later)
    left = (before.expires_at_us - new.acquired_at_us) / 1e6
    assert new.liveness_us is not None and left > 0, (
        f"the new term began {-left:.3f} s after the dead leader's lease ended: "
        "the lease's expiry elected it, not the liveness lock"
    )
    owners = c.term_owners()
    assert all(len(workers) == 1 for workers in owners.values()), owners


@pytest.mark.parametrize("case", ["postgresql", "postgresql+psycopg2"])
def test_a_clean_stop_hands_over_through_notify_on_psycopg2(
    case: str, tmp_path: Path, clusters: list[Cluster]
) -> None:
    c = _cluster(tmp_path, case, ttl=NOTIFY_TTL, E2E_LIVENESS="0", E2E_POLL=str(POLL))
    clusters.append(c)
    assert _driver_in_workers(c) == "psycopg2"
    w1, w2 = _names()
    c.start(w1)
    c.start(w2)
    c.wait_candidates(2)
    leader = c.wait_leader(30)
    follower = w2 if leader == w1 else w1
    # a resign NOTIFYed before the follower LISTENs would wake nobody
    wait_until(lambda: c.listening(follower), 30, f"{follower}'s LISTEN")
    # Its heartbeat at registration went right before its first look, and every later
    # look comes at the earliest POLL after the one before, unless a wake-up calls it.
    first = next(
        info.heartbeat_at_us
        for info in c.backend.candidates(c.namespace)
        if info.candidate_id.startswith(f"{follower}@")
    )
    c.signal(leader, signal.SIGTERM)
    # long enough for its own next look (its poll, or the lease's end where it trusts its
    # wake-ups) to elect it: a broken wake-up then fails on the clock below, with a figure
    assert c.wait_leader(NOTIFY_TTL + 30, other_than=leader) == follower
    revoked = _transition(c, leader, "revoked")
    elected = _transition(c, follower, "elected", term_above=revoked.term)
    new = c.lease()
    assert new is not None and new.term == elected.term and new.acquired_at_us is not None
    since = (new.acquired_at_us - first) / 1e6
    # POLL / 2 covers the old leader's warm shutdown many times over, and fails only
    # when the follower waited for its poll (database clock, from its first look)
    assert since < POLL / 2, (
        f"{follower} was elected {since:.3f} s after its first look (poll {POLL:.0f} s): "
        "the resign's NOTIFY did not wake it"
    )
    assert c.wait_exit(leader) == 0


def _names() -> tuple[str, str]:
    """Node names of this test's own: RabbitMQ's pidbox queues are shared by everyone's tests."""
    run = uuid.uuid4().hex[:6]
    return f"d{run}a", f"d{run}b"


class _None:
    liveness_us = None


_NO: Any = _None()


def _transition(c: Cluster, worker: str, kind: str, term_above: int = 0) -> Any:
    def find() -> Any:
        for r in reversed(c.rows(c.transitions)):
            if r.worker.startswith(f"{worker}@") and r.kind == kind and r.term > term_above:
                return r
        return None

    return wait_until(find, 10, f"{worker} {kind}")
