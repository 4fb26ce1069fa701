"""One report refresh at a time per account: ``singleton_task``, its ``on_busy``, its term.

    python examples/singleton_report.py [--url URL]

``refresh_report(account, version)`` rebuilds an account's report. Two refreshes of one
account must never run at once (they would interleave their writes), refreshes of two
accounts may. ``@singleton_task(unique_on=["account"])`` holds the key "refresh_report +
account" in the election database while the body runs; a second refresh of that account,
meanwhile, comes back later (``on_busy="requeue"``, the default). Each run gets the key's
term (``self.singleton_term``), which grows each time the key changes hands, and writes
with it: the database refuses a write whose term is older than the row's, so a run that
was paused past its hold (and replaced) cannot overwrite its successor's report.

For the demo, the worker runs in this process (Celery's in-process worker, 4 threads,
the memory broker) and the election database is a SQLite file in a temporary directory;
in production it is ``celery -A proj worker`` on any number of hosts and your
PostgreSQL or MySQL. Exit status 0: one run at a time per account, terms growing, and
the stale write refused.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import tempfile
import threading
import time
from typing import Any

import sqlalchemy as sa
from celery import Celery

from celery_election import singleton_task
from celery_election.backends import backend_from_url
from celery_election.testing import worker

runs: list[tuple[int, int, int, float, float]] = []  # account, version, term, start, end
lock = threading.Lock()
metadata = sa.MetaData()
reports = sa.Table(
    "report",
    metadata,
    sa.Column("account", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("body", sa.Text, nullable=False),
    sa.Column("term", sa.BigInteger, nullable=False),  # the term of the last write
)


def fenced_write(engine: sa.Engine, account: int, body: str, term: int) -> bool:
    """Write the report unless a run with a newer term has written it; True if it landed."""
    with engine.begin() as conn:
        stmt = sa.update(reports).where(reports.c.account == account, reports.c.term <= term)
        return conn.execute(stmt.values(body=body, term=term)).rowcount == 1


def make_app(url: str, engine: sa.Engine) -> tuple[Celery, Any]:
    app = Celery("singleton-demo", broker="memory://", backend="cache+memory://")
    app.conf.update(election_url=url, broker_transport_options={"polling_interval": 0.01})

    @singleton_task(app=app, bind=True, unique_on=["account"], requeue_delay=0.1)
    def refresh_report(self: Any, account: int, version: int) -> int:
        term = self.singleton_term  # grows each time this account's key changes hands
        started = time.monotonic()
        time.sleep(0.3)  # building the report
        fenced_write(engine, account, f"version {version}", term)
        with lock:
            runs.append((account, version, term, started, time.monotonic()))
        return int(term)

    return app, refresh_report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="election database (default: a SQLite file)")
    args = parser.parse_args()
    tmp = tempfile.TemporaryDirectory(prefix="celery-election-singleton-")
    url = args.url or f"sqlite:///{os.path.join(tmp.name, 'election.db')}"
    backend_from_url(url).install()  # or: celery -A proj election install
    engine = sa.create_engine(url)
    metadata.create_all(engine)
    with engine.begin() as conn:
        conn.execute(sa.delete(reports))
        conn.execute(sa.insert(reports), [{"account": a, "body": "", "term": 0} for a in (1, 2)])
    app, refresh_report = make_app(url, engine)
    with worker(app, pool="threads", concurrency=4):
        sent = [refresh_report.delay(1, v) for v in (1, 2, 3)] + [refresh_report.delay(2, 1)]
        for result in sent:
            result.get(timeout=30, interval=0.01)
    ok, base = True, min(r[3] for r in runs)
    for account in (1, 2):
        mine = sorted((r for r in runs if r[0] == account), key=lambda r: r[3])
        for _, version, term, start, end in mine:
            print(f"account {account}: version {version} ran {start - base:.2f}-"
                  f"{end - base:.2f} s, term {term}")  # fmt: skip
        for before, after in itertools.pairwise(mine):
            ok &= after[3] >= before[4] and after[2] > before[2]  # after it ended, a new term
    first = min((r for r in runs if r[0] == 1), key=lambda r: r[3])
    stale = fenced_write(engine, 1, "late write of the first run", first[2])
    print(f"the first run of account 1 writes late with term {first[2]}: "
          f"{'accepted' if stale else 'refused'}")  # fmt: skip
    ok &= not stale
    engine.dispose()
    print("OK: one run at a time per account" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
