"""``LeaderScheduler``: Celery's default scheduler, elected, with the operable schedule.

The mixin (scheduler.py) puts the election over any Celery scheduler; this is the one
``celery beat -S celery_election.beat:LeaderScheduler`` runs: PersistentScheduler's
shelve for the static schedule, and the operable schedule served beside it (ops.py).
"""

from __future__ import annotations

from typing import Any

from celery.beat import PersistentScheduler

from .fence import BeatFence
from .ops import ScheduleOps
from .policy import RunPolicy
from .scheduler import LeaderSchedulerMixin

__all__ = ["LeaderScheduler"]


class LeaderScheduler(LeaderSchedulerMixin, PersistentScheduler):
    """PersistentScheduler that sends only on the elected beat, each run at most once.

    The local shelve still caches the schedule as in stock beat; the run state that
    decides is the shared one in the election database. Changes of ``beat_schedule``
    between deploys behave as with a restarted PersistentScheduler (``follow_deploys``).
    Entries added, paused, run or given policies at runtime (``celery_election.schedule``)
    are served beside it: the schedule Celery sees is the operable schedule's view
    (``ops.ScheduleOps``, this scheduler's run policy).
    """

    follow_deploys = True
    _ops: ScheduleOps

    def make_policy(self, fence: BeatFence) -> RunPolicy:
        self._ops = ScheduleOps(fence, self._base, self.Entry)
        return self._ops

    def get_schedule(self) -> dict[str, Any]:
        view = self._ops.view
        return view if view is not None else self._base()

    def set_schedule(self, schedule: dict[str, Any]) -> None:
        super().set_schedule(schedule)
        if self._ops.view is not None:
            self._ops.rebuild()

    schedule = property(get_schedule, set_schedule)

    def _base(self) -> dict[str, Any]:
        """The wrapped scheduler's own schedule (PersistentScheduler's shelve)."""
        return super().get_schedule()  # type: ignore[no-any-return]
