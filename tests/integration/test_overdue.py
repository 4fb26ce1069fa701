"""Each beat entry's overdue seconds, read from the shared database (schedule/overdue.py).

The open runs' query on every SQL database (the run an entry owes a finish for), and the
watch that /metrics reads: an entry whose run state is old is overdue by its age past one
period, an entry with a run unfinished past its grace too, a paused one never.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from celery_election import metrics
from celery_election.backends import SQLBackend, backend_from_url
from celery_election.backends.schema import entry_key
from celery_election.core.lease import Bid
from celery_election.schedule import Schedule
from celery_election.schedule.overdue import OverdueWatch
from celery_election.schedule.records import history_row
from celery_election.schedule.store import SQLScheduleStore, schedule_store

from ..conftest import claim_run, token, unique_prefix
from ..support.history import claimed, ended, run_row

NS = "od-beat"
S = 1_000_000


@pytest.fixture
def store(sql_url: str) -> Iterator[SQLScheduleStore]:
    b = backend_from_url(sql_url, table_prefix=unique_prefix())
    assert isinstance(b, SQLBackend)
    b.install()
    s = schedule_store(b)
    assert s is not None
    yield s
    b.uninstall()
    b.close()


def test_open_runs_are_the_oldest_unfinished_after_the_latest_finish(
    store: SQLScheduleStore,
) -> None:
    base, rows = store.db_now() - 100 * S, []

    def sent(name: str, task_id: str, outcome: str | None = None, *, kind: str = "run",
             ns: str = NS) -> None:  # fmt: skip
        at = base + len(rows) * S  # in this order
        if kind in ("missed", "skipped"):
            rows.append(history_row(ns, name, kind, run_key=len(rows), term=1, sent_at=at))
        else:
            rows.append(run_row(ns, name, kind, due=len(rows), sent_at=at, task_id=task_id,
                                due_at=at, outcome=outcome))  # fmt: skip

    # a: finished, then two unfinished: the first of them is owed
    sent("a", "a1", "SUCCESS")
    sent("a", "a2")
    sent("a", "a3")
    # b: no run ever reported a finish (workers without the run-once check): owes nothing
    sent("b", "b1")
    # c: a lost run, then a finished one: owes nothing
    sent("c", "c1")
    sent("c", "c2", "SUCCESS")
    # d: finished, then runs the policies dropped: not runs
    sent("d", "d1", "FAILURE")
    sent("d", "", kind="missed")
    sent("d", "", kind="skipped")
    # f: a run owed, then runs a policy dropped after it: still owed (they are no finish)
    sent("f", "f0", "SUCCESS")
    sent("f", "f1")
    sent("f", "", kind="missed")
    # a run now counts; another namespace does not
    sent("e", "e1", "SUCCESS")
    sent("e", "e2", kind="run_now")
    sent("a", "other", ns="elsewhere")
    store.record_many(rows)
    names = list("abcdef")
    opened = store.open_runs([NS], names)
    assert {k: r.task_id for k, r in opened.items()} == {
        entry_key("a"): "a2",
        entry_key("e"): "e2",
        entry_key("f"): "f1",
    }
    assert store.open_runs(["nobody"], names) == {}
    assert store.open_runs([NS], ["b", "c"]) == {}  # only the entries named
    assert set(store.open_runs([NS, "elsewhere"], names)) == {entry_key(n) for n in "aef"}


@pytest.fixture
def app(tmp_path: Path) -> Iterator[Celery]:
    app = Celery("overdue", broker="memory://", set_as_current=False)
    app.conf.update(
        election_url=f"sqlite:///{tmp_path}/election.db",
        election_table_prefix=f"o{uuid.uuid4().hex[:8]}_",
        election_namespace="od",
        election_beat_overdue_grace=30,
        beat_schedule={
            name: {"task": "t.tick", "schedule": 10.0}
            for name in ("on-time", "stale", "unfinished", "paused", "never")
        },
    )
    with Schedule(app, actor="setup") as s:
        s.backend.install()
        s.pause("paused")
    yield app


def ran(backend: Any, name: str, seconds_ago: float) -> None:
    """Bid a run of ``name`` in the beats' shared state, ``seconds_ago`` on the DB clock."""
    me = token()
    lease = backend.elect(Bid(NS, me, "beat", 30.0)).lease
    store = schedule_store(backend)
    assert store is not None
    now = store.db_now()
    at = now - int(seconds_ago * S)
    assert claim_run(backend.beat, NS, me, lease.term, name, None, at).won
    backend.resign(NS, me, lease.term)


def test_the_watch_reads_each_entry_and_metrics_export_it(app: Celery) -> None:
    pytest.importorskip("prometheus_client")
    with Schedule(app, actor="setup") as s:
        b, store = s.backend, s.store
        start = time.monotonic()  # the watch reads later: by up to the seconds the test takes
        for name in ("on-time", "unfinished"):
            ran(b, name, 1)
        ran(b, "stale", 100)  # due 90 s ago: overdue by 90 - min(10, 30)
        ran(b, "paused", 500)
        claimed(b, NS, "unfinished", "u1", due_at=store.db_now() - 60 * S)
        ended(b, NS, "unfinished", "u1")
        claimed(b, NS, "unfinished", "u2", due_at=store.db_now() - 50 * S)
    old = metrics.use_counters(metrics.LocalCounters())
    watch = OverdueWatch(app, every=60.0).start()  # 1 s: a loaded run's reads were 1 s apart
    try:
        got = watch.read()
        took = time.monotonic() - start
        assert set(got) == {(NS, n) for n in ("on-time", "stale", "unfinished", "paused", "never")}
        assert 80 - 0.01 <= got[NS, "stale"] <= 80 + took + 0.01
        assert 40 - 0.01 <= got[NS, "unfinished"] <= 40 + took + 0.01
        assert got[NS, "on-time"] == got[NS, "paused"] == got[NS, "never"] == 0
        assert watch.read() is got  # read again within its ``every``: the same answer
        body = metrics.render()[0].decode()
        assert (
            'celery_election_beat_entry_overdue_seconds{entry="stale",namespace="od-beat"}' in body
        )
    finally:
        watch.close()
        metrics.use_counters(old)
    assert "overdue" not in metrics.render()[0].decode()


def test_a_database_that_does_not_answer_gives_no_series_and_one_warning(
    app: Celery, caplog: pytest.LogCaptureFixture
) -> None:
    # an earlier test in this process may have left the root logger above WARNING
    caplog.set_level(logging.WARNING, logger="celery_election")
    app.conf.election_url = "sqlite:////nonexistent-dir/x.db"
    watch = OverdueWatch(app, every=0.0)
    try:
        assert watch.read() == {}
        assert watch.read() == {}
    finally:
        watch.close()
    assert [r.levelname for r in caplog.records if "overdue" in r.getMessage()] == ["WARNING"]
