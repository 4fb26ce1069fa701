"""The history thread waits while a burst goes on (beat/history.py, ``HistoryWriter.hold``)."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from celery_election.beat import history
from celery_election.beat.burst_costs import PAUSE_MAX
from celery_election.beat.history import HistoryWriter


class Store:
    """What the writer calls on the schedule store: the rows it was given, in order."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self.written = threading.Event()

    def record_many(self, rows: list[dict[str, Any]]) -> None:
        self.rows += rows
        self.written.set()

    def term_seen(self, *args: Any, **kwargs: Any) -> None:
        return None

    def term_started(self, *args: Any) -> None:
        return None


def test_a_burst_s_rows_wait_for_its_end() -> None:
    store = Store()
    writer = HistoryWriter(store, every=0.01)  # type: ignore[arg-type]
    try:
        writer.hold(True)
        writer.add({"n": 1})
        # twenty of the thread's turns: held, it writes nothing
        assert not store.written.wait(0.2)
        writer.hold(False)  # the burst is over: the next turn writes
        assert store.written.wait(10)
        assert store.rows == [{"n": 1}]
    finally:
        writer.close()


def test_a_hold_lasts_pause_max_at_most_or_until_half_the_limit_is_queued(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [100.0]
    monkeypatch.setattr(history, "boottime", lambda: now[0])
    writer = HistoryWriter(Store(), every=3600, limit=4)  # type: ignore[arg-type]
    try:
        writer.hold(True)
        assert writer._held()
        writer.hold(True)  # the next full batch: held since the first
        now[0] += PAUSE_MAX - 0.1
        assert writer._held()
        now[0] += 0.2
        assert not writer._held()  # PAUSE_MAX since the burst began
        writer.hold(False)
        writer.hold(True)
        writer.add({"n": 1})
        assert writer._held()
        writer.add({"n": 2})
        assert not writer._held()  # half the limit queued: written, not dropped later
    finally:
        writer.close()


def test_the_retention_runs_on_this_thread_while_a_term_is_led_and_at_once_while_behind(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The leader's prune (``prune``) runs between batches of history, only while this
    beat leads; a whole batch gone (0 s) runs the next at once, else at the time it says."""
    now = [100.0]
    monkeypatch.setattr(history, "boottime", lambda: now[0])
    calls: list[float] = []
    answers = [0.0, 0.0, 600.0, 600.0]

    def prune() -> float:
        calls.append(now[0])
        return answers[len(calls) - 1]

    writer = HistoryWriter(Store(), every=3600, prune=prune)  # type: ignore[arg-type]
    try:
        writer._pruning()
        assert calls == []  # not leading: the leader prunes
        writer.lead("ns", 7, "me")
        for _ in range(4):
            writer._pruning()
        assert calls == [100.0, 100.0, 100.0]  # behind twice, then due in 600 s
        now[0] += 600
        writer._pruning()
        assert len(calls) == 4
    finally:
        writer.close()
