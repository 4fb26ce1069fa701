"""The tables record their layout and protocol; newer ones are refused before any write.

A rolling upgrade has two releases in one set of tables for minutes: ``install()``
upgrades older tables in place and records ``schema`` and ``protocol`` in the meta table;
code older than what is recorded stops with one line before it writes anything (at its
``install()`` or at its backend's first write), instead of electing by rules it does not
know. (The mixed-release run itself is tests/e2e/test_upgrade.py.)
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from celery_election import backend_from_url
from celery_election.backends import SQLBackend
from celery_election.backends.schema import PROTOCOL, SCHEMA_VERSION, entry_key
from celery_election.core.lease import Bid
from celery_election.errors import IncompatibleSchemaError
from celery_election.schedule.marks import run_mark
from celery_election.schedule.store import schedule_store

from ..conftest import unique_prefix, url_for
from ..support.history import run_row


@pytest.fixture(params=["sqlite", "postgresql", "mysql"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SQLBackend]:
    b = backend_from_url(url_for(request.param, tmp_path), table_prefix=unique_prefix())
    assert isinstance(b, SQLBackend)
    try:
        yield b
    finally:
        b.uninstall()
        b.close()


def _versions(b: SQLBackend) -> dict[str, int]:
    with b.engine.connect() as conn:
        return {r.name: r.value for r in conn.execute(sa.select(b.meta))}


def _set(b: SQLBackend, name: str, value: int) -> None:
    with b.engine.begin() as conn:
        conn.execute(sa.update(b.meta).where(b.meta.c.name == name).values(value=value))


def test_install_records_the_schema_and_protocol(backend: SQLBackend) -> None:
    backend.install()
    assert _versions(backend) == {"schema": SCHEMA_VERSION, "protocol": PROTOCOL}
    backend.install()  # idempotent
    assert _versions(backend) == {"schema": SCHEMA_VERSION, "protocol": PROTOCOL}


def test_install_upgrades_tables_of_the_previous_release(backend: SQLBackend) -> None:
    """0.1.0's tables: no meta table, no leadership history: added, versions recorded."""
    backend.install()
    history = backend.metadata.tables[f"{backend.table_prefix}schedule_term"]
    with backend.engine.begin() as conn:
        backend.meta.drop(conn)
        history.drop(conn)
    assert backend.elect(Bid("ns", "a" * 32, "old", 10.0)).won  # 0.1.0's tables still elect
    created = backend.install()
    assert set(created) == {backend.meta.name, history.name}
    assert _versions(backend) == {"schema": SCHEMA_VERSION, "protocol": PROTOCOL}
    lease = backend.current("ns")
    assert lease is not None and lease.held  # the upgrade kept the row


def test_install_adds_the_eligible_column_and_older_rows_read_as_eligible(
    backend: SQLBackend,
) -> None:
    """Candidate rows of 0.1.0 (no ``eligible`` column): install adds it, NULL is eligible."""
    backend.install()
    c = backend.candidate
    with backend.engine.begin() as conn:
        conn.exec_driver_sql(f"ALTER TABLE {c.name} DROP COLUMN eligible")
    old = sa.Table(
        c.name, sa.MetaData(), *(col._copy() for col in c.columns if col.name != "eligible")
    )
    with backend.engine.begin() as conn:
        conn.execute(
            sa.insert(old).values(
                namespace="ns", token="o" * 32, candidate_id="old", hostname="h", pid=1,
                registered_at=0, heartbeat_at=0, expires_at=2**62,
            )
        )  # fmt: skip
    backend.install()
    [listed] = backend.candidates("ns")
    assert (listed.candidate_id, listed.eligible) == ("old", True)


def test_install_gives_older_run_rows_the_timelines_index(backend: SQLBackend) -> None:
    """Run rows made before ``task_start_window``: install() creates the index, drops the
    (namespace, started_at) one it replaced, keeps the rows, and does it once."""
    backend.install()
    run, prefix = schedule_store(backend).run, backend.table_prefix
    on = f" ON {run.name}" if backend.engine.dialect.name in ("mysql", "mariadb") else ""
    with backend.engine.begin() as conn:  # the run rows as the earlier build made them
        conn.exec_driver_sql(f"DROP INDEX {prefix}task_start_window{on}")
        conn.exec_driver_sql(f"CREATE INDEX {prefix}task_start_at ON {run.name} "
                             f"(namespace, started_at)")  # fmt: skip
        conn.execute(sa.insert(run), [run_row("ns", "job", due=1, sent_at=10, due_at=10)])

    def indexes() -> set[str]:
        return {i["name"] for i in sa.inspect(backend.engine).get_indexes(run.name)}

    now = {f"{prefix}task_start_{n}" for n in ("task", "entry", "window", "state")}
    assert f"{prefix}task_start_window" not in indexes()
    assert backend.install() == []  # no table created: an index added, one dropped
    assert indexes() == now
    assert backend.install() == []  # idempotent
    assert indexes() == now
    assert [r.sent_at for r in schedule_store(backend).history(["ns"], "job")] == [10]


def test_install_moves_0_3s_run_history_into_the_run_rows(backend: SQLBackend) -> None:
    """0.3's ``schedule_run``: its runs become run rows (ended, open or dropped, as they
    were), the table goes, and a second install moves nothing again."""
    backend.install()
    old = sa.Table(
        f"{backend.table_prefix}schedule_run", sa.MetaData(),
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("namespace", sa.String(190), nullable=False),
        sa.Column("entry_key", sa.String(40), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("run_key", sa.BigInteger, nullable=False),
        sa.Column("term", sa.BigInteger, nullable=False),
        sa.Column("due_at", sa.BigInteger, nullable=True),
        sa.Column("sent_at", sa.BigInteger, nullable=False),
        sa.Column("task_id", sa.String(64), nullable=True),
        sa.Column("count", sa.Integer, nullable=False),
        sa.Column("finished_at", sa.BigInteger, nullable=True),
        sa.Column("outcome", sa.String(16), nullable=True),
        sa.Column("duration_us", sa.BigInteger, nullable=True),
    )  # fmt: skip
    key = entry_key("job")
    row = {"namespace": "ns", "entry_key": key, "term": 4, "due_at": None, "task_id": None,
           "count": 1, "finished_at": None, "outcome": None, "duration_us": None}  # fmt: skip
    with backend.engine.begin() as conn:
        old.create(conn)
        conn.execute(sa.insert(old), [
            {**row, "kind": "run", "run_key": 1, "sent_at": 10, "due_at": 9, "task_id": "a",
             "finished_at": 30, "outcome": "FAILURE", "duration_us": 15},
            {**row, "kind": "missed", "run_key": 2, "sent_at": 40, "count": 3},
            {**row, "kind": "run_now", "run_key": 3, "sent_at": 50, "task_id": "b"},
        ])  # fmt: skip
    assert backend.install() == []
    runs = schedule_store(backend).history(["ns"], "job")
    assert [(r.kind, r.sent_at, r.task_id, r.status, r.count, run_mark(r)) for r in runs] == [
        ("run_now", 50, "b", "queued", 1, "run-now"),
        ("missed", 40, None, None, 3, "missed"),
        ("run", 10, "a", "FAILURE", 1, "failed"),
    ]
    assert (runs[2].due_at, runs[2].finished_at, runs[2].duration_us, runs[2].term) == (
        9,
        30,
        15,
        4,
    )
    assert old.name not in sa.inspect(backend.engine).get_table_names()
    assert backend.install() == []  # nothing to move: the same rows
    assert schedule_store(backend).history(["ns"], "job") == runs


@pytest.mark.parametrize(
    ("name", "says"),
    [("schema", "schema version"), ("protocol", "election protocol")],
)
def test_newer_tables_are_refused_before_anything_is_written(
    backend: SQLBackend, name: str, says: str
) -> None:
    backend.install()
    newer = {"schema": SCHEMA_VERSION, "protocol": PROTOCOL}[name] + 1
    _set(backend, name, newer)
    # a process of this release starting now: its first write is refused
    fresh = backend_from_url(str(backend.engine.url.render_as_string(hide_password=False)),
                             table_prefix=backend.table_prefix)  # fmt: skip
    try:
        with pytest.raises(IncompatibleSchemaError, match=f"{says} {newer}") as info:
            fresh.elect(Bid("ns", "b" * 32, "new", 10.0))
        assert "upgrade celery-election on this host" in str(info.value)
        assert "\n" not in str(info.value)  # one line
        assert fresh.current("ns") is None  # nothing was written
        # and its install() neither downgrades nor creates anything
        history = backend.metadata.tables[f"{backend.table_prefix}schedule_term"]
        with backend.engine.begin() as conn:
            history.drop(conn)
        with pytest.raises(IncompatibleSchemaError):
            fresh.install()
        assert _versions(backend)[name] == newer
        assert history.name not in sa.inspect(backend.engine).get_table_names()
    finally:
        fresh.close()
