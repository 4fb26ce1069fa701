"""Django settings of the beats: the database, election URL and table prefix come from the
environment the test gives each ``celery beat`` process."""

import json
import os

SECRET_KEY = "test-only"
USE_TZ = True
TIME_ZONE = "UTC"
INSTALLED_APPS = ["django_celery_beat"]
DATABASES = {"default": json.loads(os.environ["DJADMIN_DB"])}
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"

CELERY_BROKER_URL = "memory://"  # the sends go nowhere: the schedulers record them
CELERY_TIMEZONE = "UTC"
CELERY_RESULT_EXPIRES = None  # no celery.backend_cleanup entry
CELERY_ELECTION_URL = os.environ.get("DJADMIN_ELECTION_URL")
CELERY_ELECTION_TABLE_PREFIX = os.environ.get("DJADMIN_ELECTION_PREFIX")
CELERY_ELECTION_TTL = 3
