"""Electors on a fake clock for the unit tests of the elector, eligibility, transfer, release.

The memory backend and a ``FakeClock``: time moves only when a test advances it, and the
tests wait (real time, bounded) for what the electors announce.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from celery_election import Elector
from celery_election.core.clock import FakeClock

__all__ = ["MARGIN", "RENEW", "TTL", "WAIT", "clock", "electors", "make"]

TTL, RENEW, MARGIN = 10.0, 3.0, 2.0
WAIT = 5.0  # real seconds to wait for an event that must come


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def electors() -> Iterator[list[Elector]]:
    made: list[Elector] = []
    yield made
    for e in made:
        e.stop(timeout=WAIT)


def make(
    made: list[Elector], backend: Any, clock: FakeClock, name: str = "a", **kw: Any
) -> Elector:
    """An elector in namespace "ns" on ``clock``, stopped by the ``electors`` fixture.

    ``kw``: Elector's options, over these timings.
    """
    opts: dict[str, Any] = dict(
        ttl=TTL, renew_interval=RENEW, safety_margin=MARGIN, jitter=0, poll_interval=1.0
    )
    opts.update(kw)
    e = Elector(backend, "ns", name, clock=clock, **opts)
    made.append(e)
    return e
