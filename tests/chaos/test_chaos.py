"""The fault matrix: (backend, fault) cells, each run by the driver, then the checker.

A run applies each of its faults once, in order, to the current leader (or, one time in
five, to a random process), waits for a leader again, and at the end checks the history
of every process: no two trusted leaders, terms only going up, no act outside its term's
window, no beat tick twice, none lost while one leader was trusted.

- The first tier runs the in-process backend's whole cycle.
- The second tier runs a seeded sample of the other cells, about three minutes
  (:func:`sample`): the seed is the UTC date, so each day draws other cells, and
  ``CELERY_ELECTION_CHAOS_SEED`` replays a day.
- The release tier (``scripts/release-check``) runs every cell, and the PgBouncer minutes.

``benchmarks/chaos.py`` runs the same driver at random for as long as you like.
"""

from __future__ import annotations

import datetime
import os
import random
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


def _injectable(
    backend: str, urls: dict[str, Any], faults: tuple[str, ...]
) -> tuple[tuple[str, ...], dict[str, str]]:
    """The faults this harness can inject here, and why it cannot inject the others."""
    cannot: dict[str, str] = {}
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


#: The README's command runs the in-process backend's cycle (no server, no process).
FIRST_TIER = {"memory"}
#: The second tier's share of the matrix, in seconds of the cost model below.
SAMPLE_SECONDS = 180.0
#: The cost model: starting a backend's processes (more with Celery workers and beats),
#: and one fault with its recovery. Measured: 11 faults on PostgreSQL with workers and
#: beats took 30 to 40 s.
START, WITH_CELERY, FAULT = 6.0, 8.0, 3.0
#: Today's seed (the UTC date), or the one to replay.
SEED = int(
    os.environ.get("CELERY_ELECTION_CHAOS_SEED")
    or datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d")
)


def _start_cost(backend: str) -> float:
    _electors, workers, beats, _seed = RUNS[backend]
    return WITH_CELERY if workers or beats else START


def sample(seed: int) -> dict[str, tuple[str, ...]]:
    """The cells the second tier runs for ``seed``: (backend, fault) pairs drawn at random
    until the cost model reaches :data:`SAMPLE_SECONDS`. A backend that is drawn suffers
    a kill too (its first fault), as every chaos run should: the crash is the failover."""
    cells = [(b, f) for b in RUNS if b not in FIRST_TIER for f in FAULTS[b] if f != "kill"]
    random.Random(seed).shuffle(cells)
    chosen: dict[str, set[str]] = {}
    spent = 0.0
    for backend, fault in cells:
        cost = FAULT if backend in chosen else _start_cost(backend) + 2 * FAULT
        if spent + cost > SAMPLE_SECONDS:
            continue
        spent += cost
        chosen.setdefault(backend, {"kill"}).add(fault)
    return {b: tuple(f for f in FAULTS[b] if f in chosen[b]) for b in RUNS if b in chosen}


def sample_cost(drawn: dict[str, tuple[str, ...]]) -> float:
    return sum(_start_cost(b) + FAULT * len(faults) for b, faults in drawn.items())


def _cells() -> list[Any]:
    """The memory cycle (first tier), today's sample (second tier), every cell (release)."""
    params = [pytest.param(b, FAULTS[b], id=b) for b in RUNS if b in FIRST_TIER]
    params += [
        pytest.param(b, faults, id=f"{b}-sample", marks=pytest.mark.tier2)
        for b, faults in sample(SEED).items()
    ]
    params += [
        pytest.param(b, FAULTS[b], id=b, marks=pytest.mark.release)
        for b in RUNS
        if b not in FIRST_TIER
    ]
    return params


@pytest.mark.parametrize(("backend", "drawn"), _cells())
def test_every_fault_once(backend: str, drawn: tuple[str, ...], tmp_path: Path) -> None:
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
    faults, cannot = _injectable(backend, urls, drawn)
    if cannot and REQUIRE:
        _not_injected(backend, cannot)  # fails before a run that cannot count
    settings = Settings(
        backend=backend, seed=seed, ttl=1.0, electors=electors, workers=workers, beats=beats,
        faults=faults, cycle=True, **urls,
    )  # fmt: skip
    report = make(settings, tmp_path).run(0)
    replay = f"CELERY_ELECTION_CHAOS_SEED={SEED} scripts/test -m tier2 -n 0 tests/chaos -k sample"
    detail = f"history and logs in {tmp_path} (replay: {replay}): {report.violations[:10]}"
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


#: The long PgBouncer runs (release tier; benchmarks/chaos.py for longer): minutes of
#: random faults per pooler set-up.
POOLER_MINUTES = float(os.environ.get("CELERY_ELECTION_POOLER_CHAOS_MINUTES", "3"))


@pytest.mark.release
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


@pytest.mark.parametrize("backend", ["memory", pytest.param("sqlite", marks=pytest.mark.release)])
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


def test_the_sample_fits_replays_and_covers_the_matrix_within_weeks() -> None:
    """The second tier's chaos sample: within its budget for any seed, the same cells for
    the same seed (a failure is replayed from the seed it prints), every drawn backend
    killed, and 20 days of samples draw every (backend, fault) cell of the matrix."""
    for seed in range(200):
        drawn = sample(seed)
        assert drawn and sample_cost(drawn) <= SAMPLE_SECONDS, (seed, drawn)
        assert sample(seed) == drawn
        for backend, faults in drawn.items():
            assert backend not in FIRST_TIER and "kill" in faults, (seed, drawn)
            assert set(faults) <= set(FAULTS[backend]), (seed, drawn)
    day = datetime.date(2026, 11, 1)
    seen = {
        (b, f)
        for n in range(20)
        for b, faults in sample(int((day + datetime.timedelta(n)).strftime("%Y%m%d"))).items()
        for f in faults
    }
    every = {(b, f) for b in RUNS if b not in FIRST_TIER for f in FAULTS[b]}
    assert seen == every, sorted(every - seen)
