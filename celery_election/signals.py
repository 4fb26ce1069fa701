"""Celery signals sent in the worker's main process when its leadership changes.

    from celery_election.signals import leader_elected, leader_revoked

    @leader_elected.connect
    def on_elected(sender, term, namespace, **kwargs): ...

    @leader_revoked.connect
    def on_revoked(sender, term, namespace, reason, **kwargs): ...

``sender`` is the worker's hostname. They run on the elector's event thread: keep them
short (a slow receiver delays later events, never the election itself).
"""

from __future__ import annotations

from celery.utils.dispatch import Signal

__all__ = ["leader_elected", "leader_revoked"]

#: This worker now leads ``namespace`` under ``term``.
leader_elected = Signal(name="leader_elected")
#: This worker no longer leads; ``reason`` is "lost", "expired", "resigned" or "stopped".
leader_revoked = Signal(name="leader_revoked")
