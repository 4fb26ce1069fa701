"""The operable schedule's store on every SQL database: versions, the run-now fence, history.

Each condition of ``claim_run_now`` (the request seen, the lease's namespace, token, term
and expiry) has a case here that fails when the condition is removed.
"""

from __future__ import annotations

import re
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from celery_election.backends import SQLBackend, backend_from_url
from celery_election.backends.schema import entry_key
from celery_election.core.lease import Bid
from celery_election.errors import BackendUnavailableError, ConfigurationError
from celery_election.schedule.marks import (
    MARKS,
    EntryMarks,
    marks_statement,
    run_mark,
    runs_in_statements,
)
from celery_election.schedule.records import EntryRow, history_row
from celery_election.schedule.store import SQLScheduleStore, schedule_store

from ..conftest import EVERY_SQL, SQL_KINDS, expire, token, url_for
from ..support.history import claimed, ended, run_row

NS = "sched-beat"
LEASE_NS = "sched-lease"


@pytest.fixture(params=EVERY_SQL)
def sql_url(request: pytest.FixtureRequest, tmp_path: Any) -> str:
    """Every SQL database, PostgreSQL and MariaDB through each of their drivers."""
    return url_for(request.param, tmp_path)


@pytest.fixture
def backend(sql_url: str) -> Iterator[SQLBackend]:
    b = backend_from_url(sql_url, table_prefix=f"s{uuid.uuid4().hex[:10]}_")
    assert isinstance(b, SQLBackend)
    b.install()
    yield b
    b.uninstall()
    b.close()


def put(store: SQLScheduleStore, name: str, **values: Any) -> EntryRow:
    def work(current: EntryRow | None, now: int) -> tuple[dict[str, Any], dict[str, Any]]:
        return {"task": "t.x", "spec": '{"schedule": {"every": 5}}', **values}, values

    return store.change(NS, name, "add", "tester", work)


def run_now_at(store: SQLScheduleStore, name: str) -> int | None:
    """The entry's pending "run now" as stored (the rows the beat reads: ``entries``)."""
    return next(r.run_now_at for r in store.entries(NS) if r.name == name)


def test_each_change_gets_a_greater_version_and_is_seen_once(backend: SQLBackend) -> None:
    store = schedule_store(backend)
    a = put(store, "a")
    b = put(store, "b")
    a2 = put(store, "a", enabled=False)
    assert a.version < b.version < a2.version
    assert [r.name for r in store.changes(NS, 0)] == ["b", "a"]  # latest row per entry
    assert [r.name for r in store.changes(NS, b.version)] == ["a"]
    assert store.changes(NS, a2.version) == []
    assert store.changes("other", 0) == []
    assert [(x.action, x.actor, x.name) for x in store.audit(NS)][:1] == [("add", "tester", "a")]


def test_concurrent_writers_commit_in_version_order(backend: SQLBackend) -> None:
    """A reader that saw version N never misses a change committed later below N."""
    store = schedule_store(backend)
    seen: set[str] = set()
    since = -1
    errors: list[BaseException] = []

    def writer(k: int) -> None:
        try:
            for i in range(5):
                put(store, f"w{k}-{i}")
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads) or since < 0:
        for row in store.changes(NS, since):
            seen.add(row.name)
            since = max(since, row.version)
    for t in threads:
        t.join()
    for row in store.changes(NS, since):
        seen.add(row.name)
    assert not errors
    assert seen == {f"w{k}-{i}" for k in range(3) for i in range(5)}


def test_a_refused_change_writes_nothing(backend: SQLBackend) -> None:
    store = schedule_store(backend)
    put(store, "a")

    def refuse(current: EntryRow | None, now: int) -> Any:
        raise ConfigurationError("no")

    with pytest.raises(ConfigurationError):
        store.change(NS, "a", "edit", "tester", refuse)
    assert len(store.audit(NS)) == 1
    assert [r.version for r in store.changes(NS, 0)] == [1]


def test_run_now_is_claimed_once_and_only_under_the_leaders_lease(backend: SQLBackend) -> None:
    store = schedule_store(backend)
    a, b = token(), token()
    lease = backend.elect(Bid(LEASE_NS, a, "beat-a", 30.0)).lease
    row = put(store, "job", run_now_at=1234)
    assert row.run_now_at == 1234
    mine = (LEASE_NS, a, lease.term)
    # every condition of the fence, one at a time
    assert not store.claim_run_now(NS, mine, "job", 999)  # not the request it saw
    assert not store.claim_run_now(NS, (LEASE_NS, b, lease.term), "job", 1234)  # token
    assert not store.claim_run_now(NS, (LEASE_NS, a, lease.term + 1), "job", 1234)  # term
    assert not store.claim_run_now(NS, ("elsewhere", a, lease.term), "job", 1234)  # lease ns
    assert not store.claim_run_now(NS, mine, "other-entry", 1234)  # entry
    assert run_now_at(store, "job") == 1234
    assert store.claim_run_now(NS, mine, "job", 1234)
    assert not store.claim_run_now(NS, mine, "job", 1234)  # consumed: sent once
    assert run_now_at(store, "job") is None
    # a lease that has ended claims nothing, though its token and term match
    put(store, "job", run_now_at=5678)
    expire(backend, LEASE_NS)
    assert not store.claim_run_now(NS, mine, "job", 5678)


def test_a_run_now_cut_before_its_row_is_written_stays_pending(
    backend: SQLBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The click taken and its run's row commit together: cut between the two (the
    connection lost), the click is still pending and the next claim sends it. Taken
    alone, the click was gone with no row for any leader to find (window 9)."""
    store = schedule_store(backend)
    lease = backend.elect(Bid(LEASE_NS, a := token(), "beat-a", 30.0)).lease
    put(store, "job", run_now_at=1234)

    def cut(*args: Any) -> None:
        raise RuntimeError("cut")

    with monkeypatch.context() as patched:
        patched.setattr(backend.runs, "write_claimed", cut)
        with pytest.raises(RuntimeError, match="cut"):
            store.claim_run_now(NS, (LEASE_NS, a, lease.term), "job", 1234)
    assert run_now_at(store, "job") == 1234
    assert store.claim_run_now(NS, (LEASE_NS, a, lease.term), "job", 1234)
    assert backend.beat.pending_runs(LEASE_NS)[0].entry_name == "job"


def test_a_run_now_claim_lost_to_another_writer_is_asked_again_not_dropped(
    backend: SQLBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Contention (SQLite busy under load) says nothing about the click: the claim raises,
    the beat asks again at its next tick, and the request is still pending. Taken for
    "not won", the click was dropped (a matrix run on a loaded machine)."""
    from celery_election.backends.connection import LostRound

    store = schedule_store(backend)
    lease = backend.elect(Bid(LEASE_NS, a := token(), "beat-a", 30.0)).lease
    put(store, "job", run_now_at=1234)
    real = backend.call

    def busy(*args: Any, **kwargs: Any) -> Any:
        monkeypatch.setattr(backend, "call", real)  # the next call gets through
        raise LostRound()

    monkeypatch.setattr(backend, "call", busy)
    with pytest.raises(BackendUnavailableError):
        store.claim_run_now(NS, (LEASE_NS, a, lease.term), "job", 1234)
    assert run_now_at(store, "job") == 1234
    assert store.claim_run_now(NS, (LEASE_NS, a, lease.term), "job", 1234)


def test_the_history_is_the_runs_rows_newest_first(backend: SQLBackend) -> None:
    """A run's claim, confirm, start and end are its one row; a policy's missed or skipped
    runs are rows of their own; the overlap policy reads the latest run claimed to send."""
    store = schedule_store(backend)
    assert store is not None
    claimed(backend, NS, "job", "t-1", due_at=store.db_now() - 5)
    assert store.last_sent([NS], "job").status == "queued"  # type: ignore[union-attr]
    ended(backend, NS, "job", "t-1")
    now = store.db_now() + 1  # after the claim: the newest
    missed = history_row(NS, "job", "missed", run_key=2, term=7, count=30, sent_at=now)
    store.record_many([missed])
    store.record_many([missed])  # written again (its first answer lost): one row
    claimed(backend, NS, "other", "t-2")
    runs = store.history([NS], "job")
    assert [(r.kind, r.count, r.status, r.task_id) for r in runs] == [
        ("missed", 30, None, None),
        ("run", 1, "SUCCESS", "t-1"),
    ]
    assert runs[1].duration_us is not None and runs[1].finished_at is not None
    assert runs[1].due_at is not None and runs[1].sent_at > runs[1].due_at
    assert store.history([NS], "job", before=runs[0].sent_at) == runs[1:]
    assert store.history(["elsewhere"], "job") == []
    last = store.last_sent([NS], "job")  # the missed row is not a run sent
    assert last is not None and last.task_id == "t-1" and last.finished_at is not None
    claimed(backend, NS, "job", "t-3", due=3, sent=False)
    assert backend.runs.drop(NS, ["t-3"], "expired") == 1  # given up unsent: not a run
    assert store.last_sent([NS], "job") == last
    assert run_mark(store.history([NS], "job", limit=1)[0]) == "missed"
    many = store.last_sent_many([NS, "elsewhere"], ["job", "other", "nobody"])
    assert {n: r.task_id for n, r in many.items()} == {"job": "t-1", "other": "t-2"}


def test_leadership_history_keeps_each_term_its_start_and_how_it_ended(
    backend: SQLBackend,
) -> None:
    """The page's leader bands: the lease's start, a last sign of life, a clean end."""
    store = schedule_store(backend)
    a, b = token(), token()
    first = backend.elect(Bid(LEASE_NS, a, "beat-a", 30.0)).lease
    assert first is not None and first.acquired_at_us is not None
    store.term_started(LEASE_NS, first.term, "label-a")
    store.term_started(LEASE_NS, first.term, "label-a")  # once per term
    store.term_seen(LEASE_NS, first.term)
    expire(backend, LEASE_NS)
    second = backend.elect(Bid(LEASE_NS, b, "beat-b", 30.0)).lease
    assert second is not None and second.term > first.term
    store.term_started(LEASE_NS, first.term, "late-a")  # the lease moved on: now, its label
    store.term_started(LEASE_NS, second.term, "label-b")
    store.term_seen(LEASE_NS, second.term, ended=True)
    store.term_seen(LEASE_NS, second.term)  # an ended term stays ended
    terms = store.terms(0, store.db_now())
    assert [(t.term, t.leader_id) for t in terms] == [
        (first.term, "beat-a"),
        (second.term, "beat-b"),
    ]
    one, two = terms
    assert one.started_at == first.acquired_at_us and one.ended_at is None
    assert one.seen_at >= one.started_at
    assert two.started_at == second.acquired_at_us and two.ended_at is not None
    assert two.seen_at == two.ended_at
    assert store.terms(0, one.started_at - 1) == []  # the window selects
    assert store.terms(two.ended_at + 1, two.ended_at + 10) == []
    assert store.prune_terms(LEASE_NS, one.seen_at + 1) == 1
    assert [t.term for t in store.terms(0, store.db_now())] == [second.term]


def test_marks_keep_the_worst_run_of_each_column_with_how_many_it_stands_for(
    backend: SQLBackend,
) -> None:
    """The timeline's columns: a failed run among twenty on time still shows failed."""
    store = schedule_store(backend)
    now = store.db_now()
    start, col = now - 100_000_000, 10_000_000  # ten columns of 10 s

    def at(name: str, kind: str, sent: int, late: int = 0, ns: str = NS,
           outcome: str | None = None) -> dict[str, Any]:  # fmt: skip
        if kind in ("missed", "skipped"):
            return history_row(ns, name, kind, run_key=sent, term=7, sent_at=start + sent)
        return run_row(ns, name, kind, due=sent, term=7, sent_at=start + sent,
                       due_at=start + sent - late, task_id=f"t-{name}-{kind}-{sent}",
                       outcome=outcome, duration_us=1500 if outcome else 0)  # fmt: skip

    rows = [at("busy", "run", k * 400_000) for k in range(20)]  # column 0: twenty on time
    rows += [at("busy", "run", 3_000_100, outcome="FAILURE")]  # ... and one that failed
    rows += [at("busy", "run", col + 1), at("busy", "run_now", col + 2)]  # column 1: late wins
    rows += [at("busy", "run", col + 3, late=2_000_000), at("busy", "run", col + 4, late=700_000)]
    rows += [at("busy", "skipped", 2 * col), at("busy", "missed", 2 * col + 5)]  # 2: missed
    rows += [at("busy", "run_now", 3 * col, late=9_000_000)]  # 3: a run now is never late
    rows += [at("quiet", "run", 5 * col + 1)]
    rows += [at("busy", "run", 1, ns="elsewhere")]  # another namespace: not shown
    worker_only = {**at("busy", "run", 2), "kind": None, "entry_key": None, "run_key": "w"}
    rows += [worker_only]  # a task's run the once-check keeps, not a beat's: not shown
    rows += [at("quiet", "run", 10 * col)]  # at the window's end: outside [from, to)
    store.record_many(rows)
    got = store.marks([NS], start, start + 10 * col, col)
    busy, quiet = entry_key("busy"), entry_key("quiet")
    expected = [
        EntryMarks(
            busy,
            columns=(0, 1, 2, 3),
            marks=tuple(MARKS.index(m) for m in ("failed", "late", "missed", "run-now")),
            runs=(21, 4, 2, 1),
            late_us=(None, 2_000_000, None, None),  # the most late of column 1's late runs
        ),
        EntryMarks(quiet, (5,), (MARKS.index("on-time"),), (1,), (None,)),
    ]
    assert got == sorted(expected)
    # the runs behind a mark: the worst first, and how many of each
    runs, counts = store.runs_in([NS], busy, start, start + col)
    assert counts == {"on-time": 20, "failed": 1}
    worst = runs[0]
    assert (worst.task_id, worst.outcome, worst.duration_us, worst.term) == (
        f"t-busy-run-{3_000_100}",
        "FAILURE",
        1500,
        7,
    )
    assert [run_mark(r) for r in runs] == ["failed"] + ["on-time"] * 19  # 20 at most
    runs, counts = store.runs_in([NS], busy, start + col, start + 2 * col)
    assert [run_mark(r) for r in runs] == ["late", "late", "run-now", "on-time"]
    assert counts == {"late": 2, "run-now": 1, "on-time": 1}
    assert store.runs_in([NS], quiet, start, start + col) == ([], {})
    assert store.marks([NS], start + 6 * col, start + 9 * col, col) == []
    assert store.marks([NS, "elsewhere"], start, start + col, col)[0].runs == (22,)


@pytest.mark.parametrize("kind", SQL_KINDS)
def test_the_timelines_queries_read_the_namespace_and_window_by_index(
    kind: str, tmp_path: Any
) -> None:
    """The plans of ``marks`` and ``runs_in`` on each database: an index range, no table scan.

    ``marks`` reads the covering index alone (the rows of a day are ~100,000: reading each
    row the index points to was a third of the timeline's time). 30 days of 20 entries'
    history (every 30 minutes: 28,800 rows) and as much in another namespace; the window
    is one hour.
    """
    b = backend_from_url(url_for(kind, tmp_path), table_prefix=f"p{uuid.uuid4().hex[:10]}_")
    assert isinstance(b, SQLBackend)
    b.install()
    try:
        store = schedule_store(b)
        now = store.db_now()
        day = 86_400_000_000
        rows = [
            run_row(ns, f"e{i}", due=t, sent_at=t, due_at=t)
            for ns in (NS, "other")
            for i in range(20)
            for t in range(now - 30 * day + i * 1000, now, 1_800_000_000)
        ]
        for k in range(0, len(rows), 10_000):
            store.record_many(rows[k : k + 10_000])
        with b.engine.begin() as conn:
            table = store.run.name
            conn.exec_driver_sql({"sqlite": f"ANALYZE {table}", "postgresql": f"ANALYZE {table}",
                                  "mysql": f"ANALYZE TABLE {table}"}[kind])  # fmt: skip
        hour = 3_600_000_000
        this_ns = store.run.c.namespace == NS  # the store's reads of one namespace
        plans = {
            "marks": marks_statement(store.run, this_ns, now - hour, now, 3_000_000),
            "runs_in": runs_in_statements(store.run, this_ns, entry_key("e3"), now - hour, now)[0],
        }
        for what, stmt in plans.items():
            plan = explain(b, stmt)
            print(f"{kind} {what}:\n{plan}")
            assert f"{table}_window" in plan or f"{table}_entry" in plan, plan
            # no scan of the history table (MariaDB scans the per-column rows it derived)
            table_scan = r"SCAN [^ ]*task_start(?! USING)|Seq Scan|task_start type=ALL\b"
            assert not re.search(table_scan, plan), plan
        only_index = {"sqlite": f"USING COVERING INDEX {table}_window",
                      "postgresql": f"Index Only Scan using {table}_window",
                      "mysql": f"key={table}_window "}[kind]  # fmt: skip
        plan = explain(b, plans["marks"])
        assert only_index in plan, plan
        if kind == "mysql":
            assert re.search(r"Extra=.*Using index(;|$)", plan), plan  # not "index condition"
        got = store.marks([NS], now - hour, now, 3_000_000)
        assert len(got) == 20 and all(len(m.columns) == 2 for m in got)
    finally:
        b.uninstall()
        b.close()


def explain(b: SQLBackend, stmt: Any) -> str:
    """The database's plan of ``stmt`` as text."""
    sql = str(stmt.compile(b.engine, compile_kwargs={"literal_binds": True}))
    with b.engine.connect() as conn:
        if b.engine.dialect.name == "sqlite":
            return "\n".join(r[-1] for r in conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {sql}"))
        if b.engine.dialect.name == "postgresql":
            return "\n".join(r[0] for r in conn.exec_driver_sql(f"EXPLAIN {sql}"))
        result = conn.exec_driver_sql(f"EXPLAIN {sql}")
        return "\n".join(" ".join(f"{k}={v}" for k, v in r._mapping.items()) for r in result)


def test_a_write_lost_to_another_writer_is_an_election_error(tmp_path: Any) -> None:
    """SQLite busy (another process holds the write lock) is a lost round: the store says
    so as an ElectionError, which the beat's callers retry; escaping as itself, it stopped
    the beat (a chaos run's lock fault)."""
    import sqlite3

    from celery_election.errors import ElectionError

    path = tmp_path / "election.db"
    backend = backend_from_url(f"sqlite:///{path}", statement_timeout=0.2)
    backend.install()
    store = schedule_store(backend)
    other = sqlite3.connect(path, isolation_level=None)
    try:
        other.execute("BEGIN EXCLUSIVE")
        with pytest.raises(ElectionError, match="busy with another writer"):
            store.prune_terms("ns", 0)
        other.execute("ROLLBACK")
        assert store.prune_terms("ns", 0) == 0  # free again: written
    finally:
        other.close()
        backend.close()
