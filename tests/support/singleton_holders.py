"""Key holders on one memory backend for the unit tests of singleton tasks.

``app``'s holder is this worker's ("me"); ``other`` plays another worker on the same
database. Both hold keys with liveness ``DELTA``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from celery import Celery

from celery_election.backends import MemoryBackend
from celery_election.election.holder import KeyHolder
from celery_election.keys.singleton import set_key_holder

from .apps import new_app

__all__ = ["DELTA", "app", "backend", "other"]

#: The holders' liveness (real time): a tagged hold is trusted while its lock thread's pings,
#: every DELTA / 4, come within DELTA x 11/12 of each other. At 0.2 s a loaded machine's
#: late ping ended that trust mid-test (a won hold given back, an "other" that stopped
#: trusting its key) one run in four.
DELTA = 1.0


@pytest.fixture
def backend() -> MemoryBackend:
    return MemoryBackend(liveness=True)


@pytest.fixture
def app(backend: MemoryBackend) -> Iterator[Celery]:
    app = new_app(task_always_eager=False)
    set_key_holder(app, KeyHolder(backend, "unit", liveness=DELTA, holder_id="me"))
    try:
        yield app
    finally:
        set_key_holder(app, None)


@pytest.fixture
def other(backend: MemoryBackend) -> Iterator[KeyHolder]:
    """Another worker's holder on the same database."""
    holder = KeyHolder(backend, "unit", liveness=DELTA, holder_id="other")
    try:
        yield holder
    finally:
        holder.close()
