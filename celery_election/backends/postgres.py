"""PostgreSQL: the SQL backend, plus LISTEN/NOTIFY wakeups (issue 3 adds them)."""

from __future__ import annotations

from .sql import SQLBackend

__all__ = ["PostgresBackend"]


class PostgresBackend(SQLBackend):
    """SQLBackend on PostgreSQL through psycopg 3."""
