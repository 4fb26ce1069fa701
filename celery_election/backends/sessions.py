"""What a liveness session is, apart from how one is held (``locks.py``).

The elector imports this, not the sessions themselves: they need SQLAlchemy and a
driver, and ``import celery_election`` must load neither.
"""

from __future__ import annotations

from typing import Protocol

from ..errors import BackendUnavailableError

__all__ = ["KeySession", "LivenessSession", "LivenessUnsupported", "PooledSessions"]


class LivenessSession(Protocol):
    """One namespace's liveness lock on a connection of its own.

    Calls come from one thread (the elector's liveness thread); ``interrupt`` and
    ``close`` may come from any thread.
    """

    #: The server takes the lock from a holder that goes silent (PostgreSQL, MySQL): a
    #: paused leader's lock reaches a waiting follower. False for a file lock, which a
    #: stopped process keeps (there followers also read the lease once per lease).
    silent_holders_lose: bool

    @property
    def has_lock(self) -> bool:
        """Whether this session holds the lock (as far as it knows)."""

    def claim_slot(self, count: int) -> bool:
        """Hold one of ``count`` standby slots, without waiting; True if one is held.

        Only a slot's holder waits on the lock (a hot standby); a grant frees the slot
        for another candidate. Raises BackendUnavailableError as ``acquire`` does.
        """

    def acquire(self, timeout: float) -> bool:
        """Block until the lock is held (True) or ``timeout`` seconds pass (False).

        Raises BackendUnavailableError when the session is lost (then it reconnects on
        the next call) and InterruptedError when ``interrupt`` was called (during this
        wait or before it: an interrupt is consumed by the wait it ends).
        """

    def ping(self) -> None:
        """Show the server that the holder lives; raises BackendUnavailableError if lost."""

    def release(self) -> None:
        """Give the lock back (a lost session has given it back already)."""

    def interrupt(self) -> None:
        """Make a blocked ``acquire`` return now (from another thread)."""

    def close(self) -> None:
        """Release and disconnect (idempotent)."""


class KeySession(LivenessSession, Protocol):
    """A key holder's liveness lock (named by its token), and probes of other holders'.

    One per holder process: every key it holds hangs off this one lock, so a holder's
    death frees all its keys at once, on one connection.
    """

    def ended(self, key: bytes) -> bool:
        """Whether the session that held lock ``key`` has ended (its lock is free now).

        A holder locks its key before writing any row with its token and never again
        after losing it, so once free it stays free: the answer is final.
        """


class LivenessUnsupported(BackendUnavailableError):
    """The server cannot end a silent session by itself (PostgreSQL before 14)."""


class PooledSessions(LivenessUnsupported):
    """The URL leads to a transaction pooler: a session lock would be shared."""
