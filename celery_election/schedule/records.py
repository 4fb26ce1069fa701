"""The operable schedule's rows as plain data: entries, runs, operator changes, terms.

What ``store.py`` reads from its tables and hands out (times: the database's clock, epoch
microseconds); ``history_row`` the row of runs a policy did not send. Frozen dataclasses, no SQL
beyond the key of an entry (``backends/schema.entry_key``).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from ..backends.schema import entry_key
from ..core.runstate import CLAIMED, DROPPED, SENT, STARTED

__all__ = [
    "AuditRecord",
    "EntryRow",
    "RunRecord",
    "TermRecord",
    "entry_from_row",
    "history_row",
    "opt_int",
    "record_from_row",
]


@dataclass(frozen=True)
class EntryRow:
    """One stored entry (times: database clock, epoch microseconds)."""

    name: str
    task: str | None  # None: an operator's overlay on a static beat_schedule entry
    spec: dict[str, Any] = field(hash=False, compare=True)
    enabled: bool = True
    paused_at: int | None = None
    skip_before: int | None = None
    run_now_at: int | None = None
    deleted: bool = False
    version: int = 0
    created_at: int = 0
    updated_at: int = 0
    updated_by: str = ""

    @property
    def paused(self) -> bool:
        return self.paused_at is not None


@dataclass(frozen=True)
class RunRecord:
    """One run in an entry's history: its run row (``task_start``, core/runstate.py's states).

    ``id`` is the row's key; ``run_key`` the entry's stored run it follows (its due time's
    key, or a "run now"'s request time); ``sent_at`` when the beat claimed it (a missed or
    skipped row: when the policy decided); ``duration_us`` from its body's start to its end.
    """

    id: str
    entry_key: str
    kind: str  # run / run_now / missed (catch-up policy) / skipped (overlap policy)
    run_key: int
    term: int
    due_at: int | None
    sent_at: int
    task_id: str | None
    count: int
    finished_at: int | None
    outcome: str | None
    duration_us: int | None
    state: str | None = None

    @property
    def status(self) -> str | None:
        """How it ended (its outcome), or where it is: claimed, queued or running."""
        return self.outcome or _ON_ITS_WAY.get(self.state or "")


#: What an open run's state says on the page and in ``schedule history``.
_ON_ITS_WAY = {CLAIMED: "claimed", SENT: "queued", STARTED: "running"}


@dataclass(frozen=True)
class AuditRecord:
    """Who changed which entry, how and when."""

    id: int
    name: str
    action: str
    actor: str
    at: int
    detail: dict[str, Any]


@dataclass(frozen=True)
class TermRecord:
    """One term of leadership as recorded (times: database clock, epoch microseconds).

    ``ended_at`` is set by a clean end; else the term lasted at least until ``seen_at``.
    """

    namespace: str
    term: int
    leader_id: str
    started_at: int
    seen_at: int
    ended_at: int | None


def history_row(
    namespace: str,
    name: str,
    kind: str,
    *,
    run_key: int,
    term: int,
    count: int = 1,
    sent_at: int,
) -> dict[str, Any]:
    """The run row of runs a policy did not send (kind missed or skipped), ``count`` of them.

    Dropped when written; keyed by what it stands for (the entry's stored run it follows),
    so a batch written twice (its first answer lost) is one row.
    """
    key = hashlib.sha1(f"{kind}\0{namespace}\0{name}\0{run_key}".encode()).hexdigest()
    return {
        "namespace": namespace, "run_key": key, "task_id": "", "task_name": name[:255],
        "hostname": "", "pid": 0, "attempt": 0, "started_at": sent_at, "finished_at": sent_at,
        "state": DROPPED, "term": term, "entry_name": name[:500], "due": run_key,
        "entry_key": entry_key(name), "kind": kind, "count": count, "outcome": None,
        "due_at": None, "began_at": None,
    }  # fmt: skip


def opt_int(value: Any) -> int | None:
    return None if value is None else int(value)


def entry_from_row(row: Any) -> EntryRow:
    """A ``schedule_entry`` row as an :class:`EntryRow`."""
    return EntryRow(
        name=row.name,
        task=row.task,
        spec=json.loads(row.spec),
        enabled=bool(row.enabled),
        paused_at=opt_int(row.paused_at),
        skip_before=opt_int(row.skip_before),
        run_now_at=opt_int(row.run_now_at),
        deleted=bool(row.deleted),
        version=int(row.version),
        created_at=int(row.created_at),
        updated_at=int(row.updated_at),
        updated_by=row.updated_by,
    )


def record_from_row(row: Any) -> RunRecord:
    """A run row (``task_start``) as a :class:`RunRecord`."""
    began, ended = opt_int(row.began_at), opt_int(row.finished_at)
    return RunRecord(
        id=row.run_key,
        entry_key=row.entry_key,
        kind=row.kind,
        run_key=int(row.due or 0),
        term=int(row.term or 0),
        due_at=opt_int(row.due_at),
        sent_at=int(row.started_at),
        task_id=row.task_id or None,
        count=int(row.count or 1),
        finished_at=ended,
        outcome=row.outcome,
        duration_us=None if began is None or ended is None else max(0, ended - began),
        state=row.state,
    )
