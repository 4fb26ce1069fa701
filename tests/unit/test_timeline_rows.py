"""The timeline's one row per entry: how the database spells it, and how it is read back.

``SQLScheduleStore.marks`` has the database join an entry's columns into strings (a day of
a thousand entries is ~100,000 marks, too many rows to fetch one by one); ``entry_marks``
reads such a row. Its database-backed behaviour is tests/integration/test_schedule_store.py.
"""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from sqlalchemy.dialects import mysql, postgresql, sqlite

from celery_election.backends.schema import ordered_concat
from celery_election.schedule.marks import MARKS, EntryMarks, entry_marks

LATE, FAILED, ON_TIME = MARKS.index("late"), MARKS.index("failed"), MARKS.index("on-time")


def test_a_row_reads_as_one_value_a_column() -> None:
    got = entry_marks("k", "0,3,7", f"{ON_TIME}{LATE}{FAILED}", "1,4,2", ",2000000,")
    assert got == EntryMarks(
        "k", (0, 3, 7), (ON_TIME, LATE, FAILED), (1, 4, 2), (None, 2_000_000, None)
    )


def test_a_row_the_database_did_not_keep_in_order_is_sorted_by_column() -> None:
    """SQLite before 3.44 cannot be asked for an order inside group_concat."""
    got = entry_marks("k", "7,0,3", f"{FAILED}{ON_TIME}{LATE}", "2,1,4", ",,2000000")
    assert got == EntryMarks(
        "k", (0, 3, 7), (ON_TIME, LATE, FAILED), (1, 4, 2), (None, 2_000_000, None)
    )


def test_a_row_cut_short_by_the_databases_limit_is_an_error_not_a_shorter_timeline() -> None:
    with pytest.raises(ValueError, match="group_concat_max_len"):
        entry_marks("k", "0,3,7", f"{ON_TIME}{LATE}", "1,4,2", ",2000000,")


@pytest.mark.parametrize(
    ("dialect", "sql"),
    [
        (sqlite.dialect(), "group_concat(t.v, ',')"),
        (postgresql.dialect(), "string_agg(CAST(t.v AS TEXT), ',' ORDER BY t.c)"),
        (mysql.dialect(), "GROUP_CONCAT(t.v ORDER BY t.c SEPARATOR ',')"),
    ],
)
def test_each_database_spells_the_ordered_concatenation(dialect: sa.Dialect, sql: str) -> None:
    t = sa.table("t", sa.column("v"), sa.column("c"))
    assert str(ordered_concat(t.c.v, t.c.c, ",").compile(dialect=dialect)) == sql
    digits = ordered_concat(t.c.v, t.c.c, "")
    assert str(digits.compile(dialect=dialect)) == sql.replace("','", "''")
    # compiled statements are cached by key: the separator must be part of it
    assert ordered_concat(t.c.v, t.c.c, ",")._generate_cache_key() != digits._generate_cache_key()


def test_only_the_separators_the_timeline_uses_are_accepted() -> None:
    with pytest.raises(ValueError, match="separator"):
        ordered_concat(sa.column("v"), sa.column("c"), "';--")
