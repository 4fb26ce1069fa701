"""The fault matrix, short: every fault kind once per backend, fixed seeds, then the checker.

Each run applies each of its backend's faults once, in order, to the current leader (or,
one time in five, to a random process), waits for a leader again, and at the end checks
the history of every process: no two trusted leaders, terms only going up, no act outside
its term's window, no beat tick twice, none lost while one leader was trusted.
``benchmarks/chaos.py`` runs the same driver at random for as long as you like.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from celery_election import Elector
from harness.chaos.driver import FAULTS, Settings, make
from harness.chaos.faults import FAKETIME_LIB, restart_unsupported
from harness.checker import load

from ..conftest import server_url
from ..services import REQUIRE

pytestmark = pytest.mark.timeout(600)

# backend: (electors, workers, beats, seed)
RUNS = {
    "memory": (3, 0, 0, 101),
    "sqlite": (2, 0, 2, 102),
    "pg-notify": (2, 2, 2, 103),
    "pg-poll": (3, 0, 0, 104),
    "mariadb": (2, 2, 1, 105),
    "pgbouncer-tx": (3, 0, 0, 106),
    "pgbouncer-tx-direct": (3, 0, 0, 107),
    "pgbouncer-session": (3, 0, 0, 108),
}


def _injectable(backend: str, urls: dict[str, Any]) -> tuple[tuple[str, ...], dict[str, str]]:
    """The faults this harness can inject here, and why it cannot inject the others."""
    cannot: dict[str, str] = {}
    faults = FAULTS[backend]
    if "skew" in faults and not FAKETIME_LIB.exists():
        cannot["skew"] = f"{FAKETIME_LIB} is missing (scripts/services-up installs faketime)"
    if "restart" in faults:
        url = urls.get("pg_url") or urls.get("mysql_url")
        why = restart_unsupported(url) if url else "no database server"
        if why is not None:
            cannot["restart"] = f"cannot restart {url}: {why}"
    return tuple(f for f in faults if f not in cannot), cannot


def _not_injected(backend: str, cannot: dict[str, str]) -> None:
    """A fault the harness could not inject: loudly skipped, or a failure in CI."""
    why = "; ".join(f"{fault}: {reason}" for fault, reason in sorted(cannot.items()))
    message = f"chaos {backend}: faults not injected: {why}"
    if REQUIRE:
        pytest.fail(f"{message} (CELERY_ELECTION_REQUIRE_SERVICES=1)")
    pytest.skip(message)


#: The fault cycles over real servers run in the second tier (30-40 s each): the README's
#: command keeps the in-process and SQLite ones.
FIRST_TIER = {"memory", "sqlite"}


@pytest.mark.parametrize(
    "backend",
    [b if b in FIRST_TIER else pytest.param(b, marks=pytest.mark.tier2) for b in RUNS],
)
def test_every_fault_once(backend: str, tmp_path: Path) -> None:
    electors, workers, beats, seed = RUNS[backend]
    urls: dict[str, Any] = {}
    if backend.startswith("pg"):
        urls["pg_url"] = server_url("postgresql")
    if backend.startswith("pgbouncer-tx"):
        urls["pgbouncer_tx_url"] = server_url("pgbouncer-transaction")
    if backend == "pgbouncer-session":
        urls["pgbouncer_session_url"] = server_url("pgbouncer-session")
    if backend == "mariadb":
        urls["mysql_url"] = server_url("mysql")
    if workers or beats:
        urls["amqp_url"] = server_url("amqp")
    faults, cannot = _injectable(backend, urls)
    if cannot and REQUIRE:
        _not_injected(backend, cannot)  # fails before a run that cannot count
    settings = Settings(
        backend=backend, seed=seed, ttl=1.0, electors=electors, workers=workers, beats=beats,
        faults=faults, cycle=True, **urls,
    )  # fmt: skip
    report = make(settings, tmp_path).run(0)
    detail = f"history and logs in {tmp_path}: {report.violations[:10]}"
    assert report.ok, detail
    assert set(report.faults) == set(faults), detail
    records = load([tmp_path / "history.jsonl"])
    acted = {r.get("what") for r in records if r["k"] == "act"}
    assert "act" in acted, detail  # bare electors acted as leaders
    if workers:
        assert "leader_task" in acted, detail  # beat -> leader queue -> the leader worker
    if beats:
        assert report.sends > 0, detail
    assert report.leaderships >= 2  # leadership changed hands at least once
    # A fault whose injection failed during the run (recorded, the run went on) was not
    # injected either: the run passed without it.
    for error in report.harness_errors:
        fault, _, message = error.partition(": ")
        cannot[fault] = f"{cannot[fault]}; {message}" if fault in cannot else message
    if cannot:
        _not_injected(backend, cannot)


class Careless(Elector):
    """A broken elector: once elected, it believes it leads until it is elected again."""

    _believed: int | None = None

    @property
    def term(self) -> int | None:
        current = super().term
        if current is not None:
            self._believed = current
        return self._believed


def test_the_checker_catches_an_elector_that_ignores_its_trust_window(tmp_path: Path) -> None:
    """The same run with a broken elector must fail: the harness is not vacuous."""
    settings = Settings(backend="memory", seed=7, ttl=1.0, faults=("pause",) * 3, cycle=True,
                        elector=Careless)  # fmt: skip
    report = make(settings, tmp_path).run(0)
    assert not report.ok
    assert any("while term" in v for v in report.violations), report.violations[:5]


#: The long PgBouncer runs (second tier): minutes of random faults per pooler set-up.
POOLER_MINUTES = float(os.environ.get("CELERY_ELECTION_POOLER_CHAOS_MINUTES", "3"))


@pytest.mark.tier2
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("backend", ["pgbouncer-tx", "pgbouncer-tx-direct", "pgbouncer-session"])
def test_minutes_of_faults_behind_pgbouncer(backend: str, tmp_path: Path) -> None:
    """Three electors through PgBouncer, SIGKILL / SIGSTOP / resign / every server session
    terminated, at random for minutes (ttl 5 s, liveness delta 1 s): no two trusted
    leaders, a leader again after every fault (the driver records a violation if none
    comes within 30 ttl), and with election_direct_url a crash replaced through the lock."""
    urls: dict[str, Any] = {"pg_url": server_url("postgresql")}
    if backend.startswith("pgbouncer-tx"):
        urls["pgbouncer_tx_url"] = server_url("pgbouncer-transaction")
    else:
        urls["pgbouncer_session_url"] = server_url("pgbouncer-session")
    settings = Settings(backend=backend, seed=206, ttl=5.0, electors=3, **urls)
    report = make(settings, tmp_path).run(POOLER_MINUTES * 60)
    detail = f"history and logs in {tmp_path}: {report.violations[:10]}"
    assert report.ok and report.overlap_seconds == 0, detail
    assert report.faults.get("kill", 0) >= 1, detail
    kills = sorted(report.failover.get("kill", []))
    print(f"{backend}: faults {dict(report.faults)}, kill failover {kills}")
    if backend != "pgbouncer-tx" and kills:  # the lock (through the pooler: the lease)
        # A leader killed within milliseconds of its election, before its term is bound
        # by the lock, is replaced when its lease ends: the median shows the lock's work.
        assert kills[len(kills) // 2] < 2.5, detail


@pytest.mark.parametrize("backend", ["memory", pytest.param("sqlite", marks=pytest.mark.tier2)])
def test_an_ineligible_elector_never_appears_in_any_term(backend: str, tmp_path: Path) -> None:
    """Every fault once, one of three electors ineligible: it is faulted like the others
    (one time in five the target is random) and never believes it leads (the judge adds
    a violation for any trust interval of a candidate that recorded itself ineligible)."""
    settings = Settings(
        backend=backend, seed=145, ttl=1.0, electors=3, ineligible=1,
        faults=FAULTS[backend], cycle=True,
    )  # fmt: skip
    report = make(settings, tmp_path).run(0)
    detail = f"history and logs in {tmp_path}: {report.violations[:10]}"
    assert report.ok, detail
    records = load([tmp_path / "history.jsonl"])
    ineligible = {r["cand"] for r in records if r["k"] == "ineligible"}
    assert ineligible, detail  # it ran, and said so
    assert report.leaderships >= 2, detail  # the eligible ones changed hands
