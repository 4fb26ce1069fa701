"""PostgreSQL's ``Dialect`` (psycopg 3 or psycopg2); ``postgres.PostgresBackend`` adds NOTIFY."""

from __future__ import annotations

from typing import Any, ClassVar

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import URL, Connection, Engine

from ..errors import BackendUnavailableError
from . import connection
from .connection import Timeouts
from .dialect_base import Dialect, LockRequest
from .locks import LivenessSession, PostgresSession, pg_connector

__all__ = ["PostgreSQL"]


class PostgreSQL(Dialect):
    """PostgreSQL through psycopg 3 or psycopg2 (``postgres.PostgresBackend`` adds NOTIFY)."""

    name = "postgresql"
    # PostgreSQL's now() is frozen at transaction start; statement_timestamp() is not.
    clock_sql = "CAST(EXTRACT(EPOCH FROM statement_timestamp()) * 1000000 AS BIGINT)"
    deadline_hint = (
        " (behind PgBouncer, a pool too small for its clients makes calls "
        "wait like this: docs, Deployment topologies)"
    )
    contention: ClassVar[frozenset[str]] = frozenset({"40P01", "55P03", "40001", "23505", "57014"})
    missing: ClassVar[frozenset[str]] = frozenset({"42P01"})
    read_only: ClassVar[frozenset[str]] = frozenset({"25006"})  # a hot standby

    def normalise_url(self, url: URL) -> URL:
        """The libpq form ``?host=a:1,b:2`` as SQLAlchemy's repeated ``?host=a:1&host=b:2``.

        SQLAlchemy reads the comma form as one host name ("failed to resolve host"); the
        repeated form reaches libpq as its own multi-host list, with ``target_session_attrs``.
        """
        host = url.query.get("host")
        if not isinstance(host, str) or "," not in host:
            return url
        return url.update_query_dict({"host": tuple(h.strip() for h in host.split(","))})

    def engine_options(
        self, driver: str, timeouts: Timeouts
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        options, connect_args = super().engine_options(driver, timeouts)
        connect_args.update(
            connection.pg_connect_args(timeouts.connect, "celery-election", driver),
            tcp_user_timeout=int(timeouts.statement * 1000),
        )
        return options, connect_args

    def set_up_sessions(self, engine: Engine, statement_timeout: float) -> None:
        ms = int(statement_timeout * 1000)

        @sa.event.listens_for(engine, "connect")
        def _pg_connect(dbapi_conn: Any, record: Any) -> None:
            # Session settings, set once per connection in one statement (a SET LOCAL per
            # transaction would double the statement count, and a standby reconnects for
            # each look). Behind PgBouncer in transaction mode these may not stick; the
            # client-side call deadline still bounds every call. No JIT: the page's reads
            # (a UNION of 200 one-row index walks) cost nothing to run and 2.8 s to compile
            # (benchmarks/retention.py).
            with dbapi_conn.cursor() as cur:
                cur.execute(
                    "SELECT set_config('statement_timeout', %s, false),"
                    " set_config('lock_timeout', %s, false),"
                    " set_config('idle_in_transaction_session_timeout', %s, false),"
                    " set_config('jit', 'off', false)",
                    (str(ms), str(ms), str(ms * 2)),
                )
            dbapi_conn.commit()

    def driver_error(self, orig: BaseException | None) -> str | None:
        sqlstate = connection.sqlstate(orig)
        if sqlstate in self.contention:
            return "contention"
        if sqlstate in self.missing:
            return "missing"
        if sqlstate in self.read_only:
            return "read-only"
        return None

    def insert(self, table: sa.Table) -> Any:
        return postgresql.insert(table)

    def install_lock(self, conn: Connection, table_prefix: str, read_only: str) -> None:
        # Concurrent CREATE TABLE IF NOT EXISTS races on the catalog (docs/design.md,
        # rule 10): serialise installers on an advisory lock.
        if conn.execute(sa.select(sa.func.pg_is_in_recovery())).scalar():
            # CREATE ... IF NOT EXISTS of existing tables succeeds there
            raise BackendUnavailableError(read_only)
        key = sa.func.hashtext(f"celery_election:{table_prefix}")
        conn.execute(sa.select(sa.func.pg_advisory_xact_lock(key)))

    def liveness_session(self, lock: LockRequest) -> LivenessSession:
        url = lock.url
        connect = pg_connector(lock.engine, url, lock.connect_timeout, "celery-election-liveness")
        return PostgresSession(
            connect, lock.delta, url.render_as_string(hide_password=True), lock.key
        )
