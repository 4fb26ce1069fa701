"""What a scheduler's own schedule adds to the fence's rules: the ``RunPolicy``.

``LeaderSchedulerMixin`` asks its policy at the few points where a schedule kept beside
Celery's (the operable schedule of ``beat/ops.py``) knows more than the entries do. The
mixin alone uses :class:`DefaultRunPolicy` (it adds nothing); ``LeaderScheduler`` plugs in
``ops.ScheduleOps``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from .election import Leadership

__all__ = ["DefaultRunPolicy", "RunPolicy", "has_row"]


class RunPolicy(Protocol):
    """The questions ``LeaderSchedulerMixin`` asks of the schedule it serves."""

    def promote(self, lead: Leadership) -> bool:
        """Newly leading, before the shared run state is loaded; False: not yet.

        False defers the promotion to the next tick (the schedule's own state could not
        be read).
        """
        ...

    def live_names(self, schedule: Mapping[str, Any]) -> set[str]:
        """The entries that exist (sent now or not): the others' run state is retired."""
        ...

    def follows_deploys(self, entry: Any) -> bool:
        """Whether an entry new to the shared state counts from the promotion."""
        ...

    def identity(self, entry: Any) -> str | None:
        """The entry's run-state identity, or None: the scheduler's own rule decides."""
        ...

    def next_run_at(self, entry: Any, new_entry: Any) -> Any:
        """The last_run_at a reserved run stores (``new_entry.last_run_at``: Celery's now)."""
        ...

    def send_headers(self, entry: Any) -> dict[str, Any]:
        """Headers added to a send beside the term and the run."""
        ...

    def sent(self, entry: Any, result: Any, term: int, run: int | None) -> None:
        """A run was published (``run``: its key; None for an unreserved send)."""
        ...


class DefaultRunPolicy:
    """No schedule beside Celery's: the entries say everything."""

    def promote(self, lead: Leadership) -> bool:
        return True

    def live_names(self, schedule: Mapping[str, Any]) -> set[str]:
        return set(schedule)

    def follows_deploys(self, entry: Any) -> bool:
        """A static entry without a row of its own: its start is when it was deployed."""
        return not has_row(entry)

    def identity(self, entry: Any) -> str | None:
        return None

    def next_run_at(self, entry: Any, new_entry: Any) -> Any:
        return new_entry.last_run_at

    def send_headers(self, entry: Any) -> dict[str, Any]:
        return {}

    def sent(self, entry: Any, result: Any, term: int, run: int | None) -> None:
        return None


def has_row(entry: Any) -> bool:
    """Whether the entry keeps its run state on a row of its own (django-celery-beat)."""
    return hasattr(getattr(entry, "model", None), "last_run_at")
