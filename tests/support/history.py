"""A beat run's history is its run row: rows for tests, through the stores' own writes.

``claimed`` and ``ended`` go the way a run goes (a beat's claim, the broker's confirm, a
worker's start and end); ``run_row`` writes a finished or sent row at a chosen time, for
the timeline's tests that need many runs at known times.
"""

from __future__ import annotations

import uuid
from typing import Any

from celery_election.backends import SQLBackend
from celery_election.backends.schema import entry_key
from celery_election.core import runstate
from celery_election.core.runstate import Delivery

__all__ = ["claimed", "ended", "run_row"]


def claimed(
    backend: SQLBackend, ns: str, name: str, task_id: str, *, kind: str = "run", due: int = 1,
    term: int = 1, due_at: int | None = None, sent: bool = True,
) -> str:  # fmt: skip
    """A run a beat claimed (and the broker accepted, if ``sent``): its row, as the beat's."""
    with backend.begin() as conn:
        backend.runs.write_claimed(conn, ns, term, [(name, due, task_id, "t.x", kind, due_at)])
    if sent:
        assert backend.runs.confirm(ns, [task_id]) == 1
    return task_id


def ended(backend: SQLBackend, ns: str, name: str, task_id: str, outcome: str = "SUCCESS") -> None:
    """A worker started the run and its body ended with ``outcome``."""
    d = Delivery(name, 1, task_id, uuid.uuid4().hex, "w", False, claimed=True)
    assert backend.runs.start(ns, d, lambda worker: True).run
    assert backend.runs.finish(ns, d.key, d.token, outcome)


def run_row(
    ns: str, name: str, kind: str = "run", *, due: int, sent_at: int, term: int = 1,
    due_at: int | None = None, task_id: str | None = None, outcome: str | None = None,
    duration_us: int = 0,
) -> dict[str, Any]:  # fmt: skip
    """The row of a run claimed at ``sent_at``: sent, or ended with ``outcome``."""
    task_id = task_id or runstate.run_task_id(ns, name, sent_at)
    done = outcome is not None
    return {
        "namespace": ns, "run_key": runstate.run_key(task_id), "task_id": task_id,
        "task_name": "t.x", "hostname": "", "pid": 0, "attempt": int(done),
        "started_at": sent_at, "state": runstate.ENDED if done else runstate.SENT,
        "term": term, "entry_name": name, "due": due, "entry_key": entry_key(name),
        "kind": kind, "due_at": due_at, "count": 1, "outcome": outcome,
        "began_at": sent_at if done else None,
        "finished_at": sent_at + duration_us if done else None,
    }  # fmt: skip
