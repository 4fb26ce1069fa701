"""The run ledger, the beat's side: a claimed run is marked sent once the broker took it.

A run the leader claims is pending in the election database (``beat_run.pending_run``)
from its claim until this ledger marks it sent, after the broker accepted its message;
the entry's next run cannot be claimed before. So "claimed, not sent" is a state a run is
seen in, not a window it disappears in:

* a send that failed (the broker unreachable, a publisher lost) is **owed**: sent again
  with back-off while this process leads (:meth:`RunLedger.owed_now`), and the entry is
  not due meanwhile (:meth:`RunLedger.hold`);
* a run left pending by an earlier term (its leader died or was paused between claim and
  send) is sent by the next leader when it is promoted (:meth:`RunLedger.recover`);
* a run this term lost track of (a claim that committed and lost its answer, a mark that
  changed nothing, a publisher's reply that never came) is still pending in the store:
  the leader reads the store again every :data:`RECHECK_EVERY` seconds and sends what has
  been pending for :data:`RECHECK_AGE` seconds and is neither owed nor waiting for its
  mark here (``recover(..., older_than=...)``), instead of leaving the entry stalled until
  the next failover (window 3 of issue 52);
* the marks of a burst go in one statement per term and 500 entries (:meth:`flush`).

Every send of one run carries the same task id, :func:`run_task_id` of (namespace, entry,
the run's stored time): a run sent twice (re-sent after an answer lost, or by a deposed
leader and its successor) reaches the workers as one task id, which its run row
lets run once (docs/beat.md).
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from celery.schedules import schedstate

from .. import metrics, tracing
from ..clock import boottime
from ..errors import ElectionError
from .election import BeatTerm
from .fence import BeatFence
from .runs import Claim

__all__ = ["Owed", "RunLedger", "run_task_id"]

log = logging.getLogger("celery_election.beat")

#: uuid5 namespace of the runs' task ids (a fixed random UUID: ids of no other scheme)
_RUNS = uuid.UUID("8f1d0b62-4a36-4d1c-9d57-3c3c1b1a7e65")
#: back-off of an owed send: first retry after this, doubling up to RETRY_MAX
RETRY_FIRST, RETRY_MAX = 0.5, 10.0
#: while leading, the store's pending runs are read again this often (seconds); one pending
#: this long that this ledger does not know is sent again (longer than a batch's confirms)
RECHECK_EVERY, RECHECK_AGE = 10.0, 30.0


def run_task_id(namespace: str, entry: str, at: int) -> str:
    """The task id of every send of the run of ``entry`` stored at ``at`` (epoch us)."""
    return str(uuid.uuid5(_RUNS, f"{namespace}\0{entry}\0{at}"))


@dataclass
class Owed:
    """A claimed run whose send failed: sent again at ``next_try`` (boot-time clock)."""

    entry: Any
    claim: Claim
    attempts: int
    next_try: float


class RunLedger:
    """What this leader owes the store and the broker: marks, failed sends, recoveries."""

    def __init__(self, fence: BeatFence) -> None:
        self.fence = fence
        self._unmarked: dict[int, list[str]] = {}  # by the term that claimed the run
        self._owed: dict[str, Owed] = {}
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

    def sent(self, name: str, term: int) -> None:
        """The broker took the run of ``name`` sent under ``term``: mark it at the flush.

        A recovered run is marked under the term that claimed it in the store.
        """
        self._owed.pop(name, None)
        self._unmarked.setdefault(self._claimed_by.pop(name, term), []).append(name)

    def failed(self, entry: Any, claim: Claim) -> None:
        """The run's send failed: owed, and sent again after a back-off."""
        name = str(entry.name)
        was = self._owed.get(name)
        attempts = 1 if was is None else was.attempts + 1
        delay = min(RETRY_FIRST * 2 ** (attempts - 1), RETRY_MAX)
        self._owed[name] = Owed(entry, claim, attempts, boottime() + delay)
        log.warning("beat election: %s not sent (attempt %d); again in %.1fs",
                    name, attempts, delay)  # fmt: skip

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
            self._claimed_by.clear()
            return []
        now = boottime()
        return [owed for owed in self._owed.values() if owed.next_try <= now]

    def flush(self) -> None:
        """Mark the runs the broker took since the last flush: a statement per term."""
        fence = self.fence
        for term, names in list(self._unmarked.items()):
            try:
                fence.mark_sent(term, names)
            except ElectionError as exc:  # kept: marked at the next flush
                log.warning("beat election: could not mark %d sent runs (%s)", len(names), exc)
                return
            del self._unmarked[term]

    # -- at promotion -----------------------------------------------------------------------

    def recover(
        self, lead: BeatTerm, schedule: dict[str, Any], *, older_than: float | None = None
    ) -> list[tuple[Any, Claim]]:
        """The runs earlier terms claimed and never sent, to send now under ``lead``.

        Each keeps its key and task id. One whose ``expires`` has passed is marked, not
        sent (counted and logged as expired); one of an entry no longer in the schedule
        is marked and logged (its task is not known here). ``older_than`` (a recheck while
        leading): only the runs pending that many seconds that this ledger does not owe
        and is not about to mark, whichever term claimed them.
        """
        pending = self.fence.pending_runs()
        if older_than is not None:
            known = set(self._owed).union(*self._unmarked.values())
            now_db = time.time_ns() // 1000 + self.fence.offset_us
            cut = now_db - round(older_than * 1_000_000)
            pending = {n: r for n, r in pending.items() if n not in known and r.claimed_us < cut}
        out: list[tuple[Any, Claim]] = []
        done: dict[int, list[str]] = {}
        for name, run in pending.items():
            entry = schedule.get(name)
            at = run.state.last_run_us
            if entry is None or _expired(entry, run.claimed_us, self.fence.offset_us):
                why = "is no longer in the schedule" if entry is None else "expired"
                log.warning("beat election: %s: the run claimed in term %s %s; not sent",
                            name, run.state.term, why)  # fmt: skip
                # counted as a run dropped (celery_election_beat_runs_missed_total)
                metrics.count(metrics.key(metrics.BEAT, self.fence.namespace, name, "missed"))
                if entry is not None:
                    claim = Claim(True, run.state.term, run.run, at)
                    task_id = self.task_id(entry, claim)
                    tracing.beat_run_not_sent(self.fence, self, entry, claim, "expired", task_id)
                done.setdefault(run.state.term, []).append(name)
                continue
            self._claimed_by[name] = run.state.term
            out.append((entry, Claim(True, lead.term, run.run, at)))
        for term, names in done.items():
            self._unmarked.setdefault(term, []).extend(names)
        if out:
            whose = "an earlier term" if older_than is None else "a term (this one included)"
            log.warning("beat election: sending %d runs %s claimed and did not mark sent",
                        len(out), whose)  # fmt: skip
        return out


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
