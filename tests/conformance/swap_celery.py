"""pytest plugin: Celery's beat tests with the leader schedulers standing in.

Loaded with ``-p swap_celery`` before Celery's ``t/unit/app/test_beat.py`` is imported, so
every ``beat.Scheduler`` / ``beat.PersistentScheduler`` the tests build (and subclass) is
ours. Leadership is won for real: each scheduler runs its own Elector on a memory backend
and waits until it leads, then the test goes on. The schedulers are closed before the
test's fixtures are torn down (Celery's ``threads_not_lingering`` checks for threads).
"""

from __future__ import annotations

import celery.beat as beat
import leading
from leading import Leading

from celery_election.beat import LeaderScheduler, LeaderSchedulerMixin

_stock_scheduler = beat.Scheduler


class _IsAScheduler(type):
    """``isinstance(LeaderScheduler(...), beat.Scheduler)`` holds, as it does on stock."""

    def __instancecheck__(cls, obj: object) -> bool:
        return type.__instancecheck__(cls, obj) or isinstance(obj, LeaderSchedulerMixin)

    def __subclasscheck__(cls, sub: type) -> bool:
        return type.__subclasscheck__(cls, sub) or issubclass(sub, LeaderSchedulerMixin)


class LeaderBaseScheduler(Leading, LeaderSchedulerMixin, _stock_scheduler, metaclass=_IsAScheduler):
    """``celery.beat.Scheduler`` with the election."""


class LeaderPersistentScheduler(Leading, LeaderScheduler):
    """``celery.beat.PersistentScheduler`` with the election: our LeaderScheduler."""


beat.Scheduler = LeaderBaseScheduler  # type: ignore[misc]
beat.PersistentScheduler = LeaderPersistentScheduler  # type: ignore[misc]


pytest_runtest_teardown = leading.pytest_runtest_teardown

# Parametrized test ids show the class names: keep Celery's, so stock and leader runs
# name the same tests alike.
for _cls, _name in (
    (LeaderBaseScheduler, "Scheduler"),
    (LeaderPersistentScheduler, "PersistentScheduler"),
):
    _cls.__name__ = _cls.__qualname__ = _name
