"""Database waits that never block an eventlet or gevent hub.

Celery's eventlet and gevent pools monkey-patch the process: the election's threads are
then green threads, sharing one OS thread with the worker's consumer and every task. A
driver that waits inside C code blocks all of them at once: psycopg 3 under eventlet
(its C wait does not go through the patched ``select``; it cooperates under gevent only),
psycopg2, mysqlclient and sqlite3 under both. A follower waiting on the liveness lock
(``pg_advisory_lock``) froze its whole worker: no task, no heartbeat, no remote control.

So, chosen by what the process is (never by a setting), every call of the election:

* psycopg 3 under eventlet: a connection class whose waits use ``select()``, which the
  hub patches: the wait yields to the other green threads.
* C drivers (sqlite3, MySQLdb, psycopg2) under either hub: the driver call itself runs
  on a real OS thread of the hub's pool (``eventlet.tpool``, gevent's threadpool) while the
  green thread waits on it cooperatively.
* PyMySQL and psycopg 3 under gevent already cooperate (patched sockets and selectors).

Only the driver's C call leaves the hub's thread, never the election's own code: eventlet's
locks (logging's included) cannot be shared between OS threads ("Cannot switch to a
different thread"), so running the election's threads as real threads is not an option.
Cancellation keeps working: ``connection.interrupt`` shuts the socket (or interrupts
SQLite) from the watchdog, and the call on the pool's thread returns with an error.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Engine

__all__ = ["call", "connector", "cooperate", "hub", "unwrap"]

R = TypeVar("R")

#: DBAPI modules whose calls wait in C code: on a hub they run on the hub's thread pool.
_C_DRIVERS = ("sqlite3", "MySQLdb", "psycopg2")


def hub() -> str | None:
    """``"eventlet"`` or ``"gevent"`` when that library has patched this process, else None."""
    patcher = sys.modules.get("eventlet.patcher")
    if patcher is not None and patcher.is_monkey_patched("thread"):
        return "eventlet"
    monkey = sys.modules.get("gevent.monkey")
    if monkey is not None and monkey.is_module_patched("threading"):
        return "gevent"
    return None


def _blocks_in_c(dbapi: Any) -> bool:
    return getattr(dbapi, "__name__", "").split(".")[0] in _C_DRIVERS


def call(fn: Callable[..., R], *args: Any) -> R:
    """``fn(*args)`` on a real OS thread of the hub's pool, or here when there is no hub.

    The pool's thread never raises: gevent prints the traceback of anything raised there
    (a lost round, a missing table), so the error comes back as a value and is raised
    here, in the caller's green thread.
    """
    kind = hub()
    if kind is None:
        return fn(*args)

    def guarded() -> tuple[bool, Any]:
        try:
            return True, fn(*args)
        except BaseException as exc:
            return False, exc

    if kind == "eventlet":
        from eventlet import tpool

        ok, value = tpool.execute(guarded)
    else:
        import gevent

        ok, value = gevent.get_hub().threadpool.apply(guarded)
    if not ok:
        raise value
    return value  # type: ignore[no-any-return]


def _eventlet_psycopg() -> type[Any]:
    import psycopg
    from psycopg import waiting

    class EventletConnection(psycopg.Connection):
        """A psycopg 3 connection whose waits yield to eventlet's hub (patched select)."""

        def wait(self, gen: Any, interval: float = 0.1, timeout: float | None = None) -> Any:
            fileno = self.pgconn.socket
            return waiting.wait_select(gen, fileno, interval=interval, timeout=timeout)

    return EventletConnection


_EVENTLET_PSYCOPG: list[type[Any]] = []


def connector(dialect: sa.engine.Dialect, *cargs: Any, **cparams: Any) -> Callable[[], Any]:
    """A function opening a DBAPI connection as ``dialect.connect`` would, hub-safely."""
    if hub() is None:
        return lambda: dialect.connect(*cargs, **cparams)
    dbapi = dialect.loaded_dbapi
    if hub() == "eventlet" and getattr(dbapi, "__name__", "") == "psycopg":
        if not _EVENTLET_PSYCOPG:
            _EVENTLET_PSYCOPG.append(_eventlet_psycopg())
        cls = _EVENTLET_PSYCOPG[0]
        return lambda: cls.connect(*cargs, **cparams)
    if _blocks_in_c(dbapi):
        connect = functools.partial(dialect.connect, *cargs, **cparams)
        return lambda: _CooperativeConnection(call(connect))
    return lambda: dialect.connect(*cargs, **cparams)


def cooperate(engine: Engine) -> None:
    """Make ``engine``'s connections hub-safe when this process runs on a hub (see above).

    The engine keeps the driver's own connection objects (SQLAlchemy's psycopg2 dialect
    registers types on them in C): only the connect and each execute are moved.
    """
    if hub() is None:
        return
    eventlet_psycopg = hub() == "eventlet" and engine.dialect.driver == "psycopg"
    if not eventlet_psycopg and not _blocks_in_c(engine.dialect.loaded_dbapi):
        return

    @sa.event.listens_for(engine, "do_connect")
    def _connect(dialect: Any, record: Any, cargs: Any, cparams: Any) -> Any:
        if eventlet_psycopg:
            return connector(dialect, *cargs, **cparams)()
        return call(functools.partial(dialect.connect, *cargs, **cparams))

    if eventlet_psycopg:
        return

    @sa.event.listens_for(engine, "do_execute")
    def _execute(cursor: Any, statement: str, parameters: Any, context: Any) -> bool:
        call(cursor.execute, statement, parameters)
        return True

    @sa.event.listens_for(engine, "do_execute_no_params")
    def _execute_no_params(cursor: Any, statement: str, context: Any) -> bool:
        call(cursor.execute, statement)
        return True

    @sa.event.listens_for(engine, "do_executemany")
    def _executemany(cursor: Any, statement: str, parameters: Any, context: Any) -> bool:
        call(cursor.executemany, statement, parameters)
        return True


def unwrap(dbapi_conn: Any) -> Any:
    """The driver's own connection behind a hub-safe wrapper (``connector``), else itself."""
    return (
        dbapi_conn.__dict__.get("_conn", dbapi_conn)
        if isinstance(dbapi_conn, _CooperativeConnection)
        else dbapi_conn
    )


class _CooperativeConnection:
    """A C driver's DBAPI connection whose blocking calls run on the hub's thread pool."""

    def __init__(self, conn: Any) -> None:
        self.__dict__["_conn"] = conn

    def cursor(self, *args: Any, **kwargs: Any) -> _CooperativeCursor:
        return _CooperativeCursor(self._conn.cursor(*args, **kwargs))

    def commit(self) -> None:
        call(self._conn.commit)

    def rollback(self) -> None:
        call(self._conn.rollback)

    def close(self) -> None:
        self._conn.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._conn, name, value)

    def __enter__(self) -> _CooperativeConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _CooperativeCursor:
    """A cursor whose ``execute`` (where a C driver waits) runs on the hub's thread pool."""

    def __init__(self, cursor: Any) -> None:
        self.__dict__["_cursor"] = cursor

    def execute(self, *args: Any) -> Any:
        return call(self._cursor.execute, *args)

    def executemany(self, *args: Any) -> Any:
        return call(self._cursor.executemany, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cursor, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._cursor, name, value)

    def __iter__(self) -> Any:
        return iter(self._cursor)

    def __enter__(self) -> _CooperativeCursor:
        return self

    def __exit__(self, *exc: object) -> None:
        self._cursor.close()
