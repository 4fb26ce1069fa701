import os

from celery import Celery

from celery_election import init_app

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.e2e.djadmin.settings")

app = Celery("djadmin")
app.config_from_object("django.conf:settings", namespace="CELERY")
init_app(app)
