"""SQLite's ``Dialect``: a file on this host, written under one lock; the host's clock."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import sqlalchemy as sa
from sqlalchemy.dialects import sqlite
from sqlalchemy.engine import URL, Connection, Engine

from ..errors import ConfigurationError
from . import connection
from .connection import Timeouts
from .dialect_base import Dialect, LockRequest
from .locks import FileSession, LivenessSession

__all__ = ["SQLite"]


class SQLite(Dialect):
    """SQLite: a file on this host, written under one lock; the host's clock."""

    name = "sqlite"
    # SQLite's 'now' is the host clock, constant within one statement step.
    clock_sql = "CAST((julianday('now') - 2440587.5) * 86400000000.0 AS INTEGER)"
    greatest_function = "max"
    # No ORDER BY in an aggregate before SQLite 3.44: the values come in the order of the
    # rows grouped (sorted by the subquery), which their reader checks (schedule/marks.py).
    concat_sql = "group_concat({value}, {separator})"
    in_process = True
    row_locks = False
    network_filesystems: ClassVar[frozenset[str]] = frozenset(
        {"nfs", "nfs4", "cifs", "smbfs", "smb3", "fuse.sshfs", "9p", "afs", "ceph"}
    )

    def engine_url(self, url: URL, *, allow_network_filesystem: bool) -> URL:
        database = url.database or ""
        is_uri = str(url.query.get("uri", "")).lower() in ("true", "1")
        in_memory = database in ("", ":memory:") or database.startswith("file::memory:")
        if in_memory or (is_uri and "mode=memory" in str(url)):
            raise ConfigurationError(
                "an in-memory SQLite database cannot be shared between processes or "
                "connections: give a file path (sqlite:////abs/path/election.db), or use "
                "MemoryBackend for in-process tests"
            )
        if is_uri:
            raise ConfigurationError(
                f"SQLite URI filenames (uri=true) are not supported for the election "
                f"database: give a plain path like sqlite:////abs/path/election.db, "
                f"got {url.render_as_string(hide_password=True)}"
            )
        path = Path(database).expanduser().resolve()
        fstype = connection.filesystem_type(path.parent)
        if fstype in self.network_filesystems and not allow_network_filesystem:
            raise ConfigurationError(
                f"SQLite election file {path} is on a network filesystem ({fstype}): its "
                f"locks are not reliable there. Use PostgreSQL or MySQL, or pass "
                f"allow_network_filesystem=True if you know its locking works"
            )
        return url.set(database=str(path))

    def engine_options(
        self, driver: str, timeouts: Timeouts
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        return {}, {"timeout": timeouts.sqlite_busy, "check_same_thread": False}

    def set_up_sessions(self, engine: Engine, statement_timeout: float) -> None:
        @sa.event.listens_for(engine, "connect")
        def _sqlite_connect(dbapi_conn: Any, record: Any) -> None:
            # Let SQLAlchemy's "begin" event issue BEGIN itself (pysqlite would defer it).
            dbapi_conn.isolation_level = None
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.close()

        @sa.event.listens_for(engine, "begin")
        def _sqlite_begin(conn: Connection) -> None:
            # Writers take the write lock at BEGIN, where the busy timeout waits for it,
            # instead of failing to upgrade a read lock midway.
            mode = "DEFERRED" if conn.get_execution_options().get("_election_read") else "IMMEDIATE"
            conn.exec_driver_sql(f"BEGIN {mode}")

    def transaction(self, engine: Engine) -> Any:
        return engine.begin()

    def atomic(self, conn: Connection) -> None:
        return None  # pysqlite's begin() is one already

    def driver_error(self, orig: BaseException | None) -> str | None:
        if not type(orig).__module__.startswith("sqlite3"):
            return None
        message = str(orig).lower()
        if "locked" in message or "busy" in message:
            return "contention"
        if "no such table" in message:
            return "missing"
        if not any(w in message for w in ("interrupt", "unable to open", "disk", "readonly")):
            return "other"  # a bad statement, not an unreachable file
        return None

    def insert(self, table: sa.Table) -> Any:
        return sqlite.insert(table)

    def liveness_session(self, lock: LockRequest) -> LivenessSession:
        db = Path(str(lock.engine.url.database))
        return FileSession(db.with_name(f"{db.name}.{lock.key.hex()[:16]}.lock"), lock.delta)
