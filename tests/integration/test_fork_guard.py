"""Forks wait for a SQLite call in progress; the child's engine drops the parent's sockets."""

from __future__ import annotations

import os
import sqlite3
import threading
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from celery_election.backends import SQLBackend, backend_from_url
from celery_election.core.lease import Bid


def test_a_fork_waits_for_the_sqlite_call_in_progress(tmp_path: Path) -> None:
    backend = backend_from_url(f"sqlite:///{tmp_path}/e.db")
    assert isinstance(backend, SQLBackend)
    backend.install()
    inside = threading.Event()
    order: list[str] = []

    def call_in_progress() -> None:
        with backend._fork_guard:  # what every SQLite call of the backend holds
            inside.set()
            threading.Event().wait(0.3)
            order.append("call finished")

    t = threading.Thread(target=call_in_progress)
    t.start()
    assert inside.wait(5)
    pid = os.fork()
    if pid == 0:  # the child: the guard was released for it, and the backend works
        try:
            ok = backend.current("x") is None
        finally:
            os._exit(0 if ok else 1)
    order.append("fork returned")
    _, status = os.waitpid(pid, 0)
    t.join()
    assert order == ["call finished", "fork returned"]
    assert os.waitstatus_to_exitcode(status) == 0
    assert backend.current("x") is None  # the parent's engine still works
    backend.close()


def test_a_fork_waits_for_a_real_backend_call(tmp_path: Path) -> None:
    """The same, through a real step: an elect waiting on SQLite's write lock (another
    connection holds it) is inside the backend's guard, so the fork waits for it: the
    child finds the elect committed. Without the guard it forks mid-call and finds none."""
    path = tmp_path / "e.db"
    # a busy timeout far past the blocker's release: under load the elect must still wait
    # for the lock, not give up on it (a lost elect would look like a fork mid-call)
    backend = backend_from_url(f"sqlite:///{path}", sqlite_busy_timeout=30.0)
    assert isinstance(backend, SQLBackend)
    backend.install()
    first = backend.elect(Bid("x", "b" * 32, "b", 10.0)).lease  # the row exists: one step
    assert first is not None and backend.resign("x", "b" * 32, first.term)
    blocker = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")  # the elect below waits for this write lock
    # The elect's write step is waiting for the lock once its BEGIN IMMEDIATE is sent (its
    # look at the lease before, a read, does not wait: forking then is not what is tested).
    writing = threading.Event()

    def seen(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.startswith("BEGIN IMMEDIATE"):
            writing.set()

    sa.event.listen(backend.engine, "before_cursor_execute", seen)
    outcome: list[Any] = []
    t = threading.Thread(
        target=lambda: outcome.append(backend.elect(Bid("x", "a" * 32, "a", 10.0)))
    )
    t.start()
    assert writing.wait(5), "the elect never began its write"
    assert backend._fork_guard.locked()  # type: ignore[union-attr]
    threading.Timer(0.3, lambda: blocker.execute("ROLLBACK")).start()
    pid = os.fork()
    if pid == 0:  # what the child inherits: the elect's outcome, committed or not yet
        with sqlite3.connect(path) as db:
            won = db.execute(
                "SELECT count(*) FROM celery_election_lease WHERE token IS NOT NULL"
            ).fetchone()[0]
        os._exit(0 if won == 1 else 3)
    _, status = os.waitpid(pid, 0)
    t.join()
    blocker.close()
    assert outcome and outcome[0].won  # the elect itself went through
    assert os.waitstatus_to_exitcode(status) == 0, "the fork landed inside the call"
    backend.close()
