"""When a beat entry's run falls due: Celery's answer, written once (docs/design.md, rule 6).

A due time is the schedule's own ``remaining_estimate`` of the last run added to now, what
beat's ``is_due`` reads, never a rule of ours. A schedule is anything with that method.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

__all__ = ["due_after", "due_times", "in_window"]


def due_after(schedule: Any, last: datetime, now: datetime) -> datetime:
    """When ``schedule`` falls due after a run at ``last``, seen at ``now`` (past: overdue)."""
    due: datetime = now + schedule.remaining_estimate(last)
    return due


def in_window(due: datetime | None, start: str | None, end: str | None) -> datetime | None:
    """``due`` moved to the entry's start if before it; None if after its end (ISO times)."""
    if due is not None and start:
        due = max(due, datetime.fromisoformat(start))
    if due is not None and end and due > datetime.fromisoformat(end):
        return None
    return due


def due_times(schedule: Any, last: datetime, now: datetime, cap: int = 10_000) -> list[datetime]:
    """The times ``schedule`` fell due after ``last`` up to ``now``, each past the one before."""
    out: list[datetime] = []
    while len(out) < cap:  # a bound: a 1 s interval after a 3-hour outage is 10,800 times
        due = due_after(schedule, last, now)
        if due > now or due <= last:  # not past the last: a one-off that ran, a stuck answer
            break
        out.append(due)
        last = due
    return out
