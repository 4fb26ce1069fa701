"""pytest plugin: the wrapped suites' tests that spin the real clock, on a virtual one.

Two of django-celery-beat's tests wait for wall time to pass: one ticks a scheduler until
a crontab two minutes ahead falls due (two minutes of a busy loop), one sleeps out each
tick's interval (40 s). Here they run under a freezegun clock that moves one second per
``Scheduler.tick`` and by what the test module sleeps, in the stock run and the leader
run alike (``-p virtual_clock`` in both), so the two still compare the same test. The
election's own clock (boot time) is not frozen.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import celery.beat as beat
import pytest
from freezegun import freeze_time

#: Test names (the part after ``::``) that wait for wall time, and what one scheduler
#: tick moves the clock by.
SPINNING = {
    "test_crontab_with_start_time_tick": timedelta(seconds=1),
    "test_heap_always_return_the_first_item": timedelta(0),
}


class _SleepMoves:
    """The test module's ``time``, whose ``sleep`` moves the frozen clock instead."""

    def __init__(self, frozen: Any) -> None:
        self._frozen = frozen

    def sleep(self, seconds: float) -> None:
        self._frozen.tick(timedelta(seconds=seconds))

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    step = SPINNING.get(item.name)
    module = getattr(item, "module", None)
    if step is None or module is None:
        return (yield)
    # The scheduler class the test builds: the leader one's tick is its own, not Celery's.
    cls = getattr(getattr(item, "instance", None), "Scheduler", beat.Scheduler)
    real_tick, own = cls.tick, "tick" in vars(cls)
    with freeze_time(datetime.now(timezone.utc)) as frozen:

        def tick(self: beat.Scheduler, *args: Any, **kwargs: Any) -> Any:
            try:
                return real_tick(self, *args, **kwargs)
            finally:
                frozen.tick(step)

        cls.tick = tick
        real_time = getattr(module, "time", None)
        module.time = _SleepMoves(frozen)
        try:
            return (yield)
        finally:
            if own:
                cls.tick = real_tick
            else:
                del cls.tick
            module.time = real_time
