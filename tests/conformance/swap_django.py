"""pytest plugin: django-celery-beat's scheduler tests with the mixin over DatabaseScheduler.

Loaded with ``-p swap_django``; the swap happens once Django is set up (pytest-django) and
before the test module imports ``DatabaseScheduler``. Leadership is won for real on a
memory backend, as in ``swap_celery``.
"""

from __future__ import annotations

import leading
import pytest
from leading import Leading

pytest_runtest_teardown = leading.pytest_runtest_teardown


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    import django

    django.setup()
    import django_celery_beat.schedulers as schedulers

    from celery_election.beat import LeaderSchedulerMixin

    stock = schedulers.DatabaseScheduler

    class LeaderDatabaseScheduler(Leading, LeaderSchedulerMixin, stock):  # type: ignore[misc,valid-type]
        """django-celery-beat's DatabaseScheduler with the election."""

    schedulers.DatabaseScheduler = LeaderDatabaseScheduler  # type: ignore[misc]
