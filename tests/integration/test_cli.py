"""``celery-election`` / ``celery election``: every subcommand, on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from celery_election import Elector, RevokeReason
from celery_election.backends import backend_from_url
from celery_election.core.lease import Bid
from celery_election.core.runstate import run_task_id
from celery_election.ops.cli import election

from ..conftest import claim_run, unique_prefix

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def target(sql_url: str) -> Iterator[tuple[str, str]]:
    prefix = unique_prefix()
    yield sql_url, prefix
    b = backend_from_url(sql_url, table_prefix=prefix)
    b.uninstall()
    b.close()


def cli(url: str, prefix: str, *args: str) -> Any:
    return CliRunner().invoke(election, ["--url", url, "--table-prefix", prefix, *args])


def test_install_status_resign_watch_uninstall(target: tuple[str, str]) -> None:
    url, prefix = target
    result = cli(url, prefix, "status")
    assert result.exit_code == 1 and "celery -A proj election install" in result.output  # no tables
    result = cli(url, prefix, "install")
    assert result.exit_code == 0 and f"{prefix}lease" in result.output
    assert cli(url, prefix, "install").exit_code == 0  # idempotent
    result = cli(url, prefix, "status", "-N", "nobody")
    assert result.exit_code == 1 and "no election in namespace 'nobody'" in result.output

    backend = backend_from_url(url, table_prefix=prefix)
    # ttl 6: a leader starved for two seconds on a loaded machine keeps its term (at 3 it
    # lost it, and the commands below saw a new term); liveness 3: with the default 1 s
    # delta a starved lock thread missed its pings, and every renewal went out untagged
    e = Elector(backend, "cli", "the-leader", ttl=6, liveness=3.0)
    events = e.subscribe()
    try:
        e.start()
        assert e.wait_for_leadership(10)
        term = e.term
        deadline = time.monotonic() + 10
        while backend.current("cli").liveness_us is None:  # until it holds the lock
            assert time.monotonic() < deadline, "the leader never took the liveness lock"
            time.sleep(0.02)
        out = cli(url, prefix, "status", "-N", "cli", "--json")
        assert out.exit_code == 0, out.output
        info = json.loads(out.output)
        assert set(info) == {
            "namespace", "database", "leader", "term", "expires_in", "acquired_at", "candidates",
            "liveness", "pending_runs", "eligible_candidates",
        }  # fmt: skip
        assert info["pending_runs"] == []
        assert info["liveness"] == e.config.liveness  # the delta its trust is bound by
        assert info["leader"] == "the-leader" and info["term"] == term
        assert 0 < info["expires_in"] <= 6
        assert [c["candidate_id"] for c in info["candidates"]] == ["the-leader"]
        assert set(info["candidates"][0]) == {
            "candidate_id", "hostname", "pid", "heartbeat_age", "eligible", "release",
        }  # fmt: skip
        human = cli(url, prefix, "status", "-N", "cli")
        assert "leader      the-leader" in human.output and f"term        {term}" in human.output
        assert f"liveness    on: replaced about {e.config.liveness:g} s" in human.output
        listed = cli(url, prefix, "candidates", "-N", "cli", "--json")
        assert [c["pid"] for c in json.loads(listed.output)] == [os.getpid()]
        watched = cli(url, prefix, "watch", "-N", "cli", "--max-seconds", "0.5")
        assert watched.exit_code == 0 and "leader=the-leader" in watched.output
        resigned = cli(url, prefix, "resign", "-N", "cli")
        assert resigned.exit_code == 0 and f"resigned term {term}" in resigned.output
        # the resigned leader finds out at its next renewal, and re-elects with a new term
        elected = events.get(timeout=20)
        revoked = events.get(timeout=20)
        assert elected is not None and elected.kind == "elected" and elected.term == term
        assert revoked is not None and (revoked.kind, revoked.reason) == (
            "revoked",
            RevokeReason.LOST,
        )
        again = events.get(timeout=20)
        assert again is not None and again.kind == "elected" and again.term > term
    finally:
        e.stop()
        backend.close()

    assert cli(url, prefix, "uninstall").exit_code == 1  # asks, and no input: aborted
    result = cli(url, prefix, "uninstall", "--yes")
    assert result.exit_code == 0
    engine = sa.create_engine(url)
    assert not [t for t in sa.inspect(engine).get_table_names() if t.startswith(prefix)]
    engine.dispose()


def test_status_says_nobody_leads_because_no_eligible_candidate_lives(
    target: tuple[str, str],
) -> None:
    """``--no-election-eligible`` everywhere: no leader, and status says why, loudly."""
    url, prefix = target
    assert cli(url, prefix, "install").exit_code == 0
    backend = backend_from_url(url, table_prefix=prefix)
    e = Elector(backend, "idle", "the-idle", ttl=3, eligible=False)
    try:
        e.start()
        deadline = time.monotonic() + 10
        while not backend.candidates("idle"):  # registered at its first turn
            assert time.monotonic() < deadline, "the candidate never registered"
            time.sleep(0.02)
        info = json.loads(cli(url, prefix, "status", "-N", "idle", "--json").output)
        assert info["leader"] is None and info["eligible_candidates"] == 0
        assert [(c["candidate_id"], c["eligible"]) for c in info["candidates"]] == [
            ("the-idle", False)
        ]
        human = cli(url, prefix, "status", "-N", "idle").output
        assert "leader      none" in human and "no eligible candidate is live" in human
        assert "the-idle" in human and "ineligible" in human
        listed = cli(url, prefix, "candidates", "-N", "idle").output
        assert listed.strip().endswith("ineligible")
    finally:
        e.stop()
        backend.close()


def test_transfer_moves_leadership_to_the_named_node_and_refuses_in_one_line(
    target: tuple[str, str],
) -> None:
    url, prefix = target
    assert cli(url, prefix, "install").exit_code == 0
    backend = backend_from_url(url, table_prefix=prefix)
    # the hand-over waits for a renewal (0.5 s); the lease is long and without liveness, as
    # failover is not the subject: under load a 3 s lease lapsed (SQLite, a matrix cell),
    # and a starved liveness ping let b take over (MySQL, a loaded run)
    timings: dict[str, Any] = dict(ttl=30.0, renew_interval=0.5, liveness=False)
    a = Elector(backend, "mv", "w1@h:1:aa", **timings)
    b = Elector(backend, "mv", "w2@h:2:bb", **timings)
    idle = Elector(backend, "mv", "w3@h:3:cc", eligible=False, **timings)
    try:
        a.start()
        assert a.wait_for_leadership(10)
        b.start()
        idle.start()
        deadline = time.monotonic() + 10
        while len(backend.candidates("mv")) < 3:
            assert time.monotonic() < deadline, "the candidates never registered"
            time.sleep(0.02)
        refused = cli(url, prefix, "transfer", "w9@h", "-N", "mv")
        assert refused.exit_code == 1 and "no live candidate 'w9@h'" in refused.output
        refused = cli(url, prefix, "transfer", "w3@h", "-N", "mv")
        assert refused.exit_code == 1 and "'w3@h:3:cc' is not eligible to lead" in refused.output
        refused = cli(url, prefix, "transfer", "w1@h", "-N", "mv")
        assert refused.exit_code == 1 and "already leads" in refused.output
        assert a.is_leader
        moved = cli(url, prefix, "transfer", "w2@h", "-N", "mv")
        assert moved.exit_code == 0, moved.output
        assert "moved from w1@h:1:aa" in moved.output and "to w2@h:2:bb" in moved.output
        assert b.wait_for_leadership(10) and not a.is_leader
    finally:
        for e in (a, b, idle):
            e.stop()
        backend.close()


def test_status_all_lists_every_namespace(target: tuple[str, str]) -> None:
    """``status --all``: every election in the database, a worker's and a beat's alike."""
    url, prefix = target
    assert cli(url, prefix, "install").exit_code == 0
    empty = cli(url, prefix, "status", "--all")
    assert empty.exit_code == 0 and "no election has run" in empty.output
    assert json.loads(cli(url, prefix, "status", "--all", "--json").output) == []
    backend = backend_from_url(url, table_prefix=prefix)
    electors = [Elector(backend, ns, f"c-{ns}", ttl=3) for ns in ("jobs", "jobs-beat")]
    try:
        for e in electors:
            e.start()
        # a 3 s lease can lapse for a moment on a loaded machine (a late renewal) and be
        # taken again: look until both are led, as an operator would (bounded)
        deadline = time.monotonic() + 20
        while True:
            assert all(e.wait_for_leadership(10) for e in electors)
            terms = [e.term for e in electors]
            listed = cli(url, prefix, "status", "--all", "--json")
            assert listed.exit_code == 0, listed.output
            infos = json.loads(listed.output)
            if all(i["leader"] for i in infos) or time.monotonic() > deadline:
                break
        assert [i["namespace"] for i in infos] == ["jobs", "jobs-beat"]
        assert [i["leader"] for i in infos] == ["c-jobs", "c-jobs-beat"]
        assert [i["term"] for i in infos] == terms
        human = cli(url, prefix, "status", "--all").output
        assert "namespace   jobs  (" in human and "namespace   jobs-beat  (" in human
        both = cli(url, prefix, "status", "--all", "-N", "jobs")
        assert both.exit_code == 2 and "--all or --namespace" in both.output
    finally:
        for e in electors:
            e.stop()
        backend.close()


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("sqlite", ["CREATE TABLE {p}lease", "BIGINT"]),
        ("postgresql", ["CREATE TABLE {p}lease", "BIGINT", "VARCHAR(190)"]),
        ("mysql", ["CREATE TABLE {p}lease", "utf8mb4_bin", "ENGINE=InnoDB"]),
    ],
)
def test_dry_run_prints_the_ddl_of_the_dialect(kind: str, expected: list[str]) -> None:
    urls = {
        "sqlite": "sqlite:////tmp/never-created.db",
        "postgresql": "postgresql+psycopg://u@h/db",
        "mysql": "mysql+pymysql://u@h/db",
    }
    prefix = "ddl_"
    out = cli(urls[kind], prefix, "install", "--dry-run")
    assert out.exit_code == 0, out.output
    for fragment in expected:
        assert fragment.format(p=prefix) in out.output
    tables = ["meta", "lease", "candidate", "beat_run"]
    tables += [f"schedule_{t}" for t in ("entry", "rev", "audit", "term")]
    for table in tables:
        assert f"CREATE TABLE {prefix}{table}" in out.output
    drop = cli(urls[kind], prefix, "uninstall", "--dry-run")
    assert drop.exit_code == 0
    # every table uninstall drops, the 0.1 beat ledger's and 0.3's run history included
    for table in [*tables, "task_start", "beat_state", "beat_ledger", "schedule_run"]:
        assert f"DROP TABLE IF EXISTS {prefix}{table};" in drop.output, table
    assert not Path("/tmp/never-created.db").exists()  # a dry run touches nothing


def test_clear_errors() -> None:
    runner = CliRunner()
    no_url = runner.invoke(election, ["status"], env={"CELERY_ELECTION_URL": ""})
    assert no_url.exit_code == 2 and "--url" in no_url.output
    bad = runner.invoke(election, ["--url", "redis://localhost", "status"])
    assert bad.exit_code == 1 and "unsupported election database URL scheme" in bad.output
    down = runner.invoke(
        election, ["--url", "postgresql+psycopg://postgres@127.0.0.1:1/x", "status"]
    )
    assert down.exit_code == 1 and "127.0.0.1:1" in down.output


def test_celery_subcommand_reads_the_apps_settings(tmp_path: Path) -> None:
    prefix = unique_prefix()
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "E2E_ELECTION": f"sqlite:///{tmp_path}/e.db",
        "E2E_PREFIX": prefix,
        "E2E_NAMESPACE": "from-settings",
    }

    def celery(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "celery", "-A", "tests.e2e.proj", "election", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    assert "installed" in celery("install").stdout
    b = backend_from_url(f"sqlite:///{tmp_path}/e.db", table_prefix=prefix)
    with Elector(b, "from-settings", "via-app", ttl=30) as e:
        assert e.wait_for_leadership(10)
        out = celery("status", "--json")
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout)["leader"] == "via-app"
    b.close()


def test_status_shows_the_beat_runs_claimed_and_not_yet_sent(target: tuple[str, str]) -> None:
    """The run ledger, as an operator reads it: runs pending until the broker took them."""
    url, prefix = target
    assert cli(url, prefix, "install").exit_code == 0
    backend = backend_from_url(url, table_prefix=prefix)
    try:
        token = uuid.uuid4().hex
        lease = backend.elect(Bid("jobs-beat", token, "beat", 30.0)).lease
        assert lease is not None
        assert claim_run(backend.beat, "jobs-beat", token, lease.term, "report", None, 5,
                                      pending=True).won  # fmt: skip
        shown = cli(url, prefix, "status", "-N", "jobs-beat")
        assert shown.exit_code == 0, shown.output
        assert "pending     1 beat runs claimed and not yet sent" in shown.output
        assert "report" in shown.output
        info = json.loads(cli(url, prefix, "status", "-N", "jobs-beat", "--json").output)
        assert [(p["entry"], p["term"]) for p in info["pending_runs"]] == [("report", lease.term)]
        assert backend.runs.confirm("jobs-beat", [run_task_id("jobs-beat", "report", 5)]) == 1
        shown = cli(url, prefix, "status", "-N", "jobs-beat")
        assert "pending" not in shown.output
        assert (
            json.loads(cli(url, prefix, "status", "-N", "jobs-beat", "--json").output)[
                "pending_runs"
            ]
            == []
        )
    finally:
        backend.close()
