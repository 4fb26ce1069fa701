"""Two real ``celery worker --election`` on each driver's URL: ``postgresql://`` with only
psycopg2 importable (psycopg 3 hidden), ``postgresql+psycopg2://``, ``mysql://`` with only
mysqlclient (PyMySQL hidden), ``mysql+mysqldb://`` (the last two borrowed, as by default,
from the app's ``db+`` result backend). On each: one leader; a SIGKILL of the
leader is replaced through the liveness lock (the new term starts before the dead leader's
10 s lease ends, about a second after the kill, on the database's clock); and on psycopg2
a clean stop hands over through NOTIFY (liveness off, followers polling every 30 s).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ..conftest import failed, server_url
from ..services import with_driver
from .cluster import ROOT, Cluster, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.tier2]

#: id -> (server, the URL's driver name, the driver hidden from the workers, the one used)
CASES = {
    "postgresql": ("postgresql", "postgresql", "psycopg", "psycopg2"),
    "postgresql+psycopg2": ("postgresql", "postgresql+psycopg2", None, "psycopg2"),
    "mysql": ("mysql", "mysql", "pymysql", "mysqldb"),
    "mysql+mysqldb": ("mysql", "mysql+mysqldb", None, "mysqldb"),
}
TTL = 10.0


def _cluster(tmp: Path, case: str, **env: str) -> Cluster:
    server, driver, hidden, used = CASES[case]
    url = with_driver(server_url(server), driver)
    # Celery's result backend and the test's records name the driver: on SQLAlchemy 2.1 a
    # bare postgresql:// means psycopg 3, hidden here
    named = with_driver(server_url(server), f"{server}+{used}")
    c = Cluster(tmp, server_url("amqp"), url, f"db+{named}", ttl=TTL)
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
    assert c.wait_leader(TTL + 10, other_than=leader) == follower
    new = c.lease()
    assert new is not None and new.term > before.term and new.acquired_at_us is not None
    # through the lock: the new term began before the dead leader's lease ended
    assert new.liveness_us is not None and new.acquired_at_us < before.expires_at_us
    took = (new.acquired_at_us - before.db_now_us) / 1e6
    print(f"\nDRIVER-FAILOVER {case}: {took:.3f} s after the kill (lease ends +"
          f"{(before.expires_at_us - before.db_now_us) / 1e6:.1f} s)")  # fmt: skip
    assert took < 3.0, took
    owners = c.term_owners()
    assert all(len(workers) == 1 for workers in owners.values()), owners


@pytest.mark.parametrize("case", ["postgresql", "postgresql+psycopg2"])
def test_a_clean_stop_hands_over_through_notify_on_psycopg2(
    case: str, tmp_path: Path, clusters: list[Cluster]
) -> None:
    c = _cluster(tmp_path, case, E2E_LIVENESS="0", E2E_POLL="30")
    clusters.append(c)
    assert _driver_in_workers(c) == "psycopg2"
    w1, w2 = _names()
    c.start(w1)
    c.start(w2)
    c.wait_candidates(2)
    leader = c.wait_leader(30)
    follower = w2 if leader == w1 else w1
    time.sleep(2)  # the follower's listener connects and probes (its first look is at once)
    c.signal(leader, signal.SIGTERM)
    assert c.wait_leader(10, other_than=leader) == follower
    revoked = _transition(c, leader, "revoked")
    elected = _transition(c, follower, "elected", term_above=revoked.term)
    took = (elected.at - revoked.at) / 1e6
    print(f"\nDRIVER-NOTIFY {case}: elected {took:.3f} s after the resign (poll 30 s)")
    # polling every 30 s and a 10 s lease: only the resign's NOTIFY wakes it this soon
    assert took < 1.0, took
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
