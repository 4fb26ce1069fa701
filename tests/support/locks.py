"""What the server shows of the election's liveness locks (PostgreSQL, MySQL/MariaDB)."""

from __future__ import annotations

import sqlalchemy as sa

from celery_election.backends.locks import lock_key


def waiting_on_lock(url: str, prefix: str, namespace: str) -> bool:
    """The server shows a session waiting for ``namespace``'s liveness lock.

    SQLite's lock is a file lock polled every 5 ms: nothing to see there (True).
    """
    if url.startswith("sqlite"):
        return True
    key = lock_key(prefix, namespace)
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            if engine.dialect.name == "postgresql":
                # a bigint key is kept as (classid, objid): its high and low 32 bits
                k = int.from_bytes(key[:8], "big", signed=True)
                sql = (
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
                    " AND classid::bigint = :hi AND objid::bigint = :lo"
                )
                args = {"hi": (k >> 32) & 0xFFFFFFFF, "lo": k & 0xFFFFFFFF}
                return bool(conn.execute(sa.text(sql), args).scalar())
            sql = (
                "SELECT count(*) FROM information_schema.processlist"
                " WHERE state = 'User lock' AND info LIKE :pattern"
            )
            name = "celery_election:" + key.hex()[:40]
            return bool(conn.execute(sa.text(sql), {"pattern": f"%{name}%"}).scalar())
    finally:
        engine.dispose()
