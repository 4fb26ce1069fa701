"""The schedule page in a real Chromium marks an overdue entry, and unmarks it.

A real ``celery beat`` sends an entry every second, a real worker runs it; the worker is
stopped (the runs sent are not finished), then another one starts. The page's row of the
entry turns red with "overdue ..." in its due column, then back. Every wait waits on the
page's DOM or on the database with a deadline.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest

from harness.cluster import Cluster, wait_until

from .test_overdue_alert import ENTRY, finished_runs
from .test_web import TOKEN, artifacts, browser, css, shot, start_web, wait_dom

__all__ = ["artifacts", "browser"]  # the fixtures, used by name
# The second tier (minutes of real servers). RabbitMQ, not kombu's SQLAlchemy transport:
# on kombu 5.3.4 (the floor) a worker takes one message per poll, every 2 s, while the
# beat sends two a second, so the runs pile up unfinished and the entry *is* overdue.
pytestmark = [pytest.mark.slow, pytest.mark.tier2]


@pytest.mark.parametrize("cluster", [{"beat": True}], indirect=True)
def test_the_page_marks_an_entry_no_worker_runs_and_clears_it_after(
    cluster: Cluster, browser: Any, artifacts: Path
) -> None:
    c = cluster
    c.start("w1", c=1)
    c.start_beat("b1")
    c.wait_beat_leader(30)
    wait_until(lambda: finished_runs(c) >= 2, 60, "two finished runs of the entry")
    url = start_web(c)
    browser.get(f"{url}#token={TOKEN}")
    row = f'#entries tr[data-entry="{ENTRY}"]'

    def overdue() -> bool:
        return "overdue" in (css(browser, row).get_attribute("class") or "")

    wait_dom(browser, lambda: css(browser, row) and not overdue(), 30, "the entry, on time")

    c.signal("w1", signal.SIGTERM)
    c.wait_exit("w1", 30)
    wait_dom(browser, overdue, 15, "the entry marked overdue")
    assert css(browser, f"{row} td.due").text.startswith("overdue ")
    shot(browser, artifacts, "overdue")

    c.start("w2", c=1)
    wait_dom(browser, lambda: not overdue(), 45, "the entry on time again")
