"""django-celery-beat's DatabaseScheduler, sending only on the elected beat."""

from django_celery_beat.schedulers import DatabaseScheduler

from celery_election.beat import LeaderSchedulerMixin


class LeaderDatabaseScheduler(LeaderSchedulerMixin, DatabaseScheduler):
    """Run `celery -A proj beat -S proj.schedulers:LeaderDatabaseScheduler` on every host."""
