"""Catch-up and overlap: what the operable schedule's policies make of a due run.

:func:`decide` (pure; tables in ``tests/unit/test_schedule_rules.py``) gives the policies'
:class:`Decision` on the due times an entry missed (``core.due.due_times``). A run they
drop is still *claimed* (the entry's run state moves past it under the leader's term, with
its run count unchanged), so the next leader does not send it either.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ..schedule.spec import SKIP_GRACE

__all__ = ["SEND", "Decision", "decide"]


@dataclass(frozen=True)
class Decision:
    """What to do with a due run: send it, or drop ``count`` runs.

    Sent, its run stores ``send_as`` as last_run_at (None: Celery's now); dropped, the run
    state moves to ``skip_to``.
    """

    skip_to: datetime | None = None
    kind: str = ""  # missed (catch-up, resume) / skipped (overlap)
    count: int = 0
    send_as: datetime | None = None


SEND = Decision()


def decide(
    times: list[datetime],
    now: datetime,
    policies: dict[str, Any],
    *,
    skip_before: datetime | None = None,
    busy: bool = False,
) -> Decision:
    """The policies' verdict on a due entry whose missed due times are ``times``.

    * ``busy`` (overlap ``skip`` and the previous run has not finished): skip this run.
    * ``skip_before`` (resumed with ``missed="skip"``): what fell due before it is missed.
    * Runs due longer ago than the grace window are missed (``catch_up="skip"``: 1 s by
      default); ``latest`` then sends one run for the rest, ``all`` one run per due time
      (the latest ``catch_up_max``), each stored as the due time it stands for.
    """
    if busy:
        return Decision(skip_to=now, kind="skipped", count=1)
    if not times:
        return SEND
    if skip_before is not None and times[0] < skip_before:
        before = [t for t in times if t < skip_before]
        return Decision(skip_to=min(skip_before, now), kind="missed", count=len(before))
    grace = policies.get("grace")
    if grace is None and policies["catch_up"] == "skip":
        grace = SKIP_GRACE
    if grace is not None:
        late = [t for t in times if (now - t).total_seconds() > grace]
        if late:
            to = now if len(late) == len(times) else late[-1]
            return Decision(skip_to=to, kind="missed", count=len(late))
    if policies["catch_up"] == "all":
        most = int(policies["catch_up_max"])
        if len(times) > most:
            return Decision(skip_to=times[-most - 1], kind="missed", count=len(times) - most)
        return Decision(send_as=times[0])
    return SEND
