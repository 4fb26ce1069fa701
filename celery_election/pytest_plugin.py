"""pytest fixtures for leader tasks (the ``celery_election`` pytest11 plugin).

Installed with the package and loaded by pytest's entry point: it only defines fixtures,
so a test suite that uses none of them is untouched (``-p no:celery_election`` turns it
off). See ``celery_election.testing`` for what the fixtures hand out.

* ``election``: a :class:`~celery_election.testing.Leadership` that leads (term 1).
* ``election_follower``: the same, following (another worker leads).
* ``election_protocol``: an :class:`~celery_election.testing.ElectedLeadership` (real
  Electors on a MemoryBackend with a FakeClock) that leads.
* ``election_keys``: a :class:`~celery_election.keys.testing.SingletonKeys`: singleton
  tasks of this process against "another worker" whose keys the test holds, releases and
  crashes (``on_busy`` seen eagerly and in ``election_worker``).
* ``election_worker``: Celery's in-process worker on ``celery_app``, consuming the leader
  queue, with leadership from ``election``. It needs Celery's fixtures
  (``-p celery.contrib.pytest``, or pytest-celery installed, whose ``celery_worker`` is a
  Docker one) and honours ``celery_includes``, ``celery_worker_pool`` and
  ``celery_worker_parameters``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:  # imported in the fixtures: a run that uses none skips the test kit
    from .keys.testing import SingletonKeys
    from .testing import ElectedLeadership, Leadership

__all__ = [
    "election",
    "election_follower",
    "election_keys",
    "election_protocol",
    "election_worker",
]


@pytest.fixture
def election() -> Iterator[Leadership]:
    """Lead (term 1): leader tasks run; ``election.follow()`` and the others change it."""
    from .testing import Leadership

    with Leadership() as leadership:
        leadership.lead()
        yield leadership


@pytest.fixture
def election_follower(election: Leadership) -> Leadership:
    """Follow: leader tasks are skipped, requeued or refused, by their ``on_follower``."""
    election.follow()
    return election


@pytest.fixture
def election_protocol() -> Iterator[ElectedLeadership]:
    """Lead through real Electors on a MemoryBackend with a FakeClock."""
    from .testing import ElectedLeadership

    with ElectedLeadership() as leadership:
        leadership.lead()
        yield leadership


@pytest.fixture
def election_keys() -> Iterator[SingletonKeys]:
    """Hold singleton task keys "on another worker" and see this process's tasks busy."""
    from .keys.testing import SingletonKeys

    with SingletonKeys() as keys:
        yield keys


@pytest.fixture
def election_worker(
    election: Leadership,
    celery_app: Any,
    celery_includes: Sequence[str],
    celery_worker_pool: Any,
    celery_worker_parameters: Mapping[str, Any],
) -> Iterator[Any]:
    """Start Celery's in-process worker on ``celery_app``, consuming the leader queue.

    It runs leader tasks while ``election`` leads, and shows what a follower does with
    them after ``election.follow()``.
    """
    from .testing import worker

    for module in celery_includes:
        celery_app.loader.import_task_module(module)
    with worker(celery_app, pool=celery_worker_pool, **celery_worker_parameters) as w:
        yield w
