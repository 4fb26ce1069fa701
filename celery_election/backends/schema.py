"""The election's tables and the database clock, as SQLAlchemy Core objects.

Pure definitions, no I/O: ``make_metadata(prefix)`` gives the tables (also for an Alembic
env), ``db_now_us()`` the database's clock in epoch microseconds for each dialect
(docs/design.md, rule 2), ``greatest`` the portable GREATEST, and ``entry_key`` the hashed key
of a beat entry (any name fits a MySQL primary key, rule 9). Each dialect's spelling of
the clock is its ``dialects.Dialect.clock_sql``; how to add a dialect: ``dialects.py``.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import mysql
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.functions import FunctionElement

from ..errors import ConfigurationError
from .dialect_base import Dialect
from .dialects import DIALECTS, unsupported

__all__ = [
    "DEFAULT_TABLE_PREFIX",
    "PROTOCOL",
    "RETIRED_INDEXES",
    "SCHEMA_VERSION",
    "db_now_us",
    "entry_key",
    "greatest",
    "key_type",
    "make_metadata",
    "ordered_concat",
    "validate_table_prefix",
]

DEFAULT_TABLE_PREFIX = "celery_election_"
#: The tables' layout this code reads and writes, recorded by ``install()`` in the meta
#: table. 1: the tables of 0.1.0 (no meta table); 2: 0.2.0 (+ meta, schedule_term,
#: schedule_run.due_at). Code refuses tables of a newer layout than its own.
SCHEMA_VERSION = 2
#: The election protocol this code speaks: the lease steps, the liveness lock's keys, the
#: beat's run claims. Processes of one database must share it (0.1.0 speaks 1 too): a
#: release that changes it records the new one at ``install()``, and older code refuses to
#: start against it instead of taking part in an election whose rules it does not know.
PROTOCOL = 1
#: Indexes an earlier build made that a newer index now covers, by table (without the
#: prefix): ``install()`` drops them. An index changes no row, so adding or dropping one
#: needs no schema version: code of either side reads the same tables.
RETIRED_INDEXES: dict[str, tuple[str, ...]] = {
    "task_start": ("task_start_at",),  # (namespace, started_at): task_start_window's head
}
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


class ordered_concat(FunctionElement[str]):
    """A group's values as one string, ordered by ``order``, joined by ``separator``.

    Each dialect's spelling is its ``Dialect.concat_sql``. SQLite's keeps the order of the
    rows grouped instead: sort them in a subquery, and check the order where it matters.
    """

    type = sa.String()
    inherit_cache = True

    def __init__(self, value: Any, order: Any, separator: str) -> None:
        if separator not in _SEPARATORS:
            raise ValueError(f"separator must be one of {sorted(_SEPARATORS)}: got {separator!r}")
        # a clause, not an attribute: part of the statement's cache key
        super().__init__(value, order, sa.literal_column(f"'{separator}'"))


_SEPARATORS = frozenset({"", ","})


def _unsupported(element: Any, compiler: SQLCompiler, **kw: Any) -> str:
    raise unsupported(compiler.dialect.name)


def _clock(sql: str) -> Callable[..., str]:
    return lambda element, compiler, **kw: sql


def _greatest(function: str) -> Callable[..., str]:
    return lambda element, compiler, **kw: f"{function}({compiler.process(element.clauses, **kw)})"


def _concat(sql: str) -> Callable[..., str]:
    def spell(element: ordered_concat, compiler: SQLCompiler, **kw: Any) -> str:
        value, order, separator = (compiler.process(c, **kw) for c in element.clauses)
        return sql.format(value=value, order=order, separator=separator)

    return spell


# Each dialect's spelling lives in dialects.py (docs/design.md, rule 2).
compiles(db_now_us)(_unsupported)
compiles(greatest)(_greatest(Dialect.greatest_function))
compiles(ordered_concat)(_concat(Dialect.concat_sql))
for _dialect in {d.name: d for d in DIALECTS.values()}.values():
    compiles(db_now_us, _dialect.name)(_clock(_dialect.clock_sql))
    compiles(greatest, _dialect.name)(_greatest(_dialect.greatest_function))
    compiles(ordered_concat, _dialect.name)(_concat(_dialect.concat_sql))


# -- schema ---------------------------------------------------------------------------------


def key_type(length: int) -> sa.types.TypeEngine[str]:
    # MySQL's default collation folds case, accents and trailing spaces: 'prod', 'PROD '
    # and 'PRÖD' would be one namespace. Binary collation keeps them apart.
    return sa.String(length).with_variant(
        mysql.VARCHAR(length, charset="utf8mb4", collation="utf8mb4_bin"), "mysql", "mariadb"
    )


def _table(metadata: sa.MetaData, name: str, *items: sa.schema.SchemaItem) -> sa.Table:
    """A table of ``metadata``, with every table's options on MySQL/MariaDB (ignored elsewhere)."""
    return sa.Table(name, metadata, *items, mysql_engine="InnoDB", mysql_charset="utf8mb4")


def _hold(holder: str) -> list[sa.Column[Any]]:
    """A hold's columns, the lease's and each key's (their steps: sql_lease.py)."""
    return [
        sa.Column("term", sa.BigInteger, nullable=False, default=0),
        sa.Column("token", key_type(TOKEN_LENGTH), nullable=True),
        sa.Column(holder, sa.String(255), nullable=True),
        sa.Column("acquired_at", sa.BigInteger, nullable=True),
        sa.Column("renewed_at", sa.BigInteger, nullable=True),
        sa.Column("expires_at", sa.BigInteger, nullable=False, default=0),
        # The holder's liveness delta (us) when its trust is bound by a liveness session
        # (backends/locks.py): only such a term may be taken over before it expires.
        sa.Column("liveness_us", sa.BigInteger, nullable=True),
    ]


def make_metadata(table_prefix: str = DEFAULT_TABLE_PREFIX) -> sa.MetaData:
    """The election tables as SQLAlchemy ``MetaData``, e.g. for an Alembic env.

    The lease and candidates (backends/sql.py), beat run state (sql_beat.py) and the
    operable schedule (schedule/store.py): entries, their changes, runs, audit, and the
    leadership history the schedule page draws.
    """
    metadata = sa.MetaData()
    for table in _TABLES:
        table(metadata, table_prefix)
    return metadata


def _serial() -> sa.types.TypeEngine[int]:
    return sa.BigInteger().with_variant(sa.Integer, "sqlite")  # SQLite: INTEGER PRIMARY KEY


def _lease(metadata: sa.MetaData, prefix: str) -> sa.Table:
    """One row per namespace: the lease (docs/design.md, the protocol)."""
    return _table(
        metadata,
        f"{prefix}lease",
        sa.Column("namespace", key_type(190), primary_key=True),
        *_hold("leader_id"),
        # An operator's request that the holder of this term hand it to the candidate
        # with this token (``celery election transfer``). Nullable: added by install().
        sa.Column("transfer_to", key_type(TOKEN_LENGTH), nullable=True),
    )


def _candidate(metadata: sa.MetaData, prefix: str) -> sa.Table:
    """One row per live candidate: its label and heartbeat."""
    return _table(
        metadata,
        f"{prefix}candidate",
        sa.Column("namespace", key_type(190), primary_key=True),
        sa.Column("token", key_type(TOKEN_LENGTH), primary_key=True),
        sa.Column("candidate_id", sa.String(255), nullable=False),
        sa.Column("hostname", sa.String(255), nullable=False),
        sa.Column("pid", sa.Integer, nullable=False),
        sa.Column("registered_at", sa.BigInteger, nullable=False),
        sa.Column("heartbeat_at", sa.BigInteger, nullable=False),
        sa.Column("expires_at", sa.BigInteger, nullable=False),
        # False: it never takes a term (``election_eligible``). Nullable: added to older
        # tables by install(); NULL (an older release's row) is eligible.
        sa.Column("eligible", sa.Boolean, nullable=True),
        # The release it runs (``election_release``): while a newer one lives, an older
        # one does not take a vacant term. NULL: a release that did not say (the oldest).
        sa.Column("release", sa.String(64), nullable=True),
        sa.Index(f"{prefix}candidate_expiry", "namespace", "expires_at"),
    )


def _beat_run(metadata: sa.MetaData, prefix: str) -> sa.Table:
    """Beat: one row per (namespace, entry), the entry's shared run state.

    A leader advances it with a compare-and-set under its term before it sends; the same
    transaction writes the run's row (``task_start``), which holds the entry's next claim
    until the broker accepted the run (backends/sql_beat.py).
    """
    return _table(
        metadata,
        f"{prefix}beat_run",
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
    )


def _schedule_entry(metadata: sa.MetaData, prefix: str) -> sa.Table:
    """One row per entry changed at runtime (schedule/store.py).

    A dynamic entry (task set), or an operator's overlay on a static ``beat_schedule``
    entry (task NULL: paused, run now, policies).
    """
    return _table(
        metadata,
        f"{prefix}schedule_entry",
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
    )


def _schedule_rev(metadata: sa.MetaData, prefix: str) -> sa.Table:
    """The namespace's change counter.

    Writers take its row lock, so versions commit in order.
    """
    return _table(
        metadata,
        f"{prefix}schedule_rev",
        sa.Column("namespace", key_type(190), primary_key=True),
        sa.Column("version", sa.BigInteger, nullable=False),
    )


def _schedule_audit(metadata: sa.MetaData, prefix: str) -> sa.Table:
    """Who changed which entry, how and when."""
    return _table(
        metadata,
        f"{prefix}schedule_audit",
        sa.Column("id", _serial(), primary_key=True, autoincrement=True),
        sa.Column("namespace", key_type(190), nullable=False),
        sa.Column("name", sa.String(500), nullable=False),
        sa.Column("action", sa.String(16), nullable=False),
        sa.Column("actor", sa.String(255), nullable=False),
        sa.Column("at", sa.BigInteger, nullable=False),
        sa.Column("detail", sa.Text, nullable=False),
        sa.Index(f"{prefix}schedule_audit_at", "namespace", "id"),
    )


def _schedule_term(metadata: sa.MetaData, prefix: str) -> sa.Table:
    """Leadership history: one row per term a beat led (beat/history.py writes it).

    Kept in the database so the schedule page shows who led when after its own restart.
    ``seen_at`` is the leader's last sign of life (moved about once a second), the end of
    a term that ended without a word (a crash); ``ended_at`` a clean end.
    """
    return _table(
        metadata,
        f"{prefix}schedule_term",
        sa.Column("namespace", key_type(190), primary_key=True),  # the election's namespace
        sa.Column("term", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("leader_id", sa.String(255), nullable=False),
        sa.Column("started_at", sa.BigInteger, nullable=False),  # database clock, epoch us
        sa.Column("seen_at", sa.BigInteger, nullable=False),
        sa.Column("ended_at", sa.BigInteger, nullable=True),
    )


def _key(metadata: sa.MetaData, prefix: str) -> sa.Table:
    """Key holds (singleton tasks): one row per key ever held, a lease of its own.

    Its term grows at every change of hands; its holder is a token whose liveness lock
    frees all the holder's keys at once (backends/sql_keys.py). Rows stay when released:
    the term never goes back.
    """
    return _table(
        metadata,
        f"{prefix}key",
        sa.Column("namespace", key_type(190), primary_key=True),
        sa.Column("key_hash", key_type(40), primary_key=True),  # sha1 of the key
        sa.Column("key", sa.String(500), nullable=False),
        *_hold("holder_id"),
        sa.Index(f"{prefix}key_holder", "namespace", "token"),
    )


def _task_start(metadata: sa.MetaData, prefix: str) -> sa.Table:
    """One row per run, its life as core/runstate.py's states (sql_runs.py).

    Named ``task_start`` as 0.2's start records were: 0.2 workers in a rolling upgrade
    insert-if-absent into the same rows, so a run delivered to an old and a new worker
    still runs once. The columns after ``outcome`` are 0.3's (nullable: ``install()``
    adds them to 0.2's table; a 0.2 row reads as started, or ended once finished).
    """
    return _table(
        metadata,
        f"{prefix}task_start",
        sa.Column("namespace", key_type(190), primary_key=True),
        sa.Column("run_key", key_type(40), primary_key=True),  # sha1 of "<task id>/<retries>"
        sa.Column("task_id", sa.String(255), nullable=False),
        sa.Column("task_name", sa.String(255), nullable=False),
        sa.Column("hostname", sa.String(255), nullable=False),  # its last starter's
        sa.Column("pid", sa.Integer, nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),  # bodies started (> 1: acks_late)
        sa.Column("started_at", sa.BigInteger, nullable=False),  # written first; db clock, us
        sa.Column("finished_at", sa.BigInteger, nullable=True),
        sa.Column("outcome", sa.String(16), nullable=True),
        sa.Column("state", sa.String(8), nullable=True),  # runstate's; NULL: a 0.2 row
        sa.Column("delivery", sa.String(32), nullable=True),  # the try that started it
        sa.Column("worker", sa.String(64), nullable=True),  # its liveness session's token
        sa.Column("acks_late", sa.Boolean, nullable=True),
        sa.Column("term", sa.BigInteger, nullable=True),  # the beat term that owes it
        sa.Column("entry_name", sa.String(500), nullable=True),  # a beat run's entry
        sa.Column("due", sa.BigInteger, nullable=True),  # a beat run's key in its entry
        # a beat run's history (the schedule's page, overlap policy, overdue alarm):
        sa.Column("entry_key", key_type(40), nullable=True),  # schema.entry_key(entry_name)
        sa.Column("kind", sa.String(16), nullable=True),  # run / run_now / missed / skipped
        sa.Column("due_at", sa.BigInteger, nullable=True),  # when it fell due; db clock, us
        sa.Column("count", sa.Integer, nullable=True),  # runs a missed/skipped row stands for
        sa.Column("began_at", sa.BigInteger, nullable=True),  # its body's start; db clock, us
        sa.Index(f"{prefix}task_start_task", "task_id"),
        sa.Index(f"{prefix}task_start_entry", "namespace", "entry_key", "started_at"),
        # The window's runs, the prune's range, and all the timeline's grouping reads of
        # them (covering: that query never visits the rows). It replaced (namespace,
        # started_at): RETIRED_INDEXES.
        sa.Index(
            f"{prefix}task_start_window",
            "namespace",
            "started_at",
            "entry_key",
            "kind",
            "due_at",
            "outcome",
            "state",
        ),
        # the runs still on their way (claimed, sent, started) are read by state: few of
        # many, whatever the retention keeps
        sa.Index(f"{prefix}task_start_state", "namespace", "state"),
    )


def _meta(metadata: sa.MetaData, prefix: str) -> sa.Table:
    """What the tables are: ``schema`` (their layout) and ``protocol`` (what peers speak)."""
    return _table(
        metadata,
        f"{prefix}meta",
        sa.Column("name", key_type(64), primary_key=True),
        sa.Column("value", sa.BigInteger, nullable=False),
    )


_TABLES: list[Callable[[sa.MetaData, str], sa.Table]] = [
    _meta,
    _lease,
    _candidate,
    _beat_run,
    _schedule_entry,
    _schedule_rev,
    _schedule_audit,
    _schedule_term,
    _key,
    _task_start,
]


def entry_key(name: str) -> str:
    """The key of a beat entry: a hash, so any name fits a MySQL primary key."""
    return hashlib.sha1(name.encode("utf-8")).hexdigest()
