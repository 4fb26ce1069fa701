"""The candidates table on a SQL database: who runs for a namespace, and who may lead.

A candidate's row is its heartbeat (an upsert), listed while unexpired on the database
clock; the leader prunes the dead ones. ``eligible`` (``election_eligible``) is what the
operators' tools read (``celery election status``): an ineligible candidate takes part
and is listed, but its elector never takes a term (core/decisions.py, ``follower_call``).
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ..core.config import validate_candidate_id, validate_namespace
from ..core.lease import CandidateInfo, us
from ..errors import ConfigurationError
from .schema import TOKEN_LENGTH, db_now_us
from .sql_calls import Caller, rowcount
from .sql_host import SQLHost

__all__ = ["SQLCandidates", "check_token"]


class SQLCandidates(SQLHost):
    """The candidate steps of ``SQLBackend`` (sql.py), each one statement."""

    def register(
        self,
        namespace: str,
        token: str,
        candidate_id: str,
        hostname: str,
        pid: int,
        ttl: float,
        *,
        eligible: bool = True,
        release: str | None = None,
        timeout: float | None = None,
        connection: Caller | None = None,
    ) -> None:
        """Create or refresh this candidate's row (an upsert: also the heartbeat)."""
        validate_namespace(namespace)
        validate_candidate_id(candidate_id)
        check_token(token)
        c = self.candidate
        now = db_now_us()
        values = {
            "namespace": namespace,
            "token": token,
            "candidate_id": candidate_id,
            "hostname": hostname[:255],
            "pid": pid,
            "registered_at": now,
            "heartbeat_at": now,
            "expires_at": now + us(ttl),
            "eligible": eligible,
            "release": None if release is None else release[:64],
        }
        refresh = {
            "heartbeat_at": now,
            "expires_at": now + us(ttl),
            "eligible": eligible,
            "release": values["release"],
        }
        stmt = self.db.upsert(c, values, lambda new: refresh)
        # lost to contention: the next heartbeat refreshes it
        self.call_write(rowcount(stmt), table=c, lost=0, timeout=timeout, connection=connection)

    def unregister(
        self,
        namespace: str,
        token: str,
        *,
        timeout: float | None = None,
        connection: Caller | None = None,
    ) -> None:
        """Remove this candidate's row."""
        c = self.candidate
        stmt = sa.delete(c).where(c.c.namespace == namespace, c.c.token == token)
        self.call_write(rowcount(stmt), table=c, lost=0, timeout=timeout, connection=connection)

    def candidates(
        self, namespace: str, *, timeout: float | None = None, connection: Caller | None = None
    ) -> list[CandidateInfo]:
        """Candidates whose heartbeat has not expired on the database clock."""
        c = self.candidate
        stmt = (
            sa.select(c)
            .where(c.c.namespace == namespace, c.c.expires_at > db_now_us())
            .order_by(c.c.registered_at, c.c.token)
        )

        def work(conn: Connection) -> list[CandidateInfo]:
            return [
                CandidateInfo(
                    candidate_id=r.candidate_id,
                    hostname=r.hostname,
                    pid=int(r.pid),
                    heartbeat_at_us=int(r.heartbeat_at),
                    expires_at_us=int(r.expires_at),
                    token=r.token,
                    eligible=r.eligible is None or bool(r.eligible),  # NULL: an older row
                    release=r.release,
                )
                for r in conn.execute(stmt)
            ]

        return self.call(work, table=c, write=False, timeout=timeout, connection=connection)

    def prune(
        self, namespace: str, *, timeout: float | None = None, connection: Caller | None = None
    ) -> int:
        """Delete candidate rows whose heartbeat expired."""
        c = self.candidate
        stmt = sa.delete(c).where(c.c.namespace == namespace, c.c.expires_at <= db_now_us())
        return self.call_write(
            rowcount(stmt), table=c, lost=0, timeout=timeout, connection=connection
        )


def check_token(token: object) -> None:
    """Refuse a token that is not a 32-character string, before any statement."""
    if not isinstance(token, str) or len(token) != TOKEN_LENGTH:
        raise ConfigurationError(
            f"token must be a {TOKEN_LENGTH}-character string (uuid4().hex): got {token!r}"
        )
