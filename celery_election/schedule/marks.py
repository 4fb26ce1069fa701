"""The schedule page's timeline in SQL: what a run looks like, the queries that group runs.

A run's mark (on time, run now, late, skipped, missed, failed) is computed by the database
(``mark_of``, ``rank_of``) so that a day of history is grouped there, one row per entry
(``marks_statement``), and by ``run_mark`` in Python for the few runs a page lists. The
store runs these queries (``SQLScheduleStore.marks``, ``SQLScheduleStore.runs_in``);
``entry_marks`` reads one row of the first.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

import sqlalchemy as sa

from ..backends.schema import ordered_concat
from ..core.runstate import DROPPED

if TYPE_CHECKING:
    from .records import RunRecord

__all__ = [
    "FAILED_OUTCOMES",
    "LATE_US",
    "MARKS",
    "EntryMarks",
    "entry_marks",
    "late",
    "mark_of",
    "marks_statement",
    "open_run_statement",
    "rank_of",
    "run_mark",
    "runs_in_statements",
    "sent_runs",
]

#: What a run looks like on the schedule page's timeline, least to most worrying: a column
#: of the timeline that holds several runs shows the last of these that any of them is.
MARKS = ("on-time", "run-now", "late", "skipped", "missed", "failed")
#: The outcomes that mark a run failed.
FAILED_OUTCOMES = ("FAILURE", "REVOKED", "REJECTED", "IGNORED")
#: A run sent more than this after it fell due is late (a tick is ~10 ms late): microseconds.
LATE_US = 500_000
#: A run's rank in the timeline's grouping is its mark times this, plus how late it was
#: (microseconds) when its mark is late: the worst run of a column, and the most late of the
#: late ones, are then one MAX. Any lateness (< sent_at, < 10**18 µs) stays below the next mark.
_RANK = 10**18


class EntryMarks(NamedTuple):
    """One entry's runs in the columns of the timeline (``SQLScheduleStore.marks``).

    One element per column that has runs, by column, in parallel tuples (not an object per
    column: a day of a thousand entries is ~100,000 of them): ``columns`` (counted from the
    window's start), ``marks`` (the worst of its runs, an index of :data:`MARKS`), ``runs``
    (how many history rows) and ``late_us`` (where the mark is late: how late the most late
    run was; else None).
    """

    entry_key: str
    columns: tuple[int, ...]
    marks: tuple[int, ...]
    runs: tuple[int, ...]
    late_us: tuple[int | None, ...]


def late(r: sa.Table) -> sa.ColumnElement[bool]:
    """A run (of the run rows ``r``, ``task_start``) was sent late (SQL, per row)."""
    return sa.and_(r.c.due_at.is_not(None), r.c.started_at - r.c.due_at > LATE_US)


def sent_runs(t: Any, namespace: str, key: Any) -> sa.ColumnElement[bool]:
    """Entry ``key``'s runs in ``namespace`` a beat claimed to send (on its way, or done).

    Not a dropped one: only a beat's rows have an entry's key, and a policy's are dropped.
    """
    return sa.and_(t.c.namespace == namespace, t.c.entry_key == key, t.c.state != DROPPED)


def mark_of(r: sa.Table, value: Callable[[str], Any] = MARKS.index) -> sa.ColumnElement[int]:
    """A history row's mark, as an index of :data:`MARKS` (SQL, per row).

    ``value``: what each mark stands for instead (:func:`rank_of`'s rank).
    """
    return sa.case(
        (r.c.outcome.in_(FAILED_OUTCOMES), value("failed")),
        (r.c.kind == "skipped", value("skipped")),
        (sa.or_(r.c.kind == "missed", r.c.state == DROPPED), value("missed")),
        (r.c.kind == "run_now", value("run-now")),
        (late(r), value("late")),
        else_=value("on-time"),
    )


def rank_of(r: sa.Table) -> sa.ColumnElement[int]:
    """A history row's mark times ``_RANK``, plus its lateness if late (SQL, per row).

    :func:`mark_of` in the same order, folded with the lateness into one value so the
    grouping keeps one aggregate (the database sorts and folds ~100,000 rows for a day).
    """

    def rank(mark: str) -> Any:
        return MARKS.index(mark) * _RANK + (r.c.started_at - r.c.due_at if mark == "late" else 0)

    return mark_of(r, rank)


def marks_statement(
    r: sa.Table, namespaces: sa.ColumnElement[bool], from_us: int, to_us: int, column_us: int
) -> sa.Select[Any]:
    """The query of ``SQLScheduleStore.marks``: per entry, its columns, marks, runs, lateness.

    ``r`` is the run rows' table, ``namespaces`` which of its rows. Its plan is checked on
    each database (tests/integration/test_schedule_store.py).
    """
    column = ((r.c.started_at - from_us) // max(1, column_us)).label("col")
    per_column = (
        sa.select(
            r.c.entry_key,
            column,
            sa.func.max(rank_of(r)).label("rank"),
            sa.func.count().label("runs"),
        )
        .where(namespaces, r.c.kind.is_not(None))
        .where(r.c.started_at >= from_us, r.c.started_at < to_us)
        .group_by(r.c.entry_key, column)
        .order_by(r.c.entry_key, column)  # SQLite's concatenation keeps this order
        .subquery("per_column")
    )
    g = per_column.c
    mark = g.rank // _RANK
    late_us = sa.case((mark == MARKS.index("late"), g.rank % _RANK), else_=sa.null())
    return (
        sa.select(
            g.entry_key,
            ordered_concat(g.col, g.col, ","),
            ordered_concat(mark, g.col, ""),  # one digit a column
            ordered_concat(g.runs, g.col, ","),
            ordered_concat(sa.func.coalesce(sa.cast(late_us, sa.String), ""), g.col, ","),
        )
        .group_by(g.entry_key)
        .order_by(g.entry_key)
    )


def open_run_statement(r: sa.Table, namespace: str, key: Any) -> sa.Select[Any]:
    """Entry ``key``'s oldest run sent and not finished since its latest run that finished.

    What ``schedule/overdue.py`` holds to the grace; an entry none of whose runs reported
    a finish (workers without the run-once check) has none. Runs before that finish are
    left out: one lost run (its worker killed mid-run) does not keep an entry overdue once
    later runs finish. Two walks of the (namespace, entry key, started_at) index, one from
    each end, whatever the history's size; the latest finish comes along (``last_finish``).
    ``r``: the run rows' table.
    """
    f = r.alias("finished")  # its own walk, never correlated with the row sought
    last = (
        sa.select(f.c.started_at)
        .where(sent_runs(f, namespace, key), f.c.finished_at.is_not(None))
        .order_by(f.c.started_at.desc())
        .limit(1)
        .correlate_except(f)
        .scalar_subquery()
    )
    return (
        sa.select(r, last.label("last_finish"))
        .where(sent_runs(r, namespace, key), r.c.finished_at.is_(None), r.c.started_at > last)
        .order_by(r.c.started_at, r.c.run_key)
        .limit(1)
    )


def runs_in_statements(
    r: sa.Table, namespaces: sa.ColumnElement[bool], key: str, from_us: int, to_us: int, *,
    limit: int = 20,
) -> tuple[sa.Select[Any], sa.Select[Any]]:  # fmt: skip
    """The queries of ``SQLScheduleStore.runs_in``: the runs, and how many of each mark.

    ``r`` is the run rows' table, ``namespaces`` which of its rows.
    """
    mark = mark_of(r)
    where = (namespaces, r.c.entry_key == key, r.c.started_at >= from_us, r.c.started_at < to_us)
    order = (mark.desc(), r.c.started_at, r.c.run_key)
    runs = sa.select(r).where(*where).order_by(*order).limit(limit)
    per = sa.select(mark.label("mark"), r.c.run_key).where(*where).subquery("per_run")
    return runs, sa.select(per.c.mark, sa.func.count()).group_by(per.c.mark)


def entry_marks(key: str, columns: str, marks: str, runs: str, late_us: str) -> EntryMarks:
    """One row of :func:`marks_statement`'s answer as an :class:`EntryMarks`.

    Its strings hold one value a column (``marks``: one digit each, the others separated by
    commas; ``late_us`` empty where the mark is not late), in column order except where the
    database did not keep it (SQLite before 3.44 cannot be told): then sorted here.
    """
    cols = tuple(map(int, columns.split(",")))
    digits = tuple(map(int, marks))
    counts = tuple(map(int, runs.split(",")))
    late = tuple(int(x) if x else None for x in late_us.split(","))
    if not len(cols) == len(digits) == len(counts) == len(late):
        raise ValueError(
            f"the timeline's marks of entry {key} were cut short ({len(cols)} columns, "
            f"{len(digits)} marks): the database's string aggregation limit (MySQL: "
            f"group_concat_max_len) is too small"
        )
    if list(cols) != sorted(cols):  # the columns of a group are distinct
        order = sorted(range(len(cols)), key=cols.__getitem__)
        cols = tuple(cols[i] for i in order)
        digits = tuple(digits[i] for i in order)
        counts = tuple(counts[i] for i in order)
        late = tuple(late[i] for i in order)
    return EntryMarks(key, cols, digits, counts, late)


def run_mark(r: RunRecord) -> str:
    """A history row's mark (one of :data:`MARKS`): what the SQL of ``marks`` computes."""
    if r.outcome in FAILED_OUTCOMES:
        return "failed"
    if r.kind == "skipped":
        return r.kind
    if r.kind == "missed" or r.state == DROPPED:  # a run given up unsent
        return "missed"
    if r.kind == "run_now":
        return "run-now"
    if r.due_at is not None and r.sent_at - r.due_at > LATE_US:
        return "late"
    return "on-time"
