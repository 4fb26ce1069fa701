"""django-celery-beat's rows, written by the leading beat only and never backwards.

A mixin of ``LeaderSchedulerMixin``: the wrapped scheduler's ``sync`` writes the model rows
of the entries it ran (``_dirty``); a beat that does not lead (or leads in a term whose
state it has not loaded) leaves them to the leader, and a row is written only if that does
not move it back (``total_run_count`` never decreases), so a leader demoted between the
check and the write cannot undo the new leader's writes either.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .fence import BeatFence

__all__ = ["DjangoRowsMixin"]

log = logging.getLogger("celery_election.beat")


class DjangoRowsMixin:
    """``sync`` for schedulers whose entries have rows (django-celery-beat's models)."""

    _fence: BeatFence

    def sync(self) -> None:
        """The wrapped scheduler's sync; model rows are written by the leader only.

        A beat that no longer leads (or leads in a term it has not loaded) forgets the
        runs it has not written: the leader holds newer ones and writes them itself. A
        django-celery-beat row is written only if that does not move it back
        (``total_run_count`` never decreases), so a leader demoted between this check and
        the write cannot undo the new leader's writes either.
        """
        dirty = getattr(self, "_dirty", None)
        if isinstance(dirty, set) and dirty:
            if not self._may_write():
                log.debug("beat election: not leading; %d unsaved runs left to the leader",
                          len(dirty))  # fmt: skip
                dirty.clear()
            else:
                try:
                    self._write_rows(dirty)
                except Exception as exc:  # as the wrapped sync: log, retry at the next
                    log.warning("beat election: could not write the schedule rows (%s)", exc)
                    return
        super().sync()  # type: ignore[misc]

    def _may_write(self) -> bool:
        """Leading, in the term whose state this process loaded (if it loaded one)."""
        fence = self._fence
        lead = fence.leadership()
        if lead is None:
            return False
        return fence.loaded_term is None or lead.term == fence.loaded_term

    def _write_rows(self, dirty: set[Any]) -> None:
        """Write the django-celery-beat rows of ``dirty`` entries, never backwards.

        What ``ModelEntry.save`` writes, in one conditional UPDATE instead of a read and
        a save; entries whose class saves otherwise are left to the wrapped sync.
        """
        schedule = getattr(self, "_schedule", None) or {}
        for name in list(dirty):
            entry: Any = schedule.get(name)
            model: Any = getattr(entry, "model", None)
            manager = getattr(type(model), "_default_manager", None)
            if manager is None or getattr(model, "pk", None) is None:
                continue  # not a model entry: the wrapped sync writes it
            from django.db.models import (  # type: ignore[import-untyped]
                Case,
                DateTimeField,
                Value,
                When,
            )
            from django_celery_beat.schedulers import (  # type: ignore[import-untyped]
                ModelEntry,
            )

            if type(entry).save is not ModelEntry.save:
                continue
            # a disabled row shows no last run (PeriodicTask.save's rule, as stock's save)
            last = Case(
                When(enabled=False, then=Value(None)),
                default=Value(model.last_run_at),
                output_field=DateTimeField(),
            )
            written = manager.filter(
                pk=model.pk, total_run_count__lte=model.total_run_count
            ).update(last_run_at=last, total_run_count=model.total_run_count)
            dirty.discard(name)
            changes = getattr(self, "Changes", None)
            if written and changes is not None and not getattr(model, "no_changes", True):
                changes.changed(model)  # as PeriodicTask.save tells the beats
