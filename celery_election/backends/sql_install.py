"""The election's tables in a database: create (safe to race), upgrade, drop, show the DDL.

``install`` creates the missing tables in one transaction, under the dialect's lock
against concurrent DDL (``Dialect.install_lock``; docs/design.md, rule 10), then adds the
nullable columns and the indexes that tables made by an older version lack (and drops the
indexes a newer one replaced, ``schema.RETIRED_INDEXES``), and records what the tables
now are in the meta table (``schema.SCHEMA_VERSION``, ``schema.PROTOCOL``): tables made by
a newer release are refused before any DDL (``sql_calls.check_versions``), as every
backend's first write refuses them (``SQLCalls.call``). It retries a lost race, and says
"cannot reach" at once when the database is down. ``uninstall`` drops them; terms
stay increasing after a re-install (rule 4).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError
from sqlalchemy.schema import CreateIndex, CreateTable, DropIndex, DropTable

from ..core.runstate import DROPPED, ENDED, SENT
from ..errors import BackendUnavailableError
from .connection import one_line
from .schema import PROTOCOL, RETIRED_INDEXES, SCHEMA_VERSION
from .sql_calls import check_versions, read_versions

if TYPE_CHECKING:
    from .sql_host import SQLHost

__all__ = ["create_ddl", "drop_ddl", "install", "uninstall"]

log = logging.getLogger("celery_election.backends.sql")


def install(backend: SQLHost) -> list[str]:
    """Create the tables if missing; the names of those created. Safe to race."""
    last: Exception | None = None
    for _attempt in range(5):
        try:
            with backend.begin() as conn:
                backend.db.install_lock(conn, backend.table_prefix, backend.read_only_message())
                have = set(sa.inspect(conn).get_table_names())
                if backend.meta.name in have:
                    check_versions(read_versions(backend.meta, conn), backend.description)
                created = [t.name for t in backend.metadata.sorted_tables if t.name not in have]
                backend.metadata.create_all(conn, checkfirst=True)
                add_missing_columns(backend, conn)
                add_missing_indexes(backend, conn)
                if f"{backend.table_prefix}schedule_run" in have:
                    move_history(backend, conn)
                _record_versions(backend, conn)
            if created:
                log.info("created tables %s in %s", ", ".join(created), backend.description)
            return created
        except DBAPIError as exc:
            if backend.db.classify(exc) == "unavailable" and "connect" in str(exc).lower():
                raise BackendUnavailableError(
                    f"cannot reach election database {backend.description}: {one_line(exc)}"
                ) from (exc.orig or exc)
            last = exc
    raise BackendUnavailableError(
        f"could not create the election tables in {backend.description}: {last}"
    ) from last


def _record_versions(backend: SQLHost, conn: Connection) -> None:
    """Raise the recorded schema and protocol to this code's (never lower them)."""
    have = read_versions(backend.meta, conn)
    for name, value in (("schema", SCHEMA_VERSION), ("protocol", PROTOCOL)):
        if name not in have:
            conn.execute(sa.insert(backend.meta).values(name=name, value=value))
        elif have[name] < value:
            where = backend.meta.c.name == name
            conn.execute(sa.update(backend.meta).where(where).values(value=value))


def add_missing_columns(backend: SQLHost, conn: Connection) -> None:
    """Add the columns that tables made by an older version lack.

    ``lease.liveness_us``, ``beat_run.identity``,
    ``candidate.eligible`` and the run row's (``task_start.state`` ...): they are nullable,
    so electors, beats and workers of the older version still running are unaffected.
    """
    inspector = sa.inspect(conn)
    runs = backend.metadata.tables[f"{backend.table_prefix}task_start"]
    for table in (backend.lease, backend.beat_run, backend.candidate, runs):
        have = {c["name"] for c in inspector.get_columns(table.name)}
        for column in table.columns:
            if column.name not in have:
                type_ = column.type.compile(dialect=backend.engine.dialect)
                conn.exec_driver_sql(f"ALTER TABLE {table.name} ADD COLUMN {column.name} {type_}")


def add_missing_indexes(backend: SQLHost, conn: Connection) -> None:
    """Create the indexes that tables made by an older version lack; drop the retired ones.

    ``create_all`` skips a table that exists, indexes and all, so an index added to an
    existing table (``task_start_window``, which the timeline's query reads instead of
    the rows) reaches existing installations only here. Idempotent: by name, from what
    the database lists. On a large history, creating it takes a while and (PostgreSQL,
    SQLite) holds writes to that table meanwhile: once, at the upgrade's install.
    """
    inspector = sa.inspect(conn)
    for table in backend.metadata.sorted_tables:
        have = {i["name"] for i in inspector.get_indexes(table.name)}
        for index in table.indexes:
            if index.name not in have:
                index.create(conn)
                log.info("created index %s in %s", index.name, backend.description)
        short = table.name.removeprefix(backend.table_prefix)
        for retired in (f"{backend.table_prefix}{n}" for n in RETIRED_INDEXES.get(short, ())):
            if retired in have:  # on a stand-in table: MySQL's DROP INDEX names its table
                stand_in = sa.Table(table.name, sa.MetaData(), sa.Column("namespace", sa.String))
                conn.execute(DropIndex(sa.Index(retired, stand_in.c.namespace)))
                log.info("dropped index %s (replaced) in %s", retired, backend.description)


def move_history(backend: SQLHost, conn: Connection) -> None:
    """Move 0.2's and 0.3's run history (``schedule_run``) into the run rows; drop it.

    One INSERT ... SELECT, insert-if-absent (a row keyed ``history-<id>``: an install
    interrupted between it and the DROP moves nothing twice). A run that finished is
    ended, a missed or skipped one dropped, one still open is sent, as the rows of runs
    claimed now are; no worker's start matches these keys.
    """
    old = sa.Table(f"{backend.table_prefix}schedule_run", sa.MetaData(), autoload_with=conn)
    runs = backend.metadata.tables[f"{backend.table_prefix}task_start"]
    o = old.c
    state = sa.case((o.kind.in_(("missed", "skipped")), DROPPED),
                    (o.finished_at.is_not(None), ENDED), else_=SENT)  # fmt: skip
    columns = {
        "namespace": o.namespace, "run_key": sa.literal("history-") + sa.cast(o.id, sa.String(20)),
        "task_id": sa.func.coalesce(o.task_id, ""), "task_name": o.entry_key, "hostname": "",
        "pid": 0, "attempt": 0, "started_at": o.sent_at, "outcome": o.outcome,
        "finished_at": sa.case((o.kind.in_(("missed", "skipped")), o.sent_at),
                               else_=o.finished_at),
        "state": state, "term": o.term, "due": o.run_key, "entry_key": o.entry_key,
        "kind": o.kind, "due_at": o.due_at, "count": o.count,
        "began_at": o.finished_at - o.duration_us,
    }  # fmt: skip
    values = [v if isinstance(v, sa.ColumnElement) else sa.literal(v) for v in columns.values()]
    moved = sa.select(*values).where(o.id.is_not(None))  # SQLite: a WHERE before ON CONFLICT
    conn.execute(backend.db.insert_ignore(runs, from_select=(list(columns), moved)))
    old.drop(conn)
    log.info("moved the run history into %s in %s", runs.name, backend.description)


def _legacy(backend: SQLHost) -> list[sa.Table]:
    """0.1's beat ledger (now beat_run), 0.3's run history: uninstall drops them too."""
    legacy = sa.MetaData()
    names = ("beat_state", "beat_ledger", "schedule_run")
    return [sa.Table(f"{backend.table_prefix}{n}", legacy) for n in names]


def uninstall(backend: SQLHost) -> None:
    """Drop the tables if they exist. Terms stay increasing after a re-install."""
    with backend.begin() as conn:
        backend.metadata.drop_all(conn, checkfirst=True)
        for table in _legacy(backend):
            table.drop(conn, checkfirst=True)


def drop_ddl(backend: SQLHost) -> list[str]:
    """The DROP statements uninstall() runs, for this database's dialect (legacy ones too)."""
    return [
        str(DropTable(t, if_exists=True).compile(dialect=backend.engine.dialect)).strip()
        for t in [*reversed(backend.metadata.sorted_tables), *_legacy(backend)]
    ]


def create_ddl(backend: SQLHost) -> list[str]:
    """The CREATE statements install() would run, for this database's dialect."""
    dialect = backend.engine.dialect
    out = []
    for table in backend.metadata.sorted_tables:
        out.append(str(CreateTable(table).compile(dialect=dialect)).strip())
        for index in table.indexes:
            out.append(str(CreateIndex(index).compile(dialect=dialect)).strip())
    return out
