"""The tables the e2e project's tasks write (tests/e2e/proj.py) and the harness reads.

One definition for both sides: the project's workers record each run, transition and
beat tick there; ``harness.cluster`` reads them to judge a run. Named by the run's table
prefix, so concurrent runs do not share them.
"""

from __future__ import annotations

from typing import NamedTuple

import sqlalchemy as sa

__all__ = ["E2ETables", "e2e_tables"]


class E2ETables(NamedTuple):
    runs: sa.Table
    transitions: sa.Table
    ticks: sa.Table


def e2e_tables(prefix: str) -> E2ETables:
    """The three tables under ``prefix``, in one MetaData of their own."""
    metadata = sa.MetaData()
    runs = sa.Table(
        f"{prefix}runs",
        metadata,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("task", sa.String(50)),
        sa.Column("label", sa.String(50)),
        sa.Column("worker", sa.String(200)),
        sa.Column("pid", sa.Integer),
        sa.Column("term", sa.BigInteger, nullable=True),
    )
    transitions = sa.Table(
        f"{prefix}transitions",
        metadata,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("worker", sa.String(200)),
        sa.Column("kind", sa.String(20)),
        sa.Column("term", sa.BigInteger),
        sa.Column("reason", sa.String(20), nullable=True),
        sa.Column("at", sa.BigInteger),  # the database clock, epoch microseconds
    )
    ticks = sa.Table(
        f"{prefix}ticks",
        metadata,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("entry", sa.String(50)),
        sa.Column("run", sa.BigInteger, nullable=True),  # the run's key, from the beat's header
        sa.Column("term", sa.BigInteger, nullable=True),
        sa.Column("worker", sa.String(200)),
        sa.Column("task_id", sa.String(64), nullable=True),
        sa.Column("started_at", sa.BigInteger, nullable=True),  # database clock, epoch us
        sa.Column("ended_at", sa.BigInteger, nullable=True),
    )
    return E2ETables(runs, transitions, ticks)
