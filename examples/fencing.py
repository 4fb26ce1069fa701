"""Fencing your own writes with the election term, so a stale leader changes nothing.

    python examples/fencing.py [--url URL]

A leader can lose its lease and not know it yet: a long GC pause, a frozen VM, a task that
checked ``is_leader`` and then ran for a minute. Meanwhile another process is elected under
a greater term and writes. When the old leader wakes up, its write must not land. So every
write carries the term it was decided under, and the database refuses older terms:

    UPDATE report SET payload = :p, term = :term WHERE id = :id AND term <= :term

One row changed: the write landed. None: a newer leader has written; drop the result.

This script plays both nodes in one process (two Electors on one database): node-a leads
and writes, loses the lease (here it resigns; in life its lease runs out while it is
paused), node-b is elected under a greater term and writes, then node-a's late write with
its old term is refused. Exit status 0 means the stale write was refused.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import sqlalchemy as sa
from sqlalchemy.schema import CreateTable

from celery_election import Elector, backend_from_url


def report_table(name: str) -> sa.Table:
    return sa.Table(
        name,
        sa.MetaData(),
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("payload", sa.Text, nullable=False),
        sa.Column("term", sa.BigInteger, nullable=False),  # the term of the last write
    )


def fenced_write(engine: sa.Engine, report: sa.Table, row_id: int, payload: str, term: int) -> bool:
    """Write ``payload`` unless a newer term has written already; True if it landed."""
    with engine.begin() as conn:
        result = conn.execute(
            sa.update(report)
            .where(report.c.id == row_id, report.c.term <= term)
            .values(payload=payload, term=term)
        )
    return result.rowcount == 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="database (default: a SQLite file in a temporary dir)")
    parser.add_argument("--namespace", default="fencing-demo")
    parser.add_argument("--table", default="report", help="the table to write to")
    parser.add_argument("--table-prefix", default=None, help="of the election's tables")
    args = parser.parse_args()

    tmp = tempfile.TemporaryDirectory(prefix="celery-election-fencing-")
    url = args.url or f"sqlite:///{os.path.join(tmp.name, 'app.db')}"
    options = {} if args.table_prefix is None else {"table_prefix": args.table_prefix}

    # Your application's own table, in your own database (here: the election's database).
    engine = sa.create_engine(url)
    report = report_table(args.table)
    with engine.begin() as conn:
        conn.execute(CreateTable(report, if_not_exists=True))
        conn.execute(sa.delete(report).where(report.c.id == 1))
        conn.execute(sa.insert(report).values(id=1, payload="(empty)", term=0))

    # Two nodes, each with its own connection to the election: as if two processes.
    backends = [backend_from_url(url, **options) for _ in range(2)]
    backends[0].install()
    a = Elector(backends[0], args.namespace, "node-a", ttl=3, poll_interval=0.2)
    b = Elector(backends[1], args.namespace, "node-b", ttl=3, poll_interval=0.2)
    print(f"database: {backends[0].description}, table {args.table!r}")
    try:
        a.start()
        if not a.wait_for_leadership(10):
            print("node-a was not elected", file=sys.stderr)
            return 1
        b.start()
        old_term = a.term
        assert old_term is not None
        print(f"node-a leads, term {old_term}")
        ok = fenced_write(engine, report, 1, "written by node-a", old_term)
        print(f"node-a writes with term {old_term}: {'accepted' if ok else 'REFUSED'}")
        first_ok = ok

        # node-a started a long piece of work under old_term... and loses the lease.
        a.resign()
        if not b.wait_for_leadership(10):
            print("node-b was not elected", file=sys.stderr)
            return 1
        new_term = b.term
        assert new_term is not None
        print(f"node-a lost the lease; node-b leads, term {new_term} (> {old_term})")
        second_ok = fenced_write(engine, report, 1, "written by node-b", new_term)
        print(f"node-b writes with term {new_term}: {'accepted' if second_ok else 'REFUSED'}")

        # node-a wakes up and finishes its work, still holding the term it started with.
        stale_ok = fenced_write(engine, report, 1, "late write by node-a", old_term)
        print(
            f"node-a (stale) writes with term {old_term}: "
            f"{'ACCEPTED: the fence failed' if stale_ok else 'refused'}"
        )
        with engine.connect() as conn:
            row = conn.execute(sa.select(report).where(report.c.id == 1)).one()
        print(f"row 1 now: payload={row.payload!r} term={row.term}")

        held = (
            first_ok
            and second_ok
            and not stale_ok
            and new_term > old_term
            and (row.payload, row.term) == ("written by node-b", new_term)
        )
        print("OK: the stale write was refused" if held else "FAILED")
        return 0 if held else 1
    finally:
        a.stop()
        b.stop()
        for backend in backends:
            backend.close()
        engine.dispose()
        tmp.cleanup()


if __name__ == "__main__":
    sys.exit(main())
