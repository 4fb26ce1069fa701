"""django-celery-beat's rows, written by the leading beat only and never backwards.

``LeaderSchedulerMixin.sync`` asks here before the wrapped scheduler's ``sync`` writes the
model rows of the entries it ran (``_dirty``): a beat that does not lead (or leads in a
term whose state it has not loaded) leaves them to the leader, and a row is written only
if that does not move it back (``total_run_count`` never decreases), so a leader demoted
between the check and the write cannot undo the new leader's writes either.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .fence import BeatFence

__all__ = ["may_write", "write_rows"]


def may_write(fence: BeatFence) -> bool:
    """Leading, in the term whose state this process loaded (if it loaded one)."""
    lead = fence.leadership()
    if lead is None:
        return False
    return fence.loaded_term is None or lead.term == fence.loaded_term


def write_rows(schedule: Mapping[str, Any], dirty: set[Any], changes: Any) -> None:
    """Write the django-celery-beat rows of ``dirty`` entries, never backwards.

    What ``ModelEntry.save`` writes, in one conditional UPDATE instead of a read and a
    save; entries whose class saves otherwise are left to the wrapped sync. ``changes``:
    the scheduler's ``Changes`` model (django-celery-beat tells the beats of a change).
    """
    for name in list(dirty):
        entry: Any = schedule.get(name)
        model: Any = getattr(entry, "model", None)
        manager = getattr(type(model), "_default_manager", None)
        if manager is None or getattr(model, "pk", None) is None:
            continue  # not a model entry: the wrapped sync writes it
        from django.db.models import Case, DateTimeField, Value, When  # type: ignore[import-untyped]
        from django_celery_beat.schedulers import ModelEntry  # type: ignore[import-untyped]

        if type(entry).save is not ModelEntry.save:
            continue
        # a disabled row shows no last run (PeriodicTask.save's rule, as stock's save)
        last = Case(
            When(enabled=False, then=Value(None)),
            default=Value(model.last_run_at),
            output_field=DateTimeField(),
        )
        written = manager.filter(pk=model.pk, total_run_count__lte=model.total_run_count).update(
            last_run_at=last, total_run_count=model.total_run_count
        )
        dirty.discard(name)
        if written and changes is not None and not getattr(model, "no_changes", True):
            changes.changed(model)  # as PeriodicTask.save tells the beats
