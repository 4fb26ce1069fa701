"""Remote control: ``celery inspect election`` and ``celery control election_resign``.

Importing this module registers both commands; ``init_app`` imports it, so the app's
module does it in the worker and in the CLI alike. They need a broker with broadcast
(RabbitMQ, Redis): kombu's SQLAlchemy transport has none, and there the election database
itself is the place to look (``celery election status``).
"""

from __future__ import annotations

from typing import Any

from celery.worker.control import control_command, inspect_command

__all__ = ["election", "election_resign"]


def _step(state: Any) -> Any:
    return getattr(state.consumer.controller, "election", None)


@inspect_command()
def election(state: Any) -> dict[str, Any]:
    """Report the worker's election: namespace, leader?, term, leader id, trust left (s)."""
    step = _step(state)
    if step is None:
        return {"enabled": False}
    return {"enabled": True, **step.info()}


@control_command()
def election_resign(state: Any) -> dict[str, Any]:
    """Make this worker step down if it leads (the others elect at once)."""
    step = _step(state)
    if step is None or step.elector is None:
        return {"error": "election is not enabled on this worker"}
    was_leader = step.elector.is_leader
    if not step.elector.resign(wait=True):
        return {"ok": "not the leader"}
    return {"ok": "resigned" if was_leader else "released an unconfirmed term"}
