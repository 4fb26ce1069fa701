"""A burst to send: a schedule every entry of which is due at once, and a leader to send it."""

from __future__ import annotations

import math
from datetime import datetime, timedelta

from celery.beat import Scheduler
from celery.schedules import BaseSchedule, schedstate

from celery_election.beat import LeaderSchedulerMixin

__all__ = ["Boundary", "Due", "Leading"]


class Due(BaseSchedule):  # type: ignore[misc]
    """Due now, and next in an hour: every entry is in the first burst, once."""

    def is_due(self, last_run_at: datetime) -> schedstate:
        return schedstate(True, 3600.0)


class DueOnce(BaseSchedule):  # type: ignore[misc]
    """Due at the entry's first check, then not for an hour: as a real schedule answers.

    ``Due`` answers "due" whenever asked: a beat that lost its lease under load and was
    promoted again (a new term adopts the state and asks again) sent each entry a second
    run, which a test counting one run per entry took for a double.
    """

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)
        self.first: datetime | None = None  # the last run the entry started with

    def is_due(self, last_run_at: datetime) -> schedstate:
        if self.first is None:
            self.first = last_run_at
        return schedstate(last_run_at <= self.first, 3600.0)


class Boundary(BaseSchedule):  # type: ignore[misc]
    """Due at every multiple of ``seconds`` since the epoch: a whole schedule due at once.

    Celery's interval schedule counts from each entry's own last run, so a burst's
    entries drift apart by the burst's length; a crontab's boundaries are a minute apart.
    """

    def __init__(self, seconds: float, **kwargs: object) -> None:
        super().__init__(**kwargs)
        self.seconds = seconds

    def __reduce__(self) -> tuple[type, tuple[float]]:
        return self.__class__, (self.seconds,)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Boundary) and other.seconds == self.seconds

    def __hash__(self) -> int:
        return hash(self.seconds)

    def remaining_estimate(self, last_run_at: datetime) -> timedelta:
        last = self.maybe_make_aware(last_run_at).timestamp()
        boundary = (math.floor(last / self.seconds) + 1) * self.seconds
        return timedelta(seconds=boundary - self.now().timestamp())

    def is_due(self, last_run_at: datetime) -> schedstate:
        left = self.remaining_estimate(last_run_at).total_seconds()
        if left > 0:
            return schedstate(False, left)
        return schedstate(True, self.seconds - self.now().timestamp() % self.seconds)


class Leading(LeaderSchedulerMixin, Scheduler):
    """The mixin over Celery's plain Scheduler (no shelve), sending for real."""
