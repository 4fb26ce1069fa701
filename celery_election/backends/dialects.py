"""What differs between the databases, owned in one place: one small object per dialect.

SQLAlchemy compiles the statements; a ``Dialect`` holds the rest, and the backend picks
one, once, from its URL (``dialect_for``). Nothing else branches on the database's name.

* the engine: URL checks and forms, connect arguments and pool options, the session
  set-up run on each new connection (timeouts, SQLite's WAL and BEGIN IMMEDIATE; rules 8
  and 11 of docs/design.md);
* the clock: ``clock_sql`` and ``greatest_function``, compiled for ``schema.db_now_us``
  and ``schema.greatest`` (rule 2);
* errors: the driver's codes for "lost this round", "table missing", "read-only
  standby" (rule 1, rule 13): ``classify``;
* statements: insert-ignore, insert-if-absent, upsert, DELETE of at most n rows, and
  whether ``SELECT ... FOR UPDATE`` applies;
* the shape of a lease step (``StepStyle``):

  - ``RETURNING`` (SQLite): the conditional UPDATE returns the row it changed;
  - ``ROWCOUNT`` (MySQL/MariaDB, no UPDATE ... RETURNING): the step reports whether it
    matched, and the row after it is read with a second statement;
  - PostgreSQL (``postgres.NotifyStyle``): one statement that updates, returns the row
    whether the step won or lost, and sends NOTIFY to the other candidates;

* ``install()``'s lock against concurrent DDL (rule 10) and the liveness session
  (``locks.py``: advisory lock, GET_LOCK, a lock file).

To add a dialect (the one list of what it takes):

1. subclass ``Dialect`` (``dialect_base.py``) in a module of its own, as
   ``dialect_sqlite.py``, ``dialect_postgresql.py`` and ``dialect_mysql.py`` do: ``name``
   (SQLAlchemy's), ``clock_sql`` (epoch microseconds on the database's clock, fixed for
   the statement), ``greatest_function``, the engine options and session set-up,
   ``driver_error`` (its driver's error codes), the statements that are not portable
   (``insert``, ``ignoring``, ``insert_if_absent``, ``upsert``, ``delete_at_most``),
   ``install_lock`` and ``liveness_session``; add it to ``DIALECTS`` here;
2. check the key collation in ``schema.key_type`` (keys must compare byte for byte,
   rule 9);
3. name its URL scheme and driver in ``backends/__init__.py`` and run it through
   ``tests/integration/test_backend_suite.py``.
"""

from __future__ import annotations

from ..errors import ConfigurationError
from .dialect_base import RETURNING, ROWCOUNT, Dialect, StepStyle
from .dialect_mysql import FOUND_ROWS, MySQL, without_found_rows
from .dialect_postgresql import PostgreSQL
from .dialect_sqlite import SQLite

__all__ = [
    "DIALECTS",
    "FOUND_ROWS",
    "RETURNING",
    "ROWCOUNT",
    "Dialect",
    "MySQL",
    "PostgreSQL",
    "SQLite",
    "StepStyle",
    "dialect_for",
    "unsupported",
    "without_found_rows",
]


#: Every dialect, by the names SQLAlchemy gives it.
_MYSQL = MySQL()
DIALECTS: dict[str, Dialect] = {
    "sqlite": SQLite(),
    "postgresql": PostgreSQL(),
    "mysql": _MYSQL,
    "mariadb": _MYSQL,
}


def dialect_for(name: str) -> Dialect:
    """The dialect SQLAlchemy calls ``name`` (a URL's backend name, ``engine.dialect.name``)."""
    try:
        return DIALECTS[name]
    except KeyError:
        raise unsupported(name) from None


def unsupported(name: str) -> ConfigurationError:
    return ConfigurationError(
        f"celery_election supports SQLite, PostgreSQL and MySQL/MariaDB, not {name}"
    )
