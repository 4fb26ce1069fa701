"""Django configured the way the django-celery-beat tests need it, in one place."""

from __future__ import annotations


def configure(default_db: str) -> bool:
    """Configure Django with django-celery-beat on a SQLite ``default_db``, once.

    Returns whether this call configured it (a process configures Django once: the
    first test module to ask decides the default database).
    """
    import django
    from django.conf import settings

    configured_here = not settings.configured
    if configured_here:
        settings.configure(
            SECRET_KEY="test-only",
            USE_TZ=True,
            TIME_ZONE="UTC",
            INSTALLED_APPS=["django_celery_beat"],
            DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": default_db}},
            DEFAULT_AUTO_FIELD="django.db.models.AutoField",
        )
    django.setup()  # idempotent
    return configured_here
