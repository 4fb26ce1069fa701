"""Celery's entries matched with the shared run state (the fence's), and given it.

Each entry's run state (when it last ran, how often) lives in the election database; an
entry holds it when its ``last_run_at`` and ``total_run_count`` are the ones this leader
matched with the stored state. A new leader, or a schedule read again (django-celery-beat
reloads it from its models), gives entries that must be matched (:meth:`Matching.match`).

The shared state never overrides what an operator did, as stock would not (issue 26,
``tests/integration/test_django_workflows.py``): it belongs to the entry's identity
(``LeaderSchedulerMixin.run_state_identity``: django-celery-beat's ``PeriodicTask`` id),
and a row edited after the stored run wins (:meth:`Matching.edited`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from ..backends.base import RunClaim, RunRequest, RunState
from .election import BeatTerm
from .fence import BeatFence
from .policy import RunPolicy, has_row
from .runs import Run

__all__ = ["Matching"]

log = logging.getLogger("celery_election.beat")

_SAME_TIME_US = 1_000_000  # a row within 1 s of the stored run holds it (offsets move)


def state_of(entry: Any) -> tuple[Any, Any]:
    """The run state an entry holds, as matching compares it."""
    return entry.last_run_at, entry.total_run_count


class Matching:
    """Which entries hold the shared state, and the acts that give it to them.

    ``identity`` and ``adopt`` are the scheduler's override points
    (``run_state_identity``, ``adopt_run_state``); ``dirty`` gives django-celery-beat's
    set of rows to write (None for other schedulers).
    """

    def __init__(
        self,
        fence: BeatFence,
        policy: RunPolicy,
        *,
        identity: Callable[[Any], str],
        adopt: Callable[[Any, datetime, int], None],
        dirty: Callable[[], set[Any] | None],
        follow_deploys: bool,
    ) -> None:
        self.fence, self.policy = fence, policy
        self._identity, self._adopt_state, self._dirty = identity, adopt, dirty
        self.follow_deploys = follow_deploys
        # entry name -> the entry's (last_run_at, total_run_count) as matched
        self._seen: dict[str, tuple[Any, Any]] = {}

    def forget(self) -> None:
        """A new term: every entry is matched again."""
        self._seen = {}

    def matched(self, entry: Any) -> None:
        """``entry`` holds the shared state now (it ran, or adopted it)."""
        self._seen[entry.name] = state_of(entry)

    def reconcile(self, schedule: Mapping[str, Any], promoting: BeatTerm | None) -> bool:
        """Match the entries that do not hold the shared state; True if any changed.

        A new leader (``promoting``) records the entries new to the shared state in one
        batch, so the next leader counts from the same point.
        """
        changed = False
        records: list[RunRequest] = []
        for name, entry in list(schedule.items()):
            if self._seen.get(name) != state_of(entry):
                changed = self.match(entry, promoting, records) or changed
        if promoting is not None and records:
            self.fence.store_states(promoting, records)
        return changed

    def match(self, entry: Any, promoting: BeatTerm | None, records: list[RunRequest]) -> bool:
        """One entry against the shared state; True if the entry's state changed.

        * The stored state is another entry's (a different identity: deleted and
          re-created, a name retired by a deploy) or there is none: the entry keeps its
          own state, as stock keeps it (django-celery-beat's row, or the time the entry
          appeared). A static entry of ``follow_deploys`` that never ran here counts from
          the promotion, as in a beat started then (one that ran keeps the shelve's last
          run, as a restarted PersistentScheduler does), and is recorded (``records``).
        * Its own row was edited after the stored run (:meth:`edited`): the edit wins; the
          next run is claimed after the stored state, like any run.
        * Otherwise the entry adopts the stored state (its row lags: the old leader ran
          it since, or had not saved yet).
        """
        name = entry.name
        state = self.fence.runs.get(name)
        identity = self._identity(entry)
        if state is not None and state.identity in (None, identity):
            if self.edited(entry, state):
                log.info("beat election: %s was edited (last_run_at %s, run count %s); "
                         "the edit wins over the shared state", name, entry.last_run_at,
                         entry.total_run_count)  # fmt: skip
                self.matched(entry)
                return False
            self.adopt(entry, state)
            return True
        changed = False
        if promoting is not None and self.follow_deploys and self.policy.follows_deploys(entry):
            if not entry.total_run_count:  # it never ran here: when it appeared, not now
                entry.last_run_at = entry.default_now()
            records.append(self.request(entry, entry.last_run_at))
            changed = True
        self.matched(entry)
        return changed

    def request(self, entry: Any, at: datetime, **extra: Any) -> RunRequest:
        """The claim that stores ``entry``'s run state as of ``at`` after the stored one.

        Its run count and identity as the entry holds them; ``extra``: the rest of a
        :class:`RunRequest` (a run to send is ``pending``).
        """
        name, identity = str(entry.name), self._identity(entry)
        at_us, count = self.fence.to_db(at), int(entry.total_run_count or 0)
        return RunRequest(name, self.fence.runs.get(name), at_us, count, identity, **extra)

    def edited(self, entry: Any, state: RunState) -> bool:
        """Whether the entry's own row holds an operator's edit newer than ``state``.

        Only entries with a row (django-celery-beat's ``model``) can be edited. A row is
        written by leaders only with stored states, and the stored state only moves on:
        a row that holds an older state lags (an earlier run count, saved before the
        stored run). Anything else was written by someone else: a last_run_at other than
        the stored one with the same run count (a forced run, a reset to None), a higher
        run count, or a row saved (``date_changed``: disabled and enabled again, changed
        in the admin) after the stored run.
        """
        if not has_row(entry) or entry.last_run_at is None:
            return False
        row_us = self.fence.to_db(entry.last_run_at)
        count = int(entry.total_run_count or 0)
        if count == state.total_run_count:
            return abs(row_us - state.last_run_us) > _SAME_TIME_US
        if count > state.total_run_count:
            return True
        changed = getattr(entry.model, "date_changed", None)
        return isinstance(changed, datetime) and self.fence.to_db(changed) > state.last_run_us

    def adopt(self, entry: Any, state: RunState) -> None:
        """Give ``entry`` the stored ``state`` (the fence's, as the store holds it)."""
        when = self.fence.from_db(state.last_run_us, entry.last_run_at or entry.default_now())
        row = state_of(entry)
        self._adopt_state(entry, when, state.total_run_count)
        self.matched(entry)
        dirty = self._dirty()
        if has_row(entry) and dirty is not None and row != (when, state.total_run_count):
            dirty.add(entry.name)  # the row lags: the next sync writes the adopted state

    def settle(self, run: Run, result: RunClaim) -> None:
        """Act on a run's claim.

        Won, the entry holds the state it stored; refused, it adopts what is stored
        (another leader ran it), or else its own state again.
        """
        if run.claim is not None and run.claim.won:
            self.matched(run.next_entry)
            return
        request = run.request
        state = result.state  # what the store holds now
        if (
            request is not None
            and state is not None
            and state != request.expected
            and state.identity in (None, request.identity)
        ):
            self.adopt(run.next_entry, state)  # another leader ran it
            return
        self._adopt_state(run.next_entry, *run.was)
