"""``election_eligible``: a candidate that takes part and is listed, and never takes a term.

The memory backend and a fake clock, as tests/unit/test_elector.py: time moves only when a
test advances it, and the tests wait (real time, bounded) for what the electors announce.
The rule itself is core/decisions.py's (``follower_call``, tests/unit/test_decisions.py).
"""

from __future__ import annotations

from typing import Any

import pytest

from celery_election import Elector, State
from celery_election.backends import MemoryBackend
from celery_election.core.clock import FakeClock
from celery_election.errors import ConfigurationError
from celery_election.metrics.health import health
from celery_election.settings import ElectionSettings

from ..support.fake_electors import TTL, WAIT, clock, electors, make

__all__ = ["clock", "electors"]  # the fixtures, used by name


def run_for(clock: FakeClock, electors: list[Elector], seconds: int) -> None:
    """Advance fake time one second at a time, each step settled."""
    sleepers = [s for e in electors for s in e.sleepers()]
    for _ in range(seconds):
        assert clock.settled(sleepers)
        clock.advance(1.0)
    assert clock.settled(sleepers)


@pytest.mark.parametrize("liveness", [False, True], ids=["lease", "liveness-lock"])
def test_an_ineligible_candidate_alone_never_leads_and_an_eligible_one_joining_does(
    clock: FakeClock, electors: list[Elector], liveness: bool
) -> None:
    mem = MemoryBackend(clock, liveness=liveness)
    timings: dict[str, Any] = {"liveness": 1.0} if liveness else {"liveness": False}
    idle = make(electors, mem, clock, "idle", eligible=False, **timings).start()
    run_for(clock, [idle], 3 * int(TTL))  # vacant for three leases
    assert not idle.is_leader and idle.state is State.FOLLOWER
    vacant = mem.current("ns")
    assert vacant is None or not vacant.held
    assert mem.calls.get("elect", 0) == 0 and mem.calls.get("take_over", 0) == 0
    assert idle.liveness == "off"  # no lock: it would keep the lock from those who may lead
    [listed] = mem.candidates("ns")
    assert (listed.candidate_id, listed.eligible) == ("idle", False)
    # it takes part: its database answers, so it is ready (not leading is not a problem)
    healthy, ready, problems = health([idle], [])
    assert (healthy, ready, problems) == (True, True, [])

    able = make(electors, mem, clock, "able", **timings)
    sub = able.subscribe()
    able.start()
    elected = sub.get(timeout=WAIT)
    assert elected is not None and elected.kind == "elected"
    # the resign-free way in: the follower hears of it through the wakeup, no time passes
    # (the lock thread pings in real time: fake time moving on would lapse its proof)
    assert clock.settled([*idle.sleepers(), *able.sleepers()])
    assert able.is_leader and not idle.is_leader
    lease = mem.current("ns")
    assert lease is not None and lease.leader_id == "able"
    assert {c.candidate_id: c.eligible for c in mem.candidates("ns")} == {
        "idle": False,
        "able": True,
    }


def test_when_the_last_eligible_candidate_stops_nobody_leads(
    clock: FakeClock, electors: list[Elector]
) -> None:
    mem = MemoryBackend(clock)
    able = make(electors, mem, clock, "able").start()
    assert able.wait_for_leadership(WAIT)
    idle = make(electors, mem, clock, "idle", eligible=False).start()
    run_for(clock, [able, idle], 2)
    assert idle.leader_id == "able"
    able.stop()  # the resign wakes the follower at once: it only looks
    run_for(clock, [idle], 3 * int(TTL))
    assert not idle.is_leader and mem.calls.get("elect", 0) == 1
    lease = mem.current("ns")
    assert lease is not None and not lease.held and idle.leader_id is None


def test_eligible_is_a_flag() -> None:
    with pytest.raises(ConfigurationError, match="eligible must be True or False: got 'no'"):
        Elector(MemoryBackend(), "ns", "x", eligible="no")  # type: ignore[arg-type]


class _App:
    """What ElectionSettings reads of a Celery app: its conf."""

    def __init__(self, **conf: Any) -> None:
        from celery import Celery

        self.app = Celery("t", set_as_current=False)
        self.app.conf.update(conf)


@pytest.mark.parametrize(
    ("conf", "option", "eligible"),
    [
        ({}, None, True),
        ({"election_eligible": False}, None, False),
        ({"election_eligible": False}, True, True),  # the command line wins
        ({}, False, False),
    ],
)
def test_the_setting_and_the_option(
    conf: dict[str, Any], option: bool | None, eligible: bool
) -> None:
    app = _App(election_url="memory://", **conf).app
    assert ElectionSettings.from_app(app, eligible=option).eligible is eligible


def test_a_setting_that_is_not_a_flag_is_one_clear_line() -> None:
    app = _App(election_url="memory://", election_eligible="maybe").app
    with pytest.raises(ConfigurationError, match="election_eligible must be True or False"):
        ElectionSettings.from_app(app)
