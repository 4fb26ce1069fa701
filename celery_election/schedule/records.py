"""The operable schedule's rows as plain data: entries, runs, operator changes, terms.

What ``store.py`` reads from its tables and hands out (times: the database's clock, epoch
microseconds); ``history_row`` the columns of a run it writes. Frozen dataclasses, no SQL
beyond the key of an entry (``backends/schema.entry_key``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ..backends.schema import entry_key

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
    """One row of an entry's run history."""

    id: int
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
    due_at: int | None = None,
    task_id: str | None = None,
    count: int = 1,
    sent_at: int | None = None,
) -> dict[str, Any]:
    """The columns of one history row."""
    return {
        "namespace": namespace,
        "entry_key": entry_key(name),
        "kind": kind,
        "run_key": run_key,
        "term": term,
        "due_at": due_at,
        "sent_at": sent_at,
        "task_id": task_id,
        "count": count,
    }


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
    """A ``schedule_run`` row as a :class:`RunRecord`."""
    return RunRecord(
        id=int(row.id),
        entry_key=row.entry_key,
        kind=row.kind,
        run_key=int(row.run_key),
        term=int(row.term),
        due_at=opt_int(row.due_at),
        sent_at=int(row.sent_at),
        task_id=row.task_id,
        count=int(row.count),
        finished_at=opt_int(row.finished_at),
        outcome=row.outcome,
        duration_us=opt_int(row.duration_us),
    )
