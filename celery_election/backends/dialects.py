"""How each database runs a lease step: the dialects' differences, as small objects.

SQLAlchemy compiles the statements themselves. What differs is the shape of a step:

* ``RETURNING`` (SQLite): the conditional UPDATE returns the row it changed;
* ``ROWCOUNT`` (MySQL/MariaDB, no UPDATE ... RETURNING): the step reports whether it
  matched, and the row after it is read with a second statement;
* PostgreSQL (``postgres.NotifyStyle``): one statement that updates, returns the row
  whether the step won or lost, and sends NOTIFY to the other candidates.

To add a dialect: pick or write a ``StepStyle`` here, then teach ``schema.py`` its clock
and ``connection.classify`` its error codes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

__all__ = ["RETURNING", "ROWCOUNT", "StepStyle"]


@dataclass(frozen=True)
class StepStyle:
    """The shape of one lease step on a dialect."""

    #: the step's statement returns the row as it is after the step
    returning: bool
    #: a losing step returns the row too, so looking at the lease needs no read first
    reads_in_step: bool = False

    def statement(
        self, update: sa.Update, columns: Sequence[sa.ColumnElement[Any]], event: str
    ) -> sa.Executable:
        """The statement that runs ``update`` (``event``: what the step does, for NOTIFY)."""
        return update.returning(*columns) if self.returning else update


RETURNING = StepStyle(returning=True)
ROWCOUNT = StepStyle(returning=False)
