"""Connection plumbing for the SQL backends: private engines, call deadlines, errors.

Why each piece exists (docs/design.md, "Rules found by experiment"):

* ``LostRound``: a step that lost to contention (what ``Dialect.classify`` calls
  "contention": lock timeouts, deadlocks, duplicate keys, SQLite's busy errors; rule 1).
* The watchdog: every call has a client-side deadline; a stalled socket is shut down
  from another thread (SQLAlchemy's pre-ping froze past 8 s despite server timeouts,
  rule 8).
* ``dispose_in_child``: after a fork the child drops the parent's connections of a
  private engine (``Dialect.private_engine``) without closing them (rule 12).
  ``fork_lock`` keeps forks out of in-process SQLite calls.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import weakref
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy.engine import Engine

from . import green

__all__ = [
    "WATCHDOG",
    "Deadline",
    "LostRound",
    "Timeouts",
    "dispose_in_child",
    "fork_lock",
    "interrupt",
    "one_line",
    "pg_connect_args",
    "remember_socket",
    "sqlstate",
]

log = logging.getLogger("celery_election.backends.sql")


class LostRound(Exception):
    """The step lost to contention; nothing changed."""


# -- call deadlines -------------------------------------------------------------------------


#: mysqlclient connection -> (fd, local address, peer address), read when it connected.
_SOCKETS: weakref.WeakKeyDictionary[Any, tuple[int, Any, Any]] = weakref.WeakKeyDictionary()


def remember_socket(dbapi_conn: Any) -> None:
    """Note a new mysqlclient connection's socket, for ``interrupt``.

    mysqlclient (2.2+) refuses every method, ``fileno()`` included, while another thread
    is inside a call on the connection ("already in use from another thread"): the
    socket of a blocked call must be known before the call starts.
    """
    dbapi_conn = green.unwrap(dbapi_conn)
    if not type(dbapi_conn).__module__.startswith("MySQLdb"):
        return
    fd = dbapi_conn.fileno()
    with socket.socket(fileno=os.dup(fd)) as sock:
        _SOCKETS[dbapi_conn] = (fd, sock.getsockname(), sock.getpeername())


def _remembered_fd(dbapi_conn: Any) -> int | None:
    """The fd noted by ``remember_socket``, if the connection is still open."""
    known = _SOCKETS.get(dbapi_conn)
    if known is None or not getattr(dbapi_conn, "open", False):
        return None
    return known[0]


def interrupt(dbapi_conn: Any) -> None:
    """Make a call blocked on this DBAPI connection fail now, from another thread.

    Every driver but sqlite3 is cut the same way: its socket is shut down, so the blocked
    read returns at once with a lost connection (a server-side cancel would need a second
    connection over the same stalled link). Where the socket is: psycopg 3 ``pgconn.socket``,
    PyMySQL ``_sock``, psycopg2 ``fileno()``, mysqlclient the fd ``remember_socket`` noted.
    """
    dbapi_conn = green.unwrap(dbapi_conn)
    if hasattr(dbapi_conn, "interrupt"):  # sqlite3
        dbapi_conn.interrupt()
        return
    raw = getattr(dbapi_conn, "_sock", None)  # PyMySQL
    if raw is not None:
        with suppress(OSError):
            raw.shutdown(socket.SHUT_RDWR)
        return
    mysqlclient = type(dbapi_conn).__module__.startswith("MySQLdb")
    known = _SOCKETS.get(dbapi_conn) if mysqlclient else None
    try:
        if known is not None:  # mysqlclient
            fd = _remembered_fd(dbapi_conn)
            if fd is None:
                return
        else:
            pgconn = getattr(dbapi_conn, "pgconn", None)
            fd = pgconn.socket if pgconn is not None else dbapi_conn.fileno()
        sock = socket.socket(fileno=os.dup(fd))
    except Exception:  # already closed, or a driver without a socket: nothing to cut
        return
    try:
        # A closed connection's fd may be another socket by now: cut only the one noted.
        if known is None or (sock.getsockname(), sock.getpeername()) == known[1:]:
            with suppress(OSError):  # already disconnected: nothing left to interrupt
                sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # not a connected socket any more
    finally:
        sock.close()


def sqlstate(exc: BaseException | None) -> str | None:
    """PostgreSQL's SQLSTATE of a driver error: psycopg 3 ``sqlstate``, psycopg2 ``pgcode``."""
    code = getattr(exc, "sqlstate", None) or getattr(exc, "pgcode", None)
    return code if isinstance(code, str) else None


class Deadline:
    """One database call's deadline, watched by the process's watchdog thread."""

    __slots__ = ("at", "dbapi_conn", "fired")

    def __init__(self, dbapi_conn: Any, at: float | None) -> None:
        self.dbapi_conn, self.at, self.fired = dbapi_conn, at, False

    def cancel(self) -> None:
        WATCHDOG.disarm(self)


class Watchdog:
    """One thread per process that interrupts calls outliving their deadline.

    (A threading.Timer per call cost a thread start, ~0.1 ms of CPU, on every statement.)
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._armed: set[Deadline] = set()
        self._pid = 0
        self._waiting_until: float | None = None

    def arm(self, dbapi_conn: Any, timeout: float | None) -> Deadline:
        deadline = Deadline(dbapi_conn, None if timeout is None else time.monotonic() + timeout)
        if deadline.at is None:
            return deadline
        with self._cond:
            if self._pid != os.getpid():  # first use, or a forked child: no thread yet
                self._pid = os.getpid()
                self._armed.clear()
                threading.Thread(
                    target=self._run, name="celery-election-watchdog", daemon=True
                ).start()
            self._armed.add(deadline)
            if self._waiting_until is None or deadline.at < self._waiting_until:
                self._cond.notify()
        return deadline

    def disarm(self, deadline: Deadline) -> None:
        if deadline.at is not None:
            with self._cond:
                self._armed.discard(deadline)

    def _run(self) -> None:
        with self._cond:
            while True:
                now = time.monotonic()
                for d in [d for d in self._armed if d.at is not None and d.at <= now]:
                    self._armed.discard(d)
                    d.fired = True
                    try:
                        interrupt(d.dbapi_conn)
                    except Exception:  # pragma: no cover - best effort
                        log.debug("could not interrupt a stalled call", exc_info=True)
                ats = [d.at for d in self._armed if d.at is not None]
                self._waiting_until = min(ats) if ats else None
                self._cond.wait(None if self._waiting_until is None else self._waiting_until - now)


WATCHDOG = Watchdog()


# -- engines --------------------------------------------------------------------------------


def filesystem_type(path: Path) -> str | None:
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return None
    best, fstype = "", None
    target = str(path)
    for line in mounts:
        parts = line.split()
        if len(parts) >= 3:
            mnt = parts[1].replace("\\040", " ")
            inside = target == mnt or target.startswith(mnt.rstrip("/") + "/")
            if inside and len(mnt) > len(best):
                best, fstype = mnt, parts[2]
    return fstype


def fork_lock() -> threading.Lock:
    """A lock that ``os.fork()`` takes first, so no fork lands inside a guarded call."""
    lock = threading.Lock()
    ref = weakref.ref(lock)

    def before() -> None:
        held = ref()
        if held is not None:
            held.acquire()

    def after() -> None:
        held = ref()
        if held is not None and held.locked():
            held.release()

    os.register_at_fork(before=before, after_in_parent=after, after_in_child=after)
    return lock


def dispose_in_child(ref: weakref.ref[Engine]) -> Callable[[], None]:
    def after_fork() -> None:
        engine = ref()
        if engine is not None:
            # close=False: the parent still owns those sockets; closing them here would
            # break the parent's connections (docs/design.md, rule 12).
            engine.dispose(close=False)

    return after_fork


def pg_connect_args(
    connect_timeout: float, application_name: str, driver: str = "psycopg"
) -> dict[str, Any]:
    """The driver arguments of every connection the election opens to PostgreSQL.

    ``prepare_threshold=None`` (psycopg 3 only; psycopg2 never prepares): psycopg prepares
    a statement run five times, and a transaction pooler (PgBouncer in transaction mode)
    hands the next call to a server session that never saw it ("prepared statement
    _pg3_1 does not exist"). Keepalives: a dead peer is noticed in seconds, not after the
    kernel's two hours. The rest are libpq's, which both drivers pass on.
    """
    args: dict[str, Any] = {
        "connect_timeout": max(1, round(connect_timeout)),
        "application_name": application_name,
        "keepalives": 1,
        "keepalives_idle": 5,
        "keepalives_interval": 2,
        "keepalives_count": 3,
    }
    if driver == "psycopg":
        args["prepare_threshold"] = None
    return args


@dataclass(frozen=True)
class Timeouts:
    """A backend's timeouts in seconds; each dialect's engine reads those it needs."""

    statement: float
    connect: float
    sqlite_busy: float


def one_line(exc: BaseException) -> str:
    """The driver's message on one line (libpq's spans several)."""
    text = str(getattr(exc, "orig", None) or exc)
    return "; ".join(line.strip() for line in text.splitlines() if line.strip())
