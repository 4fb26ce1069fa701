"""The values of the beat's send path: due -> reserve -> claim -> send -> settle.

A run is a :class:`Run` value that moves through stages; each step of
``LeaderSchedulerMixin`` takes runs and returns runs (``docs/design.md``, the beat). Its
:attr:`Run.claim` says which stage it is in:

* **reserved** (no claim yet): Celery's ``reserve`` gave the entry's next state; the run
  knows the state it follows (``request.expected``) and the one it stores (``request``);
* **claimed** or **refused** (``claim.won``): the fence's compare-and-set under the term
  answered (:class:`~.fence.Claim`);
* then the send's outcome, told by the :class:`~.sender.Sender` (counted, recorded): sent,
  failed (the broker refused it) or fenced (the term stopped leading before the send), as
  ``publish.Reply`` names them for a publisher's sends.

"Claimed, not yet sent" is a stage a run is in: the store keeps it (the run's row, state
``claimed``, until the broker took it: ``ledger.py``), and between Celery's ``reserve`` and
its send the scheduler holds the claimed run by entry name (``LeaderSchedulerMixin.reserve``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from ..backends.base import RunRequest
from .election import BeatTerm

__all__ = ["Claim", "Run"]


@dataclass(frozen=True)
class Claim:
    """A reserved run's claim: sent only if ``won`` and its term still leads when sending."""

    won: bool
    term: int
    run: int  # the run's key: the stored last run it follows (epoch us; 0: the first run)
    at: int  # its own last_run_at, as stored (database clock, epoch us)
    claimed_ns: int = 0  # when the claim answered (epoch ns, this host; 0: not known)


#: The claim of a run reserved while this process did not lead: never sent.
NOT_LEADING = Claim(False, 0, 0, 0)


@dataclass(frozen=True)
class Run:
    """One run of an entry on its way from Celery's ``reserve`` to the broker."""

    entry: Any  # the entry reserve was given (Celery's tick sends this one)
    next_entry: Any  # the entry reserve returned (the schedule keeps this one)
    was: tuple[Any, Any]  # the entry's (last_run_at, total_run_count) before reserve
    lead: BeatTerm | None  # None: reserved while this process did not lead
    request: RunRequest | None  # what the claim writes (None: not leading)
    claim: Claim | None = None  # None: reserved, not claimed (yet, or the store said nothing)

    @property
    def name(self) -> str:
        return str(self.entry.name)

    def claimed(self, claim: Claim) -> Run:
        """The run with the fence's answer."""
        return replace(self, claim=claim)
