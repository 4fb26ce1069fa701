"""A minimal Django project using django-celery-beat, with leader election."""

import os
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
SECRET_KEY = "example-only"
USE_TZ = True
TIME_ZONE = "UTC"
INSTALLED_APPS = ["django_celery_beat"]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("EXAMPLE_DB", str(BASE_DIR / "db.sqlite3")),
    }
}
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"

# Celery reads the CELERY_-prefixed settings; these are celery_election's election_*.
CELERY_BROKER_URL = os.environ.get("EXAMPLE_BROKER", "memory://")
CELERY_ELECTION_URL = os.environ.get("EXAMPLE_ELECTION_URL", f"sqlite:///{BASE_DIR}/election.db")
CELERY_ELECTION_TTL = 5
CELERY_BEAT_SCHEDULER = "proj.schedulers:LeaderDatabaseScheduler"
