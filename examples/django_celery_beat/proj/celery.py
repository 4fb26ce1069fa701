import os

from celery import Celery

from celery_election import init_app

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "proj.settings")

app = Celery("proj")
app.config_from_object("django.conf:settings", namespace="CELERY")
init_app(app)


@app.task
def job() -> str:
    return "done"
