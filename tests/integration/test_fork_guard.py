"""Forks wait for a SQLite call in progress; the child's engine drops the parent's sockets."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from celery_election.backends import SQLBackend, backend_from_url


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
