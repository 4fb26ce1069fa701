"""Liveness sessions: a lock per namespace whose holder's death the database reports.

The lease alone makes followers wait out a whole lease after a crash, because a follower
cannot tell a dead leader from a paused or cut-off one. A liveness session can: the leader
holds a session-scoped lock on a connection of its own and pings it every ``delta / 4``;
the server ends a session that stays silent for ``delta`` (PostgreSQL
``idle_session_timeout``, MySQL/MariaDB ``wait_timeout``), and a dead process's socket
closes at once, so the lock is released after a crash at once and after a pause, a
stalled link or a partition about ``delta`` after the last ping. Followers block on the
lock (no statements while they wait) and a granted follower may take the next term
``delta`` after its grant, because by then the old leader's trust, bounded by its last
good ping + delta, has ended. ``core/decisions.py`` holds the rules and ``election/lock_thread.py``
holds and pings a session; this module only makes and holds the locks.

Three kinds, one protocol (``LivenessSession``):

* PostgreSQL: ``pg_advisory_lock(key)`` with ``lock_timeout`` bounding a wait.
* MySQL/MariaDB: ``GET_LOCK(name, seconds)``; ``wait_timeout`` is in whole seconds, so the
  server ends a silent session after ``ceil(delta)``.
* SQLite: ``flock`` on a file beside the database. The kernel drops it when the process
  dies; nothing ends a paused holder's lock, so there a pause is survived by the lease
  alone, as without liveness (followers keep looking at the lease while they wait).

A session is made by ``backend.liveness_session(namespace, delta, max_wait)`` (which
kind: the backend's ``Dialect.liveness_session``); None means the backend cannot hold
one (an old server, a pooler): the elector then runs the lease protocol alone.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import math
import os
import random
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.config import MAX_STANDBYS
from ..errors import BackendUnavailableError
from . import green
from .connection import WATCHDOG, interrupt, one_line, pg_connect_args, sqlstate
from .sessions import LivenessSession, LivenessUnsupported, PooledSessions

if TYPE_CHECKING:
    from sqlalchemy.engine import URL, Engine

__all__ = [
    "FileSession",
    "LivenessSession",
    "LivenessUnsupported",
    "MySQLSession",
    "PooledSessions",
    "PostgresSession",
    "lock_key",
    "pg_connector",
    "sessions_pinned",
]

log = logging.getLogger(__name__)


def lock_key(table_prefix: str, namespace: str) -> bytes:
    """The lock's identity: the table prefix and the namespace, hashed (any length fits)."""
    return hashlib.sha1(f"celery_election:{table_prefix}:{namespace}".encode()).digest()


#: Standby slots a session can name (``ElectionConfig.standbys`` is at most this).
MAX_SLOTS = MAX_STANDBYS


def slot_key(key: bytes, slot: int) -> bytes:
    """Standby slot ``slot``'s identity, derived from the lock's."""
    return hashlib.sha1(b"slot:%d:" % slot + key).digest()


_TIMED_OUT = object()

#: How long a URL's "sessions are pinned" verdict is reused (the LISTEN probe's period).
PROBE_EVERY = 60.0
#: How old a verdict a cold standby's slot try may use: a slot bounds nobody's trust, and
#: a try every fallback_interval would otherwise probe (two sessions, 12 statements) at
#: nearly every try.
SLOT_PROBE_EVERY = 600.0


class _DBSession:
    """A DBAPI connection of its own, reconnected after a loss, locked per namespace.

    A subclass spells its server's session lock: ``TRY`` (a try that is true when the lock
    is taken, without waiting), ``UNLOCK`` and ``FALSE`` (its false), each with a ``%s``
    for the lock's name (``lock_name``, from a key).
    """

    silent_holders_lose = True  # idle_session_timeout / wait_timeout
    TRY: str
    UNLOCK: str
    FALSE: str

    def __init__(self, connect: Callable[[], Any], delta: float, description: str, key: bytes):
        self._connect = connect
        self.delta = delta
        self.description = description
        self.key = self.lock_name(key)
        self._slot_keys = [self.lock_name(slot_key(key, n)) for n in range(MAX_SLOTS)]
        self._conn: Any = None
        self._held = False
        self._slot: int | None = None  # the standby slot held, if any
        self._interrupted = False
        self._mutex = threading.Lock()

    @property
    def has_lock(self) -> bool:
        return self._held

    def claim_slot(self, count: int) -> bool:
        with self._mutex:
            if self._slot is None:
                # A cold standby's try: a verdict on the URL up to SLOT_PROBE_EVERY old
                # will do (a slot decides nobody's trust); the wait that follows a slot
                # re-checks a verdict older than PROBE_EVERY first (``acquire``).
                self._connection(probe_age=SLOT_PROBE_EVERY)
                if self._try_slots(random.sample(range(count), count)):
                    return True
                self._drop()  # no slot: hold no connection until the next try
            return self._slot is not None

    @staticmethod
    def lock_name(key: bytes) -> Any:
        """The server's name for the lock ``key``."""
        raise NotImplementedError

    def _try_slots(self, order: list[int]) -> bool:
        """Try the slots in ``order`` in one statement; True if one is held (``_slot``)."""
        # CASE evaluates its conditions in order and stops at the first true one, so at
        # most one slot is taken, in one statement.
        whens = " ".join(f"WHEN {self.TRY} THEN {n}" for n in order)
        self._slot = self._execute(
            f"SELECT CASE {whens} END", tuple(self._slot_keys[n] for n in order)
        )
        return self._slot is not None

    def _free_slot(self) -> None:
        """After a grant: the slot goes to another candidate (the session keeps the lock)."""
        slot, self._slot = self._slot, None
        if slot is not None:
            self._execute(f"SELECT {self.UNLOCK}", (self._slot_keys[slot],))

    def ended(self, key: bytes) -> bool:
        """Whether lock ``key``'s holder session ended: a try that is undone at once."""
        other = self.lock_name(key)
        sql = f"SELECT CASE WHEN {self.TRY} THEN {self.UNLOCK} ELSE {self.FALSE} END"
        with self._mutex:
            return bool(self._execute(sql, (other, other)))

    def _connection(self, probe_age: float = PROBE_EVERY) -> Any:
        """The session's connection, opened and set up if need be.

        ``probe_age``: how old a cached verdict on the URL (``sessions_pinned``) may be.
        """
        if self._conn is None:
            try:
                conn = self._connect()
            except Exception as exc:
                raise self._lost(exc) from exc
            self._guarded(conn, lambda c: self._setup(c, probe_age))
            self._conn = conn
        return self._conn

    def _guarded(self, conn: Any, step: Callable[[Any], None]) -> None:
        """Run a set-up ``step`` on ``conn``; if it fails, the connection goes, with why."""
        try:
            step(conn)
        except Exception as exc:
            if conn is self._conn:
                self._drop()
            else:
                conn.close()
            if isinstance(exc, LivenessUnsupported):
                raise
            if sqlstate(exc) == "42704":  # unrecognized parameter
                raise LivenessUnsupported(
                    f"{self.description} cannot end a silent session "
                    f"(idle_session_timeout needs PostgreSQL 14+): {one_line(exc)}"
                ) from exc
            raise self._lost(exc) from exc

    def _setup(self, conn: Any, probe_age: float) -> None:
        raise NotImplementedError

    def _execute(self, sql: str, params: tuple[Any, ...] = (), *, wait: bool = False) -> Any:
        """One statement; with ``wait``, a lock wait (a lock timeout returns ``_TIMED_OUT``).

        An interrupt that came before a wait ends it before it starts (InterruptedError).
        """
        conn = self._connection()
        if wait and self._interrupted:  # an interrupt that came first (a stop() while
            self._interrupted = False  # the session connected) ends the wait now
            raise InterruptedError("liveness wait interrupted")
        try:
            cur = conn.cursor()
            try:
                cur.execute(sql, params)
                row = cur.fetchone() if cur.description is not None else None
            finally:
                cur.close()
        except Exception as exc:
            if wait and not self._interrupted and sqlstate(exc) == "55P03":
                return _TIMED_OUT  # lock_timeout: the session is fine
            self._drop()
            if self._interrupted:
                self._interrupted = False
                raise InterruptedError("liveness wait interrupted") from exc
            raise self._lost(exc) from exc
        return None if row is None else row[0]

    def _lost(self, exc: BaseException) -> BackendUnavailableError:
        return BackendUnavailableError(
            f"liveness session to {self.description} lost: {one_line(exc)}"
        )

    def _drop(self) -> None:
        self._held = False
        self._slot = None  # the server frees a closed session's locks
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:
                log.debug("closing a lost liveness connection failed", exc_info=True)

    def release(self) -> None:
        """End the session: the server frees its lock at once.

        The server would end an idle session after delta anyway, so keeping it open for
        the next wait gains nothing.
        """
        with self._mutex:
            self._drop()

    def ping(self) -> None:
        conn = self._connection()
        deadline = WATCHDOG.arm(conn, self.delta)  # a stalled link must not hang the thread
        try:
            self._execute("SELECT 1")
        finally:
            deadline.cancel()

    def interrupt(self) -> None:
        # The flag also stops a wait that has not started yet (``_execute``): without
        # it, a stop() while the session connected waited out the whole lock timeout.
        self._interrupted = True
        conn = self._conn
        if conn is not None:
            interrupt(conn)

    def close(self) -> None:
        self.interrupt()
        with self._mutex:
            self._drop()


_PINNED: dict[str, tuple[bool, float]] = {}
#: URLs whose server cannot check for closed clients (not Linux: no POLLRDHUP)
_NO_CONNECTION_CHECK: set[str] = set()
_PROBE = "celery_election.probe"


def sessions_pinned(
    conn: Any, connect: Callable[[], Any], description: str, max_age: float = PROBE_EVERY
) -> bool:
    """Whether ``conn`` keeps one server session from call to call (not a tx pooler).

    Behind PgBouncer in transaction mode a client's session state (an advisory lock, a
    LISTEN) stays on whichever server connection ran the call, and the next client that
    gets that connection shares it: two or three processes held "the" lock at once. The
    probe writes a session setting from ``conn``, then from a second client, and reads
    it back on ``conn``: a direct session (or a session pooler) reads its own value every
    time. Each round catches the pooler whether it hands out its idle connections
    last-in-first-out (PgBouncer's default) or round robin. The verdict is cached per URL
    and reused while younger than ``max_age`` seconds (sessions reconnect often).
    """
    now = time.monotonic()
    cached = _PINNED.get(description)
    if cached is not None and now - cached[1] < max_age:
        return cached[0]
    other = connect()
    try:
        other.autocommit = True
        pinned = all(_keeps_its_own(conn, other) for _ in range(3))
    finally:
        other.close()
    _PINNED[description] = (pinned, now)
    return pinned


def _keeps_its_own(conn: Any, other: Any) -> bool:
    mine, theirs = os.urandom(8).hex(), os.urandom(8).hex()
    _scalar(conn, "SELECT set_config(%s, %s, false)", (_PROBE, mine))
    if _scalar(conn, "SELECT current_setting(%s, true)", (_PROBE,)) != mine:
        return False
    _scalar(other, "SELECT set_config(%s, %s, false)", (_PROBE, theirs))
    return bool(_scalar(conn, "SELECT current_setting(%s, true)", (_PROBE,)) == mine)


def _scalar(conn: Any, sql: str, params: tuple[Any, ...]) -> Any:
    with conn.cursor() as cur:
        cur.execute(sql, params)
        row = cur.fetchone()
    return None if row is None else row[0]


class PostgresSession(_DBSession):
    """``pg_advisory_lock`` on a psycopg connection with ``idle_session_timeout = delta``.

    psycopg 3 or psycopg2: every call here is one both spell alike (a cursor, ``%s``
    parameters, ``autocommit``); their SQLSTATEs are read by ``connection.sqlstate``.
    """

    TRY = "pg_try_advisory_lock(%s)"
    UNLOCK = "pg_advisory_unlock(%s)"
    FALSE = "false"

    def __init__(self, connect: Callable[[], Any], delta: float, description: str, key: bytes):
        super().__init__(connect, delta, description, key)
        self._lock_timeout: int | None = None  # as set on this connection
        #: this connection was checked on a verdict younger than PROBE_EVERY
        self._verified = False

    @staticmethod
    def lock_name(key: bytes) -> int:
        return int.from_bytes(key[:8], "big", signed=True)

    def _setup(self, conn: Any, probe_age: float) -> None:
        self._lock_timeout = None
        conn.autocommit = True  # idle in a transaction is a different timeout
        self._check_pinned(conn, probe_age)
        if self._verified:  # else acquire() probes first: the probe may outlast delta
            self._set_timeouts(conn)

    def _verify(self, conn: Any) -> None:
        self._check_pinned(conn, PROBE_EVERY)
        self._set_timeouts(conn)

    def _set_timeouts(self, conn: Any) -> None:
        # PostgreSQL 14+; an older server raises here and liveness stays off. One
        # statement: a cold standby's try connects once per fallback_interval.
        millis = str(math.ceil(self.delta * 1000))
        sql = (
            "SELECT set_config('idle_session_timeout', %s, false),"
            " set_config('statement_timeout', '0', false)"
        )
        if self.description not in _NO_CONNECTION_CHECK:
            # A server notices a closed client only when it next talks to it: a standby
            # that died (or gave up) in ``pg_advisory_lock`` stayed in the lock's queue,
            # holding its standby slot, until lock_timeout (fallback_interval) ran out,
            # so a newer candidate found no slot free and was not woken by the grant
            # (a rolling upgrade handed the vacancy back to an older release).
            # With the check the server ends it within delta.
            try:
                _scalar(conn, sql + ", set_config('client_connection_check_interval', %s, false)",
                        (millis, millis))  # fmt: skip
                return
            except Exception as exc:
                if sqlstate(exc) != "22023":  # "must be 0 on this platform" (no POLLRDHUP)
                    raise
                _NO_CONNECTION_CHECK.add(self.description)
                log.warning(
                    "%s cannot check for closed clients (client_connection_check_interval): "
                    "a standby that dies while it waits on the liveness lock keeps its "
                    "standby slot until its wait times out", self.description,
                )  # fmt: skip
        _scalar(conn, sql, (millis,))

    def _check_pinned(self, conn: Any, max_age: float) -> None:
        if not sessions_pinned(conn, self._connect, self.description, max_age):
            raise PooledSessions(
                f"{self.description} leads to a transaction pooler (PgBouncer "
                f"pool_mode=transaction?): a session lock there is shared by every client "
                f"of the server connection, so the liveness lock is off and a crashed "
                f"leader is replaced when its lease ends. For failover in about a second, "
                f"set election_direct_url to a URL that reaches PostgreSQL directly"
            )
        self._verified = time.monotonic() - _PINNED[self.description][1] < PROBE_EVERY

    def acquire(self, timeout: float) -> bool:
        with self._mutex:
            conn = self._connection()
            if not self._verified:
                # a slot taken on an older verdict: no wait (trust) without a fresh one
                self._guarded(conn, self._verify)
            millis = max(1, math.ceil(timeout * 1000))
            if self._lock_timeout != millis:  # once per connection: a waiting standby
                self._execute(f"SET lock_timeout = {millis}")  # sends nothing else
                self._lock_timeout = millis
            got = self._execute("SELECT pg_advisory_lock(%s)", (self.key,), wait=True)
            self._held = got is not _TIMED_OUT
            if self._held:
                self._free_slot()
            return self._held


class MySQLSession(_DBSession):
    """``GET_LOCK`` on a PyMySQL or mysqlclient connection with ``wait_timeout = ceil(delta)``."""

    TRY = "GET_LOCK(%s, 0) = 1"
    UNLOCK = "RELEASE_LOCK(%s)"
    FALSE = "0"

    @staticmethod
    def lock_name(key: bytes) -> str:
        return "celery_election:" + key.hex()[:40]  # GET_LOCK names: 64 characters

    def _setup(self, conn: Any, probe_age: float) -> None:
        conn.autocommit(True)
        cur = conn.cursor()
        try:
            cur.execute(f"SET SESSION wait_timeout = {max(1, math.ceil(self.delta))}")
        finally:
            cur.close()

    def acquire(self, timeout: float) -> bool:
        with self._mutex:
            got = self._execute(
                "SELECT GET_LOCK(%s, %s)", (self.key, max(1, round(timeout))), wait=True
            )
            self._held = got == 1
            if self._held:
                self._free_slot()
            return self._held


# Open lock files, closed in a forked child: a child holding the parent's open file
# description would keep the lock after the parent died.
_FILES: weakref.WeakSet[FileSession] = weakref.WeakSet()


def _forget_in_child() -> None:
    for session in list(_FILES):
        for fd in (session._fd, session._slot_fd):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
        session._fd = session._slot_fd = None
        session._held = False


os.register_at_fork(after_in_child=_forget_in_child)


class FileSession:
    """``flock`` on a file beside the SQLite database; the kernel drops it at exit.

    Nothing ends a stopped holder's lock: after a pause, the lease hands over (followers
    look at it while they wait). A wait polls the lock every 5 ms: no statements.
    """

    _POLL = 0.005
    silent_holders_lose = False

    def __init__(self, path: Path, delta: float) -> None:
        self.path = path
        self.delta = delta
        self._fd: int | None = None
        self._slot_fd: int | None = None
        self._held = False
        self._wake = threading.Event()
        _FILES.add(self)

    @property
    def has_lock(self) -> bool:
        return self._held

    def _slot_path(self, slot: int) -> Path:
        name = self.path.name.removesuffix(".lock")
        return self.path.with_name(f"{name}.slot{slot}.lock")

    def claim_slot(self, count: int) -> bool:
        for slot in random.sample(range(count), count):
            if self._slot_fd is not None:
                break
            fd = self._open(self._slot_path(slot))
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                continue
            self._slot_fd = fd
        return self._slot_fd is not None

    def _free_slot(self) -> None:
        fd, self._slot_fd = self._slot_fd, None
        if fd is not None:
            os.close(fd)  # closing the only descriptor drops its lock

    @staticmethod
    def _open(path: Path) -> int:
        try:
            return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise BackendUnavailableError(
                f"cannot open the liveness lock file {path}: {exc}"
            ) from exc

    def acquire(self, timeout: float) -> bool:
        if self._fd is None:
            self._fd = self._open(self.path)
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                self._held = True
                self._free_slot()
                return True
            except BlockingIOError:
                pass
            except OSError as exc:  # closed under us
                raise BackendUnavailableError(f"liveness lock file {self.path}: {exc}") from exc
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if self._wake.wait(min(self._POLL, left)) or self._fd is None:
                self._wake.clear()
                raise InterruptedError("liveness wait interrupted")

    def ended(self, key: bytes) -> bool:
        """Whether lock ``key``'s holder process ended (its file is free, or gone)."""
        base = self.path.name.rsplit(".", 2)[0]  # "<db>.<key>.lock" -> "<db>"
        try:
            fd = os.open(self.path.with_name(f"{base}.{key.hex()[:16]}.lock"), os.O_RDWR)
        except FileNotFoundError:
            return True  # a holder creates its file before it writes a row
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        finally:
            os.close(fd)  # also drops the lock, if taken
        return True

    def ping(self) -> None:
        if self._fd is None or not self._held:
            raise BackendUnavailableError(f"liveness lock file {self.path} is not held")

    def release(self) -> None:
        self._free_slot()
        if self._held and self._fd is not None:
            self._held = False
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def interrupt(self) -> None:
        self._wake.set()

    def close(self) -> None:
        self.interrupt()
        self._held = False
        self._free_slot()
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # closing the only descriptor drops the lock


def pg_connector(
    engine: Engine, url: URL, connect_timeout: float, application_name: str
) -> Callable[[], Any]:
    """Open a psycopg (3 or 2: the engine's driver) connection to ``url`` as its dialect would.

    The dialect turns SQLAlchemy's URL forms (several ``host=`` values, ``host=a:1,b:2``,
    ``target_session_attrs``) into libpq's, so every connection the elector opens accepts
    the multi-host URLs its lease engine accepts.
    """
    dialect = engine.dialect
    cargs, cparams = dialect.create_connect_args(url)
    cparams.update(pg_connect_args(connect_timeout, application_name, dialect.driver))
    return green.connector(dialect, *cargs, **cparams)
