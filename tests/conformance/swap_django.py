"""pytest plugin: django-celery-beat's scheduler tests with the mixin over DatabaseScheduler.

Loaded with ``-p swap_django``; the swap happens once Django is set up (pytest-django) and
before the test module imports ``DatabaseScheduler``. Leadership is won for real on a
memory backend, as in ``swap_celery``.
"""

from __future__ import annotations

from typing import Any

import pytest

_made: list[Any] = []
LEAD_WITHIN = 5.0


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    import django

    django.setup()
    import django_celery_beat.schedulers as schedulers

    from celery_election.beat import LeaderSchedulerMixin

    stock = schedulers.DatabaseScheduler

    class LeaderDatabaseScheduler(LeaderSchedulerMixin, stock):  # type: ignore[misc,valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            app = kwargs.get("app") or args[0]
            if not app.conf.get("election_url"):
                app.conf.election_url = "memory://"
            super().__init__(*args, **kwargs)
            _made.append(self)

        def setup_schedule(self) -> None:
            super().setup_schedule()
            assert self.wait_for_leadership(LEAD_WITHIN)

        def tick(self, *args: Any, **kwargs: Any) -> Any:
            assert self.wait_for_leadership(LEAD_WITHIN)
            return super().tick(*args, **kwargs)

    schedulers.DatabaseScheduler = LeaderDatabaseScheduler  # type: ignore[misc]


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_teardown(item: pytest.Item) -> None:
    # Stop only what the election started: the scheduler itself is the test's (a test
    # may leave it half-mocked, e.g. a dict as its store, and never close it).
    while _made:
        scheduler = _made.pop()
        election, scheduler._election = scheduler._election, None
        if election is not None:
            election.close()
