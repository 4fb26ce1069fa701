"""The Celery app, configured from the environment.

CELERY_BROKER_URL          the broker (default: a SQLite file beside this project)
CELERY_ELECTION_URL        the election database (default: a SQLite file of its own, never
                           the broker's); `celery election ...` reads it too
CELERY_ELECTION_NAMESPACE  who competes with whom (default "quickstart")
APP_DATABASE_URL           where the tasks keep the report (default: a SQLite file here)
"""

import os
from pathlib import Path

from celery import Celery

from celery_election import init_app

# Absolute paths: two workers started from different directories must share one election.
HERE = Path(__file__).resolve().parent.parent


def sqlite_file(name: str) -> str:
    return f"sqlite:///{HERE / name}"


app = Celery(
    "proj",
    broker=os.environ.get("CELERY_BROKER_URL", "sqla+" + sqlite_file("broker.sqlite3")),
    include=["proj.tasks"],
)
app.conf.update(
    election_url=os.environ.get("CELERY_ELECTION_URL", sqlite_file("election.sqlite3")),
    election_namespace=os.environ.get("CELERY_ELECTION_NAMESPACE", "quickstart"),
    beat_schedule={
        # A leader task: beat sends it to the leader queue, the elected worker runs it.
        "refresh-report": {"task": "proj.tasks.refresh_report", "schedule": 30.0},
    },
    broker_connection_retry_on_startup=True,
)
init_app(app)
