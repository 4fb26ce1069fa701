from __future__ import annotations

import json
import logging
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from celery_election.backends import MemoryBackend, SQLBackend, backend_from_url
from celery_election.backends.base import RunClaim, RunRequest, RunState
from celery_election.core.clock import FakeClock

from .services import REQUIRE, Services, discover

_services: Services | None = None
ROOT = Path(__file__).resolve().parents[1]


def services() -> Services:
    global _services
    if _services is None:
        _services = discover()
    return _services


#: What a test that runs in the working tree instead of tmp would leave there.
_LEFTOVERS = ("*.sqlite3", "*.db", "celerybeat-schedule*")
_before: set[Path] = set()


def _leftovers() -> set[Path]:
    return {p for where in {Path.cwd(), ROOT} for g in _LEFTOVERS for p in where.glob(g)}


#: Tests that start Celery workers and beats share RabbitMQ's node and queue names: under
#: pytest-xdist (scripts/test runs two workers) they run one at a time on one worker, and
#: so do the second tier's, which restart the servers everyone uses.
SERIAL = (
    "tests/e2e/",
    "tests/chaos/",
    "tests/integration/test_examples.py",
    "tests/integration/test_more_examples.py",
)
#: Where the scenarios that left the first tier run now (node-id prefix -> tier marker).
#: Each is proven once in the first tier on the stack where it matters; these are its
#: other stacks, long variants and slow corners. docs/testing.md lists the same table.
ELSEWHERE: dict[str, str] = {
    # -- the second tier: about ten minutes beside the chaos sample and the beat's faults
    # The beat's forked publisher; the demo's `worker -B --election` stays in the first.
    "tests/e2e/test_beat_election.py::test_an_embedded_beat_forks": "tier2",
    "tests/e2e/test_beat_election.py::test_a_run_sent_again_while_its_first_copy": "tier2",
    "tests/e2e/test_example_demo.py": "tier2",
    # Run once: the prefork redelivery and the acks_late kill stay; the other pools and
    # the skip's count on /metrics.
    "tests/e2e/test_run_once.py::test_a_redelivered_finished_run_is_skipped_and_counted[threads]": (
        "tier2"
    ),
    "tests/e2e/test_run_once.py::test_a_redelivered_finished_run_is_skipped_and_counted[solo]": (
        "tier2"
    ),
    "tests/e2e/test_run_once.py::test_a_redelivered_finished_run_is_skipped_and_counted[gevent]": (
        "tier2"
    ),
    "tests/e2e/test_run_once.py::test_the_skip_is_counted_on_metrics": "tier2",
    # Prometheus (a real server), tracing through a SIGKILL, a transfer: real processes.
    "tests/e2e/test_prometheus.py": "tier2",
    "tests/e2e/test_tracing.py::test_each_beat_run_is_one_trace": "tier2",
    "tests/e2e/test_transfer_workers.py::test_a_transfer_to_a_named_worker_with_no_overlap_and_each_beat_run_once[postgresql]": (  # noqa: E501
        "tier2"
    ),
    # -- the release tier (scripts/release-check): other stacks, drivers and layouts,
    # upgrades, the wheel, and the longer operator scenarios
    "tests/e2e/test_worker_election.py::test_worker_election_scenario[sqla+sqlite]": "release",
    "tests/e2e/test_eligible_workers.py": "release",
    "tests/e2e/test_beat_election.py::test_three_standalone_beats_with_publishers": "release",
    "tests/e2e/test_beat_election.py::test_three_workers_with_embedded_beat": "release",
    "tests/e2e/test_demo.py::test_ctrl_c_in_the_middle_stops_every_process": "release",
    "tests/e2e/test_demo.py::test_killing_the_demo_takes_its_workers_with_it": "release",
    # Layouts: the Django `CELERY_` one stays in the first tier.
    "tests/e2e/test_layouts.py::test_one_election_per_deployment[conf+include]": "release",
    "tests/e2e/test_layouts.py::test_one_election_per_deployment[envvar+imports]": "release",
    "tests/e2e/test_layouts.py::test_one_election_per_deployment[module+autodiscover]": "release",
    "tests/e2e/test_metrics.py": "release",
    "tests/e2e/test_routing.py": "release",
    "tests/e2e/test_tracing.py::test_a_publisher_process": "release",
    "tests/e2e/test_tracing.py::test_a_run_the_next_leader_recovers": "release",
    "tests/e2e/test_transfer_workers.py::test_a_transfer_to_a_named_worker_with_no_overlap_and_each_beat_run_once[mysql]": (  # noqa: E501
        "release"
    ),
    "tests/e2e/test_packaging.py": "release",
    "tests/e2e/test_pools.py": "release",
    "tests/e2e/test_worker_drivers.py": "release",
    "tests/e2e/test_release_upgrade.py": "release",
    "tests/e2e/test_upgrade.py": "release",
    "tests/e2e/test_django_admin_real.py": "release",
    "tests/e2e/test_schedule_ops.py": "release",
    "tests/e2e/test_overdue_page.py": "release",
    # Singleton keys: the first tier keeps the kill on PostgreSQL, the second the pause.
    "tests/e2e/test_singleton_workers.py::test_each_key_runs_alone_every_task_once_and_a_killed_holder_is_replaced[mysql]": (  # noqa: E501
        "release"
    ),
    "tests/e2e/test_singleton_workers.py::test_each_key_runs_alone_every_task_once_and_a_killed_holder_is_replaced[sqlite]": (  # noqa: E501
        "release"
    ),
    "tests/e2e/test_singleton_workers.py::test_a_paused_holders_key_is_taken_and_it_finds_its_term_superseded[mysql]": (  # noqa: E501
        "release"
    ),
    "tests/e2e/test_singleton_workers.py::test_a_paused_holders_key_is_taken_and_it_finds_its_term_superseded[sqlite]": (  # noqa: E501
        "release"
    ),
    "tests/e2e/test_singleton_workers.py::test_one_waiting_runs_the_running_one": "release",
    "tests/integration/test_pg_replica.py::test_promoting_the_standby[sync-lease]": "release",
    "tests/integration/test_pg_replica.py::test_promoting_the_standby[async-lease]": "release",
    # [0.0] failed once in CI's second tier (2026-11-29): after the restart a follower's
    # lock session dropped ("the lease alone bounds trust now") and the crash was replaced
    # through the lease. Its cause is not found yet: it waits in the release tier, named
    # in the issue, until it is fixed.
    "tests/integration/test_pg_replica.py::test_after_a_restart_a_crash_is_replaced_through_the_lock[0.0]": (  # noqa: E501
        "release"
    ),
    "tests/integration/test_pg_replica.py::test_after_a_restart_a_crash_is_replaced_through_the_lock[5.0]": (  # noqa: E501
        "release"
    ),
    "tests/integration/test_pg_replica.py::test_after_a_restart_a_crash_is_replaced_through_the_lock[15.0]": (  # noqa: E501
        "release"
    ),
    # (its SQLite run stays in the second tier: the only one that deletes and re-creates)
    "tests/integration/test_schedule_beat.py::test_an_entry_added_edited_paused_resumed_and_removed_at_runtime[postgresql]": (  # noqa: E501
        "release"
    ),
    # -- the version matrix's cells (the floor and the newest), not scripts/test: what a
    # Celery, Django or Python version can break
    "tests/conformance/": "matrix",
    "tests/integration/test_django_workflows.py": "matrix",
    "tests/integration/test_green.py": "matrix",
    "tests/integration/test_cli_schedule.py": "matrix",
    "tests/integration/test_more_examples.py": "matrix",
}
#: What the xdist workers could not reach (the controller prints it once).
_missing_on_workers: dict[str, str] = {}


def _is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


@pytest.hookimpl(tryfirst=True)  # before xdist's, which reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        for prefix, tier in ELSEWHERE.items():
            if item.nodeid.startswith(prefix):
                item.add_marker(getattr(pytest.mark, tier))
        if item.get_closest_marker("tier2") is not None or item.get_closest_marker("release"):
            item.add_marker(pytest.mark.xdist_group("tier2"))
        elif item.nodeid.startswith(SERIAL):
            item.add_marker(pytest.mark.xdist_group("processes"))


def pytest_sessionstart(session: pytest.Session) -> None:
    _before.update(_leftovers())


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _services is not None:
        _services.close()
    if _is_worker(session.config):  # the controller checks the tree once all are done
        missing = {} if _services is None else _services.missing
        session.config.workeroutput["missing"] = json.dumps(missing)  # type: ignore[attr-defined]
        return
    new = sorted(_leftovers() - _before)
    if new:  # a default file in the working tree: the next run would inherit its state
        print(f"\nFAILED: the tests wrote into the working tree: {', '.join(map(str, new))}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """An xdist worker is done: keep what it could not reach, for the summary."""
    _missing_on_workers.update(json.loads(getattr(node, "workeroutput", {}).get("missing", "{}")))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    missing = {**_missing_on_workers, **({} if _services is None else _services.missing)}
    if missing:
        terminalreporter.write_sep("!", "SERVER TESTS SKIPPED", red=True, bold=True)
        for name, why in missing.items():
            terminalreporter.write_line(f"  {name} unreachable ({why})", red=True)


def server_url(name: str) -> str:
    """The URL of a real server, or skip (fail under CELERY_ELECTION_REQUIRE_SERVICES=1)."""
    url = services().urls.get(name)
    if url is None:
        why = services().missing.get(name, "not configured")
        if REQUIRE:
            pytest.fail(f"{name} is required (CELERY_ELECTION_REQUIRE_SERVICES=1): {why}")
        pytest.skip(f"{name} unreachable: {why}")
    return url


def tool(path: str, hint: str) -> str:
    """An installed program, or skip loudly (fail under CELERY_ELECTION_REQUIRE_SERVICES=1)."""
    import shutil

    found = shutil.which(path)
    if found is None:
        why = f"{path} is missing ({hint})"
        services().missing[os.path.basename(path)] = why
        if REQUIRE:
            pytest.fail(f"{path} is required (CELERY_ELECTION_REQUIRE_SERVICES=1): {why}")
        pytest.skip(why)
    return found


@pytest.fixture
def pg_url() -> str:
    return server_url("postgresql")


@pytest.fixture
def mysql_url() -> str:
    return server_url("mysql")


def unique_prefix() -> str:
    return f"t{uuid.uuid4().hex[:10]}_"


@pytest.fixture
def table_prefix() -> str:
    return unique_prefix()


SQL_KINDS = ["sqlite", "postgresql", "mysql"]
ALL_KINDS = ["memory", *SQL_KINDS]
#: The servers through their other drivers (psycopg2, mysqlclient): the backend suite and
#: the files that prove each feature run them too (``every_backend``, ``every_sql_url``).
PG_DRIVERS = ["postgresql", "postgresql+psycopg2"]
MYSQL_DRIVERS = ["mysql", "mysql+mysqldb"]
EVERY_SQL = ["sqlite", *PG_DRIVERS, *MYSQL_DRIVERS]
EVERY_KIND = ["memory", *EVERY_SQL]
#: The servers' second drivers: the backend suites run them in the first tier, the
#: scenarios above the backend (``one_driver_each``) before a release.
SECOND_DRIVERS = ("postgresql+psycopg2", "mysql+mysqldb")


def one_driver_each(kinds: list[str]) -> list[Any]:
    """``kinds`` as parameters, the second drivers in the release tier."""
    return [pytest.param(k, marks=pytest.mark.release) if k in SECOND_DRIVERS else k for k in kinds]


def url_for(kind: str, tmp_path: Any) -> str:
    if kind == "sqlite":
        return f"sqlite:///{tmp_path}/election.db"
    return server_url(kind)


@pytest.fixture
def fake_clock() -> FakeClock:
    return FakeClock()


def make_backend(kind: str, tmp_path: Any) -> Iterator[Any]:
    """A backend of ``kind``, installed under a unique table prefix and dropped afterwards."""
    if kind == "memory":
        yield MemoryBackend()
        return
    b = backend_from_url(url_for(kind, tmp_path), table_prefix=unique_prefix())
    assert isinstance(b, SQLBackend)
    b.install()
    try:
        yield b
    finally:
        b.uninstall()
        b.close()


@pytest.fixture(params=ALL_KINDS)
def backend(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[Any]:
    """Each backend once, installed under a unique table prefix and dropped afterwards."""
    yield from make_backend(request.param, tmp_path)


@pytest.fixture(params=SQL_KINDS)
def sql_url(request: pytest.FixtureRequest, tmp_path: Any) -> str:
    return url_for(request.param, tmp_path)


def token() -> str:
    return uuid.uuid4().hex


def claim_run(
    store: Any,
    ns: str,
    token: str,
    term: int,
    name: str,
    expected: RunState | None,
    at: int,
    **request: Any,
) -> RunClaim:
    """One entry's claim: a batch of one (``BeatStore.claim_runs``)."""
    return store.claim_runs(ns, token, term, [RunRequest(name, expected, at, **request)])[0]


def expire(backend: Any, namespace: str, key: str = "") -> None:
    """End the lease (``key`` "") or a key's hold now, as if its ttl had passed (the DB
    clock is not ours to move)."""
    if isinstance(backend, MemoryBackend):
        if not key:
            backend.expire(namespace)
            return
        with backend.keys._lock:
            row = backend.keys._rows[(namespace, key)]
            row.expires_at = min(row.expires_at, backend.clock.wall_us())
        return
    import sqlalchemy as sa

    from celery_election.backends.sql import db_now_us
    from celery_election.core.keys import key_hash

    t = backend.key_hold if key else backend.lease
    where = [t.c.namespace == namespace, *([t.c.key_hash == key_hash(key)] if key else [])]
    with backend.engine.begin() as conn:
        conn.execute(sa.update(t).where(*where).values(expires_at=db_now_us() - 1))


def expire_candidates(backend: Any, namespace: str) -> None:
    if isinstance(backend, MemoryBackend):
        with backend._lock:
            for key, c in list(backend._candidates.items()):
                if key[0] == namespace:
                    from dataclasses import replace

                    backend._candidates[key] = replace(c, expires_at_us=c.heartbeat_at_us)
        return
    import sqlalchemy as sa

    from celery_election.backends.sql import db_now_us

    t = backend.candidate
    with backend.engine.begin() as conn:
        conn.execute(
            sa.update(t).where(t.c.namespace == namespace).values(expires_at=db_now_us() - 1)
        )


os.environ.setdefault("HYPOTHESIS_PROFILE", "default")


@pytest.fixture(autouse=True)
def _celery_app_restored() -> Iterator[None]:
    """Celery's current and default app as they were before the test.

    ``Celery()`` makes itself current unless told otherwise, and shared tasks (every
    ``@leader_task`` in the test kit's tests) run on the current app: without this, a test
    that made an app whose result backend is ``db+postgresql://u@pg/db`` handed it to
    whichever test ran next in that xdist worker (CI saw the kit's ``apply()`` try host pg).
    """
    from celery import _state

    current, default = getattr(_state._tls, "current_app", None), _state.default_app
    yield
    _state._tls.current_app = current
    _state.default_app = default


@pytest.fixture(autouse=True)
def _root_log_level_restored() -> Iterator[None]:
    """The root logger's level as it was before the test.

    Celery's in-process worker (``start_worker``: the testing kit's and the run-once
    tests) sets it to ERROR and leaves it there: the next test in that xdist worker lost
    the WARNING it asserts (tests/integration/test_overdue.py saw no warning at all).
    """
    root = logging.getLogger()
    level = root.level
    yield
    root.setLevel(level)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: Any) -> Any:
    """Keep each phase's report on the item, so fixtures can tell that the test failed."""
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report


def failed(request: pytest.FixtureRequest) -> bool:
    report = getattr(request.node, "rep_call", None)
    return report is None or report.failed


def by_entry(pending: list[Any]) -> dict[str, Any]:
    """Pending runs (``BeatStore.pending_runs``) by entry name: the scheduled ones."""
    return {p.entry_name: p for p in pending if not p.run_now}
