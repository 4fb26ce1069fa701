"""A hand-over of leadership to a named candidate: who the name means, and the request.

``celery election transfer NODE`` and ``Elector.transfer(NODE)`` name the target by its
candidate id or by its node (the id's part before ``:pid:tag``, e.g. a worker's
``w2@host``); ``pick_target`` resolves it among the live candidates and refuses, with one
line that says what to do, a target that is unknown or not live, not eligible, or the
leader itself. The hand-over itself is one conditional write on the lease row that
names the target (backends: ``transfer``), made by the leader's election thread after
its belief has ended (election/loop.py). Part of the core: no Celery here.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from ..errors import ElectionError
from .lease import CandidateInfo, ElectResult

__all__ = ["Transfer", "TransferRefusedError", "node_of", "pick_target"]


class TransferRefusedError(ElectionError, ValueError):
    """The transfer was refused: the target is unknown, not live, not eligible, or leads."""


def node_of(candidate_id: str) -> str:
    """The node part of a candidate id (``w2@host`` of ``w2@host:4242:1f2e3d4c``)."""
    parts = candidate_id.rsplit(":", 2)
    return parts[0] if len(parts) == 3 else candidate_id


def pick_target(
    candidates: Sequence[CandidateInfo], name: str, namespace: str, leader_token: str | None
) -> CandidateInfo:
    """The live candidate ``name`` means (its id, or its node if that is unique)."""
    found = [c for c in candidates if c.candidate_id == name]
    if not found:
        found = [c for c in candidates if node_of(c.candidate_id) == name]
    live = ", ".join(c.candidate_id for c in candidates) or "none"
    if not found:
        raise TransferRefusedError(
            f"no live candidate {name!r} in namespace {namespace!r} (unknown, or its "
            f"heartbeat expired): live candidates: {live}"
        )
    if len(found) > 1:
        ids = ", ".join(c.candidate_id for c in found)
        raise TransferRefusedError(f"{name!r} names {len(found)} candidates ({ids}): give one id")
    target = found[0]
    if not target.eligible:
        raise TransferRefusedError(
            f"candidate {target.candidate_id!r} is not eligible to lead (it runs with "
            f"--no-election-eligible / election_eligible=False): pick another of {live}"
        )
    if target.release is None:  # 0.1.0 registers none, and would resign such a term
        raise TransferRefusedError(
            f"candidate {target.candidate_id!r} runs a release that cannot take a handed-over "
            f"term (0.1.0): upgrade it, or pick another of {live}"
        )
    if leader_token is not None and target.token == leader_token:
        raise TransferRefusedError(f"candidate {target.candidate_id!r} already leads {namespace!r}")
    return target


class Transfer:
    """A hand-over the election thread is asked to make; the caller waits on ``done``."""

    def __init__(self, target: CandidateInfo) -> None:
        self.target = target
        #: the transfer step's outcome (None: no term was held, or the call failed)
        self.result: ElectResult | None = None
        self.done = threading.Event()

    def finish(self, result: ElectResult | None) -> None:
        self.result = result
        self.done.set()
