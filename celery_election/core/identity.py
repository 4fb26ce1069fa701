"""Who a candidate is, for people: the label an elector runs under.

A candidate id is ``[role@]node:pid:tag``: the node (the host's name, or a Celery
worker's node name), the process id and 8 random hex digits, so that two electors in
one process (or two containers that share a hostname and pid 1) still read apart. It is
only a label: identity in the protocol is the elector's secret token (docs/design.md,
rule 5).
"""

from __future__ import annotations

import os
import socket
import uuid

__all__ = ["new_candidate_id"]


def new_candidate_id(node: str | None = None, *, role: str | None = None) -> str:
    """A fresh candidate id: ``node:pid:tag`` (``role@host:pid:tag`` with a ``role``).

    ``node`` defaults to this host's name; ``role`` (e.g. ``"beat"``) names what runs
    there, before the host's name (``beat@host:1234:1f2e3d4c``).
    """
    if node is None:
        node = socket.gethostname()
    if role is not None:
        node = f"{role}@{node}"
    return f"{node}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
