"""A task only the elected worker runs, and a plain one any worker runs."""

import functools
import json
import os
import time

import sqlalchemy as sa
from celery import shared_task
from celery.utils.log import get_task_logger
from sqlalchemy.schema import CreateTable

from celery_election import leader_task

from .celery import sqlite_file

log = get_task_logger(__name__)

#: Each refresh adds a snapshot, stamped with the election term it was written under.
reports = sa.Table(
    "reports",
    sa.MetaData(),
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("term", sa.BigInteger, nullable=False),
    sa.Column("worker", sa.String(200), nullable=False),
    sa.Column("payload", sa.Text, nullable=False),
)


@functools.cache
def engine() -> sa.Engine:
    """The app's database, opened on first use (in the pool process that runs the task)."""
    url = os.environ.get("APP_DATABASE_URL", sqlite_file("app.sqlite3"))
    eng = sa.create_engine(url)
    with eng.begin() as conn:
        conn.execute(CreateTable(reports, if_not_exists=True))
    return eng


@leader_task(bind=True)
def refresh_report(self) -> int:
    """Rebuild the report. Only the leader runs it: a follower sends it back to the leader."""
    term = self.election_term  # the fencing token: store it with what you write
    payload = json.dumps({"generated_at": time.time()})
    with engine().begin() as conn:
        conn.execute(
            sa.insert(reports).values(term=term, worker=self.request.hostname, payload=payload)
        )
    log.info("report refreshed by %s under term %s", self.request.hostname, term)
    return term


@shared_task
def add(x: int, y: int) -> int:
    """Any worker runs this, leader or not."""
    return x + y
