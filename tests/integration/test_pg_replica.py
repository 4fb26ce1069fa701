"""A primary with a streaming standby (``pg_basebackup -R``), the primary killed and the
standby promoted, with the electors on a multi-host URL with
``target_session_attrs=read-write`` (they find the new primary by themselves).

Synchronous replication loses no commit: no two believers, terms only up. Asynchronous
replication can lose the last commits (here: the stand-by's WAL receiver is stopped, so
it loses them all from then on): a renewal the old primary acknowledged is gone, so
without the liveness lock the old leader believes on it while another wins on the new
primary (the README says so); with the lock, its trust ended with its pings to the dead
primary. Terms never go down, even when the standby's clock is 30 s behind: a term issued
by the old primary and lost is above what the standby's clock gives, and the electors'
floor (the greatest term seen + 1, their host clock) keeps new terms above it.
"""

from __future__ import annotations

import glob
import logging
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from celery_election import Elector, backend_from_url
from celery_election.errors import BackendUnavailableError
from celery_election.history import Recorder
from harness.chaos.faults import FAKETIME_LIB
from harness.checker import check, load
from harness.proxy import Proxy

from ..conftest import unique_prefix
from ..services import REQUIRE

pytestmark = [pytest.mark.tier2, pytest.mark.timeout(300)]
NS = "replica"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Replicated:
    """A throwaway primary and a standby of it, run as the postgres user."""

    def __init__(self, *, sync: bool, standby_skew: float = 0.0, standby: bool = True) -> None:
        bins = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
        if not bins:
            if REQUIRE:
                pytest.fail("PostgreSQL binaries are required (CELERY_ELECTION_REQUIRE_SERVICES=1)")
            pytest.skip("no PostgreSQL binaries to run a primary and a standby")
        self.bin = os.path.dirname(bins[-1])
        self.dir = Path(tempfile.mkdtemp(prefix="celery-election-replica-"))
        self.as_user: list[str] = []
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres", "postgres")
            self.as_user = ["runuser", "-u", "postgres", "--"]
        self.sync = sync
        self.primary, self.standby = self.dir / "primary", self.dir / "standby"
        self.pport, self.sport = _port(), _port()
        self._run("initdb", "-D", str(self.primary), "-U", "postgres", "-A", "trust")
        sync_names = "standby1" if sync else ""
        self._start(self.primary, self.pport, f"-c synchronous_standby_names='{sync_names}'")
        self.primary_url = f"postgresql+psycopg://postgres@127.0.0.1:{self.pport}/postgres"
        self.link = Proxy("127.0.0.1", self.pport)
        if standby:
            self._add_standby(standby_skew)

    def _add_standby(self, standby_skew: float) -> None:
        self._run("pg_basebackup", "-D", str(self.standby), "-h", "127.0.0.1",
                  "-p", str(self.pport), "-U", "postgres", "-R", "-X", "stream")  # fmt: skip
        # replication goes through a proxy (self.link) that the test can freeze and cut:
        # WAL the standby has not received when the primary dies is lost with it
        with open(self.standby / "postgresql.auto.conf", "a") as conf:
            conf.write(
                f"primary_conninfo = 'host=127.0.0.1 port={self.link.port} user=postgres "
                f"application_name=standby1'\n"
            )
        env = []
        if standby_skew:
            env = ["env", f"LD_PRELOAD={FAKETIME_LIB}", f"FAKETIME={standby_skew:+.0f}s",
                   "FAKETIME_DONT_FAKE_MONOTONIC=1"]  # fmt: skip
        self._start(self.standby, self.sport, "", env)
        hosts = f"host=127.0.0.1:{self.pport}&host=127.0.0.1:{self.sport}"
        self.url = (
            f"postgresql+psycopg://postgres@/postgres?{hosts}&target_session_attrs=read-write"
        )
        self.standby_url = f"postgresql+psycopg://postgres@127.0.0.1:{self.sport}/postgres"

    def _run(self, tool: str, *args: str, env: list[str] | None = None) -> None:
        cmd = [*self.as_user, *(env or []), f"{self.bin}/{tool}", *args]
        subprocess.run(cmd, check=True, capture_output=True, timeout=60)

    def _start(self, data: Path, port: int, options: str, env: list[str] | None = None) -> None:
        opts = f"-p {port} -k {self.dir} -c listen_addresses=127.0.0.1 {options}"
        log = str(data) + ".log"
        self._run("pg_ctl", "-D", str(data), "-w", "-l", log, "-o", opts, "start", env=env)

    def kill_primary(self) -> None:
        self._run("pg_ctl", "-D", str(self.primary), "-m", "immediate", "stop")

    def start_primary(self) -> None:
        self._start(self.primary, self.pport, "")

    def promote(self) -> None:
        self._run("pg_ctl", "-D", str(self.standby), "-w", "promote")

    def close(self) -> None:
        self.link.close()
        for data in (self.primary, self.standby):
            subprocess.run([*self.as_user, f"{self.bin}/pg_ctl", "-D", str(data), "-m",
                            "immediate", "stop"], capture_output=True, timeout=60)  # fmt: skip
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def cluster(request: pytest.FixtureRequest) -> Iterator[Replicated]:
    r = Replicated(**request.param)
    try:
        yield r
    finally:
        r.close()


def wait(what: str, check_: Any, timeout: float) -> Any:
    end = time.monotonic() + timeout
    while not (value := check_()):
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.05)
    return value


SCENARIOS = [
    ({"sync": True}, 1.0),
    ({"sync": True}, False),
    ({"sync": False}, 1.0),
    ({"sync": False}, False),
    ({"sync": False, "standby_skew": -30.0}, 1.0),
]


@pytest.mark.parametrize(
    ("cluster", "liveness"),
    SCENARIOS,
    indirect=["cluster"],
    ids=["sync-liveness", "sync-lease", "async-liveness", "async-lease", "async-clock-behind"],
)
def test_promoting_the_standby(cluster: Replicated, liveness: Any, tmp_path: Path) -> None:
    prefix = unique_prefix()
    admin = backend_from_url(cluster.url, table_prefix=prefix, listen=False)
    admin.install()
    history = tmp_path / "history.jsonl"
    electors = []
    for i in range(3):
        backend = backend_from_url(cluster.url, table_prefix=prefix, connect_timeout=2.0)
        e = Elector(backend, NS, candidate_id=f"e{i}", ttl=3.0, liveness=liveness)
        Recorder(history, role=f"e{i}").attach(e)
        electors.append(e.start())
    try:
        first = wait("a leader", lambda: next((e for e in electors if e.is_leader), None), 30)
        sync = cluster.sync
        if not sync:  # from now on the standby receives nothing: async at its worst
            cluster.link.stall()
        first.resign()  # a new term on the primary (lost with it when async)
        second = wait("a new leader", lambda: next(
            (e for e in electors if e.is_leader and e is not first), None), 30)  # fmt: skip
        lost_term = second.term
        time.sleep(1.5)  # a renewal or two the standby may never get
        cluster.kill_primary()
        cluster.link.cut(refuse_new=True)  # what was in flight is gone
        cluster.promote()
        standby = backend_from_url(cluster.standby_url, table_prefix=prefix, listen=False)

        def leading() -> Any:
            lease = standby.current(NS)
            if lease is None or not lease.held or lease.term < lost_term:
                return None  # a term from before the lost ones: not yet replaced
            return lease if any(e.term == lease.term for e in electors) else None

        try:
            after = wait("a leader on the promoted standby", leading, 60)
        finally:
            standby.close()
        # never reissued, never lower, whatever the standby's clock: the lost term's
        # leader may go on (nothing was lost), or a strictly greater term replaces it
        assert after.term > lost_term or after.leader_id == second.candidate_id
    finally:
        for e in electors:
            e.stop()
        admin.close()
    report = check(load([history]))
    print(f"{cluster.standby.name}: liveness={liveness} overlap={report.overlap_seconds:.3f}s")
    terms_down = [v for v in report.violations if "went down" in v or "held by" in v]
    assert terms_down == []
    if liveness or sync:  # where the README promises no two believers
        assert report.violations == [] and report.overlap_seconds == 0


@pytest.mark.parametrize("cluster", [{"sync": False}], indirect=True)
def test_a_standby_is_refused_and_async_replication_named(
    cluster: Replicated, caplog: pytest.LogCaptureFixture
) -> None:
    """A URL naming only the standby: install and every step fail with the fix in one
    line, at ERROR (repeated every minute), never at DEBUG. An elector with the lease
    alone on a primary with an asynchronous standby is told what that costs."""
    prefix = unique_prefix()
    primary = backend_from_url(cluster.url, table_prefix=prefix, listen=False)
    primary.install()
    standby = backend_from_url(cluster.standby_url, table_prefix=prefix, listen=False)
    try:

        def replicated() -> bool:
            try:
                return standby.current(NS) is None
            except Exception:
                return False

        wait("the tables on the standby", replicated, 10)
        with pytest.raises(BackendUnavailableError, match="read-only standby: point"):
            standby.install()
        caplog.set_level(logging.WARNING, "celery_election")
        e = Elector(standby, NS, ttl=3.0).start()
        try:
            wait("an ERROR naming the standby", lambda: any(
                r.levelno == logging.ERROR and "read-only standby" in r.getMessage()
                for r in caplog.records), 10)  # fmt: skip
        finally:
            e.stop()
        e = Elector(primary, NS, ttl=3.0, liveness=False).start()
        try:
            assert e.wait_for_leadership(10)
        finally:
            e.stop()
        assert any("asynchronous standby" in r.getMessage() for r in caplog.records)
    finally:
        standby.close()
        primary.uninstall()
        primary.close()


@pytest.mark.parametrize("down", [0.0, 5.0, 15.0])
def test_after_a_restart_a_crash_is_replaced_through_the_lock(down: float, tmp_path: Path) -> None:
    """The server stopped for ``down`` seconds and started again; then the leader is
    SIGKILLed: the next leader comes through the liveness lock (before the old lease
    could end), every time (once it took 9.4 s: the lease)."""
    from .test_liveness import NS as LIVE_NS
    from .test_liveness import Child, _pg_lock_waiters, _wait_tagged

    r = Replicated(sync=False, standby=False)
    prefix = unique_prefix()
    admin = backend_from_url(r.primary_url, table_prefix=prefix, listen=False)
    history = tmp_path / "history.jsonl"
    children: list[Child] = []
    try:
        admin.install()
        for name in ("c1", "c2", "c3"):
            children.append(Child(r.primary_url, prefix, history, 10.0, name=name))

        def tagged() -> Any:
            try:
                lease = admin.current(LIVE_NS)
            except Exception:  # the server is starting again
                return None
            return lease if lease is not None and lease.held and lease.liveness_us else None

        first = wait("a tagged leader", tagged, 30)
        r.kill_primary()
        time.sleep(down)  # the outage itself
        r.start_primary()
        old = wait("a tagged leader after the restart", tagged, 60)
        old = _wait_tagged(admin, old.term)
        # the followers' waits on the lock were cut with the server: the crash is to be
        # replaced through the lock once one of them waits on it again (under a loaded
        # second tier one had not yet, and the take-over went through the lease)
        wait("a follower waiting on the lock", lambda: _pg_lock_waiters(r.primary_url, prefix), 30)
        victim = children[["c1", "c2", "c3"].index(str(old.leader_id))]
        killed = time.monotonic()
        victim.proc.kill()
        new = wait("a new leader", lambda: (t := tagged()) and t.term != old.term and t, 60)
        print(
            f"down {down:.0f}s: first term {first.term}, crash replaced in "
            f"{time.monotonic() - killed:.2f}s (observed)"
        )
        assert new.acquired_at_us < old.expires_at_us  # through the lock, not the lease
    finally:
        for c in children:
            c.close()
        admin.close()
        r.close()
    report = check(load([history]))
    assert report.violations == [] and report.overlap_seconds == 0
