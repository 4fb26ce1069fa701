"""Release preference with electors (memory backend, fake clock): an older release leaves a
vacancy to a newer one that lives, and elects anyway once ``ttl`` has passed.

The rules are core/decisions.py's (``newer_release_lives``, ``defer_take``), held by tables in
tests/unit/test_decisions.py.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from celery_election import Elector, __version__
from celery_election.backends import MemoryBackend
from celery_election.core.clock import FakeClock

from ..support import fake_electors as electors_support
from ..support.fake_electors import TTL, WAIT, clock, electors

__all__ = ["clock", "electors"]  # the fixtures, used by name
ROOT = Path(__file__).resolve().parents[2]


def make(made: list[Elector], backend: Any, clock: FakeClock, name: str, **kw: Any) -> Elector:
    return electors_support.make(made, backend, clock, name, **{"liveness": False, **kw})


def run_for(clock: FakeClock, electors: list[Elector], seconds: float, step: float = 0.5) -> None:
    sleepers = [s for e in electors for s in e.sleepers()]
    for _ in range(round(seconds / step)):
        assert clock.settled(sleepers)
        clock.advance(step)
    assert clock.settled(sleepers)


def test_the_release_registered_is_the_packages_unless_told() -> None:
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert re.search(r'^version = "(.+)"$', pyproject, re.M)[1] == __version__  # type: ignore[index]
    assert Elector(MemoryBackend(), "ns", "x").release == __version__
    assert Elector(MemoryBackend(), "ns", "x", release="9.9").release == "9.9"


def test_an_older_release_leaves_a_vacancy_to_a_newer_one(
    clock: FakeClock, electors: list[Elector]
) -> None:
    mem = MemoryBackend(clock)
    old_a = make(electors, mem, clock, "old-a", release="0.1.0").start()
    assert old_a.wait_for_leadership(WAIT)
    old_b = make(electors, mem, clock, "old-b", release="0.1.0").start()
    new = make(electors, mem, clock, "new", release="0.2.0").start()
    run_for(clock, [old_a, old_b, new], 1)
    assert {c.candidate_id: c.release for c in mem.candidates("ns")} == {
        "old-a": "0.1.0", "old-b": "0.1.0", "new": "0.2.0",
    }  # fmt: skip
    for _ in range(4):  # the leader goes; while the new one lives, no old one takes over
        leader = next(e for e in (old_a, old_b, new) if e.is_leader)
        leader.resign()
        for _ in range(2 * int(TTL)):  # until someone leads (a resigned one stays out a ttl)
            run_for(clock, [old_a, old_b, new], 1)
            if any(e.is_leader for e in (old_a, old_b, new)):
                break
        if leader is not new:
            assert new.is_leader, "a vacancy went to an older release while a newer one lived"


def test_only_older_releases_still_elect_after_a_bounded_wait(
    clock: FakeClock, electors: list[Elector]
) -> None:
    """A newer candidate's row lives but nobody runs it (killed): ttl later, the old elects."""
    mem = MemoryBackend(clock)
    mem.register("ns", "n" * 32, "dead-new", "h", 1, 10 * TTL, release="0.2.0")
    old = make(electors, mem, clock, "old", release="0.1.0").start()
    run_for(clock, [old], TTL - 1)
    assert not old.is_leader and mem.calls.get("elect", 0) == 0  # held back
    run_for(clock, [old], 3)
    assert old.is_leader  # within ttl + a poll


def test_the_setting_reaches_the_elector() -> None:
    from celery import Celery

    from celery_election.settings import ElectionSettings

    app = Celery("t", set_as_current=False)
    app.conf.update(election_url="memory://", election_release="0.1.0")
    assert ElectionSettings.from_app(app).release == "0.1.0"


def test_holding_back_it_wants_no_liveness_lock(clock: FakeClock, electors: list[Elector]) -> None:
    """The lock's holder elects first: an older release holding back must not keep it."""
    import threading

    mem = MemoryBackend(clock, liveness=True)
    mem.register("ns", "n" * 32, "dead-new", "h", 1, 10 * TTL, release="0.2.0")
    old = make(electors, mem, clock, "old", release="0.1.0", liveness=1.0)
    old.start()
    for _ in range(20):  # fake time for the election thread, real time for the lock thread
        run_for(clock, [old], 0.1, step=0.1)
        threading.Event().wait(0.01)
    assert not old.is_leader and old.liveness == "idle"
