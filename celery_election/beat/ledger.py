"""The run ledger, the beat's side: a claimed run is confirmed once the broker took it.

A run the leader claims is a row in the election database (``task_start``, written by the
claim's transaction), claimed from its claim until this ledger confirms it, after the broker
accepted its message; the entry's next run cannot be claimed before. So "claimed, not
sent" is a state a run is seen in, not a window it disappears in:

* a send that failed (the broker unreachable, a publisher lost) is **owed**: sent again
  with back-off while this process leads (:meth:`RunLedger.owed_now`), and the entry is
  not due meanwhile (:meth:`RunLedger.hold`);
* a run left pending by an earlier term (its leader died or was paused between claim and
  send) is sent by the next leader when it is promoted (:meth:`RunLedger.recover`);
* a run this term lost track of (a claim that committed and lost its answer, a confirm
  that failed, a publisher's reply that never came) is still claimed in the store:
  the leader reads the store again every :data:`RECHECK_EVERY` seconds and sends what has
  been pending for :data:`RECHECK_AGE` seconds and is neither owed nor waiting for its
  confirm here (``recover(..., older_than=...)``), instead of leaving the entry stalled until
  the next failover (window 3 of issue 52);
* the confirms of a burst go in one statement per 500 runs (:meth:`flush`); a run given up
  (expired, its entry removed) is dropped the same way.

Every send of one run carries the same task id, :func:`run_task_id` of (namespace, entry,
the run's stored time): a run sent twice (re-sent after an answer lost, or by a deposed
leader and its successor) reaches the workers as one task id, which its run row
lets run once (docs/beat.md).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from celery.schedules import schedstate

from .. import metrics
from ..backends.base import PendingRun
from ..core import tracing
from ..core.clock import boottime
from ..core.runstate import run_task_id
from ..errors import ElectionError
from .election import BeatTerm
from .fence import BeatFence
from .runs import Claim

__all__ = ["Owed", "RunLedger", "run_task_id"]

log = logging.getLogger("celery_election.beat")

#: back-off of an owed send: first retry after this, doubling up to RETRY_MAX
RETRY_FIRST, RETRY_MAX = 0.5, 10.0
#: while leading, the store's pending runs are read again this often (seconds); one pending
#: this long that this ledger does not know is sent again (longer than a batch's confirms)
RECHECK_EVERY, RECHECK_AGE = 10.0, 30.0


#: A run to send again: (entry, its claim, None) or, a "run now", (entry, None, its key).
Recovered = tuple[Any, Claim | None, int | None]


@dataclass
class Owed:
    """A claimed run whose send failed: sent again at ``next_try`` (boot-time clock).

    A scheduled run's ``claim``, or a "run now"'s key (``run_now``).
    """

    entry: Any
    claim: Claim | None
    attempts: int
    next_try: float
    run_now: int | None = None


class RunLedger:
    """What this leader owes the store and the broker: marks, failed sends, recoveries."""

    def __init__(self, fence: BeatFence) -> None:
        self.fence = fence
        self._unconfirmed: dict[str, str] = {}  # task id -> entry name: the broker took it
        self._dropped: dict[str, str] = {}  # task id -> why it was given up
        self._owed: dict[str, Owed] = {}  # by entry name
        self._owed_now: dict[str, Owed] = {}  # "run now"s, by task id
        self._claimed_by: dict[str, int] = {}  # a recovered run's term in the store

    @property
    def owing(self) -> int:
        """How many runs' sends failed and are owed."""
        return len(self._owed)

    def task_id(self, entry: Any, claim: Claim) -> str:
        return run_task_id(self.fence.namespace, str(entry.name), claim.at)

    def resend_of(self, name: str) -> tuple[int, int | None]:
        """(which attempt the next send of ``name`` is, the term that claimed a recovered run)."""
        owed = self._owed.get(name)
        return (1 if owed is None else owed.attempts + 1), self._claimed_by.get(name)

    # -- after a send -----------------------------------------------------------------------

    def sent(self, entry: Any, claim: Claim) -> None:
        """The broker took the run ``claim`` of ``entry``: confirm its row at the flush."""
        name = str(entry.name)
        self._owed.pop(name, None)
        self._claimed_by.pop(name, None)
        self._unconfirmed[self.task_id(entry, claim)] = name

    def sent_now(self, name: str, task_id: str) -> None:
        """The broker took a "run now" of ``name``: confirm its row at the flush."""
        self._owed_now.pop(task_id, None)
        self._unconfirmed[task_id] = name

    def failed_now(self, entry: Any, run_now: int, task_id: str) -> None:
        """A claimed "run now" was not sent: owed as a scheduled run is, while leading.

        Its send failed, or found the term over for a moment; its row stays claimed, so a
        new leader sends it if this process does not lead again.
        """
        self._owed_now[task_id] = _again(self._owed_now.get(task_id), entry, None, run_now)

    def failed(self, entry: Any, claim: Claim) -> None:
        """The run's send failed: owed, and sent again after a back-off."""
        name = str(entry.name)
        owed = self._owed[name] = _again(self._owed.get(name), entry, claim, None)
        log.warning("beat election: %s not sent (attempt %d); again in %.1fs",
                    name, owed.attempts, owed.next_try - boottime())  # fmt: skip

    def hold(self, entry: Any, state: Any) -> Any:
        """Celery's ``is_due`` answer, or "not yet" while the entry's last run is owed."""
        owed = self._owed.get(str(entry.name))
        if owed is None or not state[0]:
            return state
        return schedstate(False, max(owed.next_try - boottime(), 0.1))

    def owed_now(self, lead: BeatTerm | None) -> list[Owed]:
        """The owed sends due again (none once this process does not lead).

        Not leading, it drops them: the next leader finds them pending and sends them.
        """
        if lead is None:
            self._owed.clear()
            self._owed_now.clear()
            self._claimed_by.clear()
            return []
        now = boottime()
        owed = [*self._owed.values(), *self._owed_now.values()]
        return [o for o in owed if o.next_try <= now]

    def flush(self) -> None:
        """Confirm the runs the broker took since the last flush, drop those given up."""
        fence = self.fence
        try:
            if self._unconfirmed:
                fence.confirm(list(self._unconfirmed))
                self._unconfirmed.clear()
            for why in sorted(set(self._dropped.values())):
                fence.drop([t for t, w in self._dropped.items() if w == why], why)
                self._dropped = {t: w for t, w in self._dropped.items() if w != why}
        except ElectionError as exc:  # kept: written at the next flush
            log.warning("beat election: could not confirm %d sent runs (%s)",
                        len(self._unconfirmed) + len(self._dropped), exc)  # fmt: skip

    # -- at promotion -----------------------------------------------------------------------

    def recover(
        self, lead: BeatTerm, schedule: dict[str, Any], *, older_than: float | None = None
    ) -> list[Recovered]:
        """The runs earlier terms claimed and never sent, to send now under ``lead``.

        Each keeps its key and task id: a scheduled run as a claim of ``lead``, a "run
        now" with its request time. One whose ``expires`` has passed is dropped, not sent
        (counted and logged as expired); one of an entry no longer in the schedule is
        dropped and logged (its task is not known here). ``older_than`` (a recheck while
        leading): only the runs claimed that many seconds ago that this ledger does not owe,
        whichever term claimed them. Never a run the broker took from this process, whose
        confirm waits for the next flush (it may have failed in the term before).
        """
        pending = [r for r in self.fence.pending_runs() if r.task_id not in self._unconfirmed]
        if older_than is not None:
            now_db = time.time_ns() // 1000 + self.fence.offset_us
            cut = now_db - round(older_than * 1_000_000)
            pending = [r for r in pending if r.claimed_us < cut and not self._knows(r)]
        out: list[Recovered] = []
        for run in pending:
            name, at = run.entry_name, run.state.last_run_us
            entry = schedule.get(name)
            if entry is None or _expired(entry, run.claimed_us, self.fence.offset_us):
                why = "is no longer in the schedule" if entry is None else "expired"
                log.warning("beat election: %s: the run claimed in term %s %s; not sent",
                            name, run.state.term, why)  # fmt: skip
                # counted as a run dropped (celery_election_beat_runs_missed_total)
                metrics.count(metrics.key(metrics.BEAT, self.fence.namespace, name, "missed"))
                if entry is not None and not run.run_now:
                    claim = Claim(True, run.state.term, run.run, at)
                    tracing.beat_run_not_sent(self.fence, self, entry, claim, "expired",
                                              run.task_id)  # fmt: skip
                self._dropped[run.task_id] = "removed" if entry is None else "expired"
                continue
            if run.run_now:
                out.append((entry, None, run.run))
                continue
            self._claimed_by[name] = run.state.term
            out.append((entry, Claim(True, lead.term, run.run, at), None))
        if out:
            whose = "an earlier term" if older_than is None else "a term (this one included)"
            log.warning("beat election: sending %d runs %s claimed and did not confirm",
                        len(out), whose)  # fmt: skip
        return out

    def _knows(self, run: PendingRun) -> bool:
        """Whether this ledger owes ``run``."""
        return run.task_id in self._owed_now or (not run.run_now and run.entry_name in self._owed)


def _again(was: Owed | None, entry: Any, claim: Claim | None, run_now: int | None) -> Owed:
    """The next try of a send that failed: back-off doubling from RETRY_FIRST to RETRY_MAX."""
    attempts = 1 if was is None else was.attempts + 1
    delay = min(RETRY_FIRST * 2 ** (attempts - 1), RETRY_MAX)
    return Owed(entry, claim, attempts, boottime() + delay, run_now)


def _expired(entry: Any, claimed_us: int, offset_us: int) -> bool:
    """Whether the run's ``expires`` (seconds after its claim, or a time) has passed."""
    expires = (entry.options or {}).get("expires")
    if expires is None:
        return False
    now = datetime.now().astimezone()
    if isinstance(expires, datetime):
        deadline = expires if expires.tzinfo else expires.astimezone()
    else:
        claimed = datetime.fromtimestamp((claimed_us - offset_us) / 1e6).astimezone()
        deadline = claimed + timedelta(seconds=float(expires))
    return now >= deadline
