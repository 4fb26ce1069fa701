"""What a burst need not pay (beat/burst_costs.py): Celery's clock per question, the collector."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from celery import Celery
from celery.beat import ScheduleEntry
from celery.schedules import crontab

from celery_election.beat import burst_costs
from celery_election.beat.burst_costs import CollectorPause, held, real_now

T0 = datetime(2026, 11, 27, 12, 0, 59, 990000, tzinfo=timezone.utc)


class Ticking(Celery):
    """An app whose clock moves 1 ms at each reading, and counts them."""

    readings = 0

    def now(self) -> datetime:
        self.readings += 1
        return T0 + timedelta(milliseconds=self.readings)


def test_one_reading_on_the_holding_thread_for_every_question_of_the_step() -> None:
    app = Ticking("held", set_as_current=False)
    entry = ScheduleEntry(name="e", task="t", schedule=crontab(), app=app,
                          last_run_at=T0 - timedelta(minutes=1))  # fmt: skip
    with held(app):
        first = app.now()
        assert entry.default_now() == first
        entry.is_due()
        assert next(entry).last_run_at == first  # the run stamped at the step's instant
        assert app.readings == 1
    assert app.now() > first and app.readings == 2  # the class's clock again after the block
    assert "now" not in vars(app)


def test_other_threads_and_the_offset_read_the_real_clock() -> None:
    app = Ticking("held", set_as_current=False)
    seen: list[datetime] = []
    with held(app):
        first = app.now()
        other = threading.Thread(target=lambda: seen.append(app.now()))
        other.start()
        other.join()
        assert seen[0] > first  # another thread's reading moved on
        assert real_now(app) > seen[0]  # and so does the real clock (measure_offset's)
        assert app.now() == first
    assert real_now(app) > first


def test_a_clock_already_replaced_on_the_app_is_left_as_it_is() -> None:
    app = Ticking("held", set_as_current=False)
    frozen = T0 - timedelta(days=1)
    fake: Any = lambda: frozen  # noqa: E731  (a test's frozen clock)
    app.now = fake  # type: ignore[method-assign]
    with held(app):
        assert app.now is fake
        with held(app):  # nested: the outer hold stays
            assert app.now() == frozen
    assert app.now is fake and app.readings == 0


def test_nested_holds_keep_the_outer_reading() -> None:
    app = Ticking("held", set_as_current=False)
    with held(app):
        first = app.now()
        with held(app):
            assert app.now() == first
        assert app.now() == first
    assert "now" not in vars(app)


@pytest.fixture
def collector() -> Iterator[None]:
    """The collector on at the start, and as it was after the test."""
    was = gc.isenabled()
    gc.enable()
    try:
        yield
    finally:
        (gc.enable if was else gc.disable)()


def test_the_collector_is_off_while_a_burst_goes_on_and_on_after_it(collector: None) -> None:
    pause = CollectorPause()
    pause.burst(True)
    assert not gc.isenabled()
    pause.burst(True)  # the next full batch
    assert not gc.isenabled()
    pause.burst(False)  # the burst is over
    assert gc.isenabled()
    pause.burst(True)
    pause.resume()  # the scheduler closes mid-burst
    assert gc.isenabled()


def test_a_burst_keeps_it_off_for_pause_max_at_most(
    collector: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [100.0]
    monkeypatch.setattr(burst_costs, "boottime", lambda: now[0])
    pause = CollectorPause()
    pause.burst(True)
    now[0] += burst_costs.PAUSE_MAX + 0.1
    pause.burst(True)  # a burst that does not end: on again, and stays on
    assert gc.isenabled()
    pause.burst(True)
    assert gc.isenabled()
    pause.burst(False)
    pause.burst(True)  # the next burst pauses it again
    assert not gc.isenabled()
    pause.resume()


def test_a_collector_the_application_turned_off_stays_off(collector: None) -> None:
    gc.disable()
    pause = CollectorPause()
    pause.burst(True)
    pause.burst(False)
    assert not gc.isenabled()
