"""A burst to send: a schedule every entry of which is due at once, and a leader to send it."""

from __future__ import annotations

from datetime import datetime

from celery.beat import Scheduler
from celery.schedules import BaseSchedule, schedstate

from celery_election.beat import LeaderSchedulerMixin

__all__ = ["Due", "Leading"]


class Due(BaseSchedule):  # type: ignore[misc]
    """Due now, and next in an hour: every entry is in the first burst, once."""

    def is_due(self, last_run_at: datetime) -> schedstate:
        return schedstate(True, 3600.0)


class Leading(LeaderSchedulerMixin, Scheduler):
    """The mixin over Celery's plain Scheduler (no shelve), sending for real."""
