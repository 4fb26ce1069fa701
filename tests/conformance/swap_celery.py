"""pytest plugin: Celery's beat tests with the leader schedulers standing in.

Loaded with ``-p swap_celery`` before Celery's ``t/unit/app/test_beat.py`` is imported, so
every ``beat.Scheduler`` / ``beat.PersistentScheduler`` the tests build (and subclass) is
ours. Leadership is won for real: each scheduler runs its own Elector on a memory backend
and waits until it leads, then the test goes on. The schedulers are closed before the
test's fixtures are torn down (Celery's ``threads_not_lingering`` checks for threads).
"""

from __future__ import annotations

from typing import Any

import celery.beat as beat
import pytest

from celery_election.beat import LeaderScheduler, LeaderSchedulerMixin

_made: list[Any] = []
_stock_scheduler = beat.Scheduler
LEAD_WITHIN = 5.0


class _IsAScheduler(type):
    """``isinstance(LeaderScheduler(...), beat.Scheduler)`` holds, as it does on stock."""

    def __instancecheck__(cls, obj: object) -> bool:
        return type.__instancecheck__(cls, obj) or isinstance(obj, LeaderSchedulerMixin)

    def __subclasscheck__(cls, sub: type) -> bool:
        return type.__subclasscheck__(cls, sub) or issubclass(sub, LeaderSchedulerMixin)


class _Leading:
    """Elect on the memory backend, and lead before the test uses the scheduler."""

    app: Any

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        app = kwargs.get("app") or args[0]
        if not app.conf.get("election_url"):
            app.conf.election_url = "memory://"
        super().__init__(*args, **kwargs)
        _made.append(self)

    def setup_schedule(self) -> None:
        super().setup_schedule()  # type: ignore[misc]
        assert self.wait_for_leadership(LEAD_WITHIN)  # type: ignore[attr-defined]

    def tick(self, *args: Any, **kwargs: Any) -> Any:
        assert self.wait_for_leadership(LEAD_WITHIN)  # type: ignore[attr-defined]
        return super().tick(*args, **kwargs)  # type: ignore[misc]


class LeaderBaseScheduler(
    _Leading, LeaderSchedulerMixin, _stock_scheduler, metaclass=_IsAScheduler
):
    """``celery.beat.Scheduler`` with the election."""


class LeaderPersistentScheduler(_Leading, LeaderScheduler):
    """``celery.beat.PersistentScheduler`` with the election: our LeaderScheduler."""


beat.Scheduler = LeaderBaseScheduler  # type: ignore[misc]
beat.PersistentScheduler = LeaderPersistentScheduler  # type: ignore[misc]


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_teardown(item: pytest.Item) -> None:
    # Stop only what the election started: the scheduler itself is the test's (a test
    # may leave it half-mocked, e.g. a dict as its store, and never close it).
    while _made:
        scheduler = _made.pop()
        election, scheduler._election = scheduler._election, None
        if election is not None:
            election.close()


# Parametrized test ids show the class names: keep Celery's, so stock and leader runs
# name the same tests alike.
for _cls, _name in (
    (LeaderBaseScheduler, "Scheduler"),
    (LeaderPersistentScheduler, "PersistentScheduler"),
):
    _cls.__name__ = _cls.__qualname__ = _name
