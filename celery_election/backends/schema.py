"""The election's tables and the database clock, as SQLAlchemy Core objects.

Pure definitions, no I/O: ``make_metadata(prefix)`` gives the tables (also for an Alembic
env), ``db_now_us()`` the database's clock in epoch microseconds for each dialect
(docs/design.md, rule 2), ``greatest`` the portable GREATEST, and ``entry_key`` the hashed key
of a beat entry (any name fits a MySQL primary key, rule 9).

To add a dialect: teach ``db_now_us`` and ``greatest`` to compile for it, check the key
collation in ``key_type``, then its error codes in ``connection.classify``.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import mysql
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.functions import FunctionElement

from ..errors import ConfigurationError

__all__ = [
    "DEFAULT_TABLE_PREFIX",
    "db_now_us",
    "entry_key",
    "greatest",
    "key_type",
    "make_metadata",
    "validate_table_prefix",
]

DEFAULT_TABLE_PREFIX = "celery_election_"
_PREFIX = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,39}")
TOKEN_LENGTH = 32


def validate_table_prefix(table_prefix: object) -> str:
    """The prefix if it is 1-40 ASCII letters, digits and underscores; else one clear error."""
    if not isinstance(table_prefix, str) or not _PREFIX.fullmatch(table_prefix):
        raise ConfigurationError(
            f"table_prefix (election_table_prefix) must be 1-40 ASCII letters, digits "
            f"and underscores, starting with a letter: got {table_prefix!r}"
        )
    return table_prefix


# -- database clock -------------------------------------------------------------------------


class db_now_us(FunctionElement[int]):
    """The database's clock in epoch microseconds, fixed for the whole statement."""

    type = sa.BigInteger()
    inherit_cache = True


class greatest(FunctionElement[int]):
    """GREATEST(a, b); SQLite spells it max(a, b)."""

    type = sa.BigInteger()
    inherit_cache = True


def _unsupported(element: Any, compiler: SQLCompiler, **kw: Any) -> str:
    raise ConfigurationError(
        f"celery_election supports SQLite, PostgreSQL and MySQL/MariaDB, "
        f"not {compiler.dialect.name}"
    )


compiles(db_now_us)(_unsupported)

# PostgreSQL's now() is frozen at transaction start; statement_timestamp() is not.
compiles(db_now_us, "postgresql")(
    lambda e, c, **kw: "CAST(EXTRACT(EPOCH FROM statement_timestamp()) * 1000000 AS BIGINT)"
)
# UTC_TIMESTAMP ignores the session time zone; (6) keeps the microseconds.
_MYSQL_NOW_US = "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))"
compiles(db_now_us, "mysql")(lambda e, c, **kw: _MYSQL_NOW_US)
# SQLite's 'now' is the host clock, constant within one statement step.
compiles(db_now_us, "sqlite")(
    lambda e, c, **kw: "CAST((julianday('now') - 2440587.5) * 86400000000.0 AS INTEGER)"
)
compiles(greatest)(lambda e, c, **kw: f"GREATEST({c.process(e.clauses, **kw)})")
compiles(greatest, "sqlite")(lambda e, c, **kw: f"max({c.process(e.clauses, **kw)})")


# -- schema ---------------------------------------------------------------------------------


def key_type(length: int) -> sa.types.TypeEngine[str]:
    # MySQL's default collation folds case, accents and trailing spaces: 'prod', 'PROD '
    # and 'PRÖD' would be one namespace. Binary collation keeps them apart.
    return sa.String(length).with_variant(
        mysql.VARCHAR(length, charset="utf8mb4", collation="utf8mb4_bin"), "mysql", "mariadb"
    )


def make_metadata(table_prefix: str = DEFAULT_TABLE_PREFIX) -> sa.MetaData:
    """The election tables as SQLAlchemy ``MetaData``, e.g. for an Alembic env."""
    metadata = sa.MetaData()
    mysql_opts: dict[str, Any] = {"mysql_engine": "InnoDB", "mysql_charset": "utf8mb4"}
    sa.Table(
        f"{table_prefix}lease",
        metadata,
        sa.Column("namespace", key_type(190), primary_key=True),
        sa.Column("term", sa.BigInteger, nullable=False, default=0),
        sa.Column("token", key_type(TOKEN_LENGTH), nullable=True),
        sa.Column("leader_id", sa.String(255), nullable=True),
        sa.Column("acquired_at", sa.BigInteger, nullable=True),
        sa.Column("renewed_at", sa.BigInteger, nullable=True),
        sa.Column("expires_at", sa.BigInteger, nullable=False, default=0),
        # The holder's liveness delta (us) when its trust is bound by a liveness session
        # (backends/liveness.py): only such a term may be taken over before it expires.
        sa.Column("liveness_us", sa.BigInteger, nullable=True),
        **mysql_opts,
    )
    sa.Table(
        f"{table_prefix}candidate",
        metadata,
        sa.Column("namespace", key_type(190), primary_key=True),
        sa.Column("token", key_type(TOKEN_LENGTH), primary_key=True),
        sa.Column("candidate_id", sa.String(255), nullable=False),
        sa.Column("hostname", sa.String(255), nullable=False),
        sa.Column("pid", sa.Integer, nullable=False),
        sa.Column("registered_at", sa.BigInteger, nullable=False),
        sa.Column("heartbeat_at", sa.BigInteger, nullable=False),
        sa.Column("expires_at", sa.BigInteger, nullable=False),
        sa.Index(f"{table_prefix}candidate_expiry", "namespace", "expires_at"),
        **mysql_opts,
    )
    # Beat: one row per (namespace, entry), the entry's shared run state. A leader advances
    # it with a compare-and-set under its term before it sends (backends/sql_beat.py).
    sa.Table(
        f"{table_prefix}beat_run",
        metadata,
        sa.Column("namespace", key_type(190), primary_key=True),
        sa.Column("entry_key", key_type(40), primary_key=True),  # sha1 of the entry name
        sa.Column("entry_name", sa.String(500), nullable=False),
        sa.Column("last_run_at", sa.BigInteger, nullable=False),  # database clock, epoch us
        sa.Column("total_run_count", sa.BigInteger, nullable=False),
        sa.Column("term", sa.BigInteger, nullable=False),  # the term that claimed that run
        sa.Column("updated_at", sa.BigInteger, nullable=False),
        # Whose state it is (e.g. a PeriodicTask id): a re-created entry starts fresh.
        # Nullable: added to older tables by install(); NULL is any entry of that name.
        sa.Column("identity", sa.String(200), nullable=True),
        **mysql_opts,
    )
    _schedule_tables(metadata, table_prefix, mysql_opts)
    return metadata


def _schedule_tables(metadata: sa.MetaData, prefix: str, mysql_opts: dict[str, Any]) -> None:
    """The operable schedule (backends/sql_schedule.py): entries, their changes, runs, audit."""
    # One row per entry changed at runtime: a dynamic entry (task set), or an operator's
    # overlay on a static ``beat_schedule`` entry (task NULL: paused, run now, policies).
    sa.Table(
        f"{prefix}schedule_entry",
        metadata,
        sa.Column("namespace", key_type(190), primary_key=True),
        sa.Column("entry_key", key_type(40), primary_key=True),  # sha1 of the name
        sa.Column("name", sa.String(500), nullable=False),
        sa.Column("task", sa.String(255), nullable=True),
        sa.Column("spec", sa.Text, nullable=False),  # JSON: schedule, args, options, policies
        sa.Column("enabled", sa.Boolean, nullable=False),
        sa.Column("paused_at", sa.BigInteger, nullable=True),  # database clock, epoch us
        sa.Column("skip_before", sa.BigInteger, nullable=True),  # resumed skipping until
        sa.Column("run_now_at", sa.BigInteger, nullable=True),  # a pending "run now"
        sa.Column("deleted", sa.Boolean, nullable=False),
        sa.Column("version", sa.BigInteger, nullable=False),  # the change that wrote it
        sa.Column("created_at", sa.BigInteger, nullable=False),
        sa.Column("updated_at", sa.BigInteger, nullable=False),
        sa.Column("updated_by", sa.String(255), nullable=False),
        sa.Index(f"{prefix}schedule_entry_version", "namespace", "version"),
        **mysql_opts,
    )
    # The namespace's change counter: writers take its row lock, so versions commit in order.
    sa.Table(
        f"{prefix}schedule_rev",
        metadata,
        sa.Column("namespace", key_type(190), primary_key=True),
        sa.Column("version", sa.BigInteger, nullable=False),
        **mysql_opts,
    )
    serial = sa.BigInteger().with_variant(sa.Integer, "sqlite")  # SQLite: INTEGER PRIMARY KEY
    sa.Table(
        f"{prefix}schedule_run",
        metadata,
        sa.Column("id", serial, primary_key=True, autoincrement=True),
        sa.Column("namespace", key_type(190), nullable=False),
        sa.Column("entry_key", key_type(40), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),  # run / run_now / missed / skipped
        sa.Column("run_key", sa.BigInteger, nullable=False),  # the run state it follows
        sa.Column("term", sa.BigInteger, nullable=False),
        sa.Column("due_at", sa.BigInteger, nullable=True),
        sa.Column("sent_at", sa.BigInteger, nullable=False),
        sa.Column("task_id", sa.String(64), nullable=True),
        sa.Column("count", sa.Integer, nullable=False),  # runs a missed/skipped row stands for
        sa.Column("finished_at", sa.BigInteger, nullable=True),
        sa.Column("outcome", sa.String(16), nullable=True),
        sa.Column("duration_us", sa.BigInteger, nullable=True),
        sa.Index(f"{prefix}schedule_run_entry", "namespace", "entry_key", "id"),
        sa.Index(f"{prefix}schedule_run_task", "task_id"),
        sa.Index(f"{prefix}schedule_run_sent", "namespace", "sent_at"),
        **mysql_opts,
    )
    sa.Table(
        f"{prefix}schedule_audit",
        metadata,
        sa.Column("id", serial, primary_key=True, autoincrement=True),
        sa.Column("namespace", key_type(190), nullable=False),
        sa.Column("name", sa.String(500), nullable=False),
        sa.Column("action", sa.String(16), nullable=False),
        sa.Column("actor", sa.String(255), nullable=False),
        sa.Column("at", sa.BigInteger, nullable=False),
        sa.Column("detail", sa.Text, nullable=False),
        sa.Index(f"{prefix}schedule_audit_at", "namespace", "id"),
        **mysql_opts,
    )


def entry_key(name: str) -> str:
    """The key of a beat entry: a hash, so any name fits a MySQL primary key."""
    return hashlib.sha1(name.encode("utf-8")).hexdigest()
