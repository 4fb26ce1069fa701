"""What a scheduler's own schedule adds to the fence's rules: the ``RunPolicy``.

``LeaderSchedulerMixin`` asks its policy at the few points where a schedule kept beside
Celery's (the operable schedule of ``beat/ops.py``) knows more than the entries do:
before a tick (runs asked for now), when an entry is due (catch-up and overlap), at a
reserve, a send, a promotion and the end. Each hook takes values and returns values; the
scheduler acts on them (the claims, Celery's heap). The mixin alone uses
:class:`RunPolicy` itself (each hook answers that it adds nothing); ``LeaderScheduler``
plugs in ``ops.ScheduleOps``, a subclass.

Where a new beat policy goes: a hook here (its body the no-op answer), its rule as a pure
function (like ``catchup.decide``), its state in ``ScheduleOps``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from ..backends.base import RunState
from .catchup import Decision
from .election import BeatTerm

__all__ = ["RunNow", "RunPolicy", "has_row"]


class RunNow(NamedTuple):
    """A "run now" this leader won: send ``entry`` once, unreserved, as request ``key``."""

    entry: Any
    key: int


class RunPolicy:
    """The questions ``LeaderSchedulerMixin`` asks of the schedule it serves.

    Each hook's body is the answer of no schedule beside Celery's: the entries say everything.
    """

    def promote(self, lead: BeatTerm) -> bool:
        """Newly leading, before the shared run state is loaded; False: not yet.

        False defers the promotion to the next tick (the schedule's own state could not
        be read).
        """
        return True

    def before_tick(self, lead: BeatTerm | None) -> list[RunNow]:
        """A tick begins (``lead``: None when not leading); the runs to send now."""
        return []

    def next_tick_within(self) -> float | None:
        """The longest a tick may sleep (None: Celery's ``max_interval`` decides)."""
        return None

    def verdict(self, entry: Any, lead_now: Callable[[], BeatTerm | None]) -> Decision | None:
        """What to do with a due entry (None: send it, as Celery says).

        ``lead_now``: the leadership to decide under, asked only for an entry the policy
        has a say in (None: not leading, no verdict); a burst's other entries cost nothing.
        """
        return None

    def skipped(self, entry: Any, lead: BeatTerm, decision: Decision, run_key: int) -> None:
        """The runs ``decision`` dropped were claimed as skipped (after run ``run_key``)."""
        return None

    def reserved(self, entry: Any, next_entry: Any) -> None:
        """Celery reserved ``entry``: ``next_entry`` replaces it in the schedule."""
        return None

    def schedule_unchanged(self, schedule: Any) -> bool:
        """Whether ``schedule`` is known equal to its copy (Celery need not compare)."""
        return False

    def schedule_compared(self, schedule: Any, equal: bool) -> None:
        """Celery compared ``schedule`` with its copy and answered ``equal``."""
        return None

    def live_names(self, schedule: Mapping[str, Any]) -> set[str]:
        """The entries that exist (sent now or not): the others' run state is retired."""
        return set(schedule)

    def follows_deploys(self, entry: Any) -> bool:
        """Whether an entry new to the shared state counts from the promotion.

        A static entry without a row of its own: its start is when it was deployed.
        """
        return not has_row(entry)

    def identity(self, entry: Any) -> str | None:
        """The entry's run-state identity, or None: the scheduler's own rule decides."""
        return None

    def next_run_at(self, entry: Any, new_entry: Any) -> Any:
        """The last_run_at a reserved run stores (``new_entry.last_run_at``: Celery's now)."""
        return new_entry.last_run_at

    def send_headers(self, entry: Any) -> dict[str, Any]:
        """Headers added to a send beside the term and the run."""
        return {}

    def due_at(self, entry: Any, run: RunState | None) -> int | None:
        """When the run claimed after ``run`` fell due (database clock), or None: unknown.

        Its row keeps it, and the history shows how late the run went out.
        """
        return None

    def sent(self, entry: Any, term: int, run: int | None, run_now: int | None) -> None:
        """A run was published.

        ``run``: its key; None for an unreserved send, which ``run_now`` names if it was
        a "run now" request.
        """
        return None

    def bursting(self, going_on: bool) -> None:
        """A burst goes on (``going_on``), or it is over: writes that can wait, wait."""
        return None

    def close(self) -> None:
        """The scheduler stops."""
        return None


def has_row(entry: Any) -> bool:
    """Whether the entry keeps its run state on a row of its own (django-celery-beat)."""
    return hasattr(getattr(entry, "model", None), "last_run_at")
