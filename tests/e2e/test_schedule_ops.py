"""The operable schedule with real processes: 2 beats, 2 workers, the CLI from a third shell.

RabbitMQ + PostgreSQL, and SQLite (broker and database). Every operation goes through
``celery -A proj election schedule ...`` in a process of its own; its effect is observed in
what the workers executed (tests/e2e/proj.py records each execution with its run key and
task id) and in the history the leader and the workers write. The leading beat is
SIGKILLed in the middle. At the end: no run executed twice, every run the history says
was sent was executed, and each operation's delay from its audit record to its first
effect on the leader is printed (the benchmark's figure, not an assertion).
"""

from __future__ import annotations

import collections
import itertools
import signal
import threading
from typing import Any

import pytest
import sqlalchemy as sa

from celery_election.backends import SQLBackend
from celery_election.schedule.store import schedule_store
from harness.cluster import Cluster, wait_until

pytestmark = [
    pytest.mark.slow,
    pytest.mark.tier2,
    pytest.mark.parametrize(
        "cluster",
        [{"beat": True}, {"beat": True, "kind": "sqla+sqlite"}],
        indirect=True,
        ids=["rabbitmq+postgresql", "sqlite"],
    ),
]
TICK = "tests.e2e.proj.tick"


def cli(c: Cluster, *args: str) -> str:
    return c.schedule_cli(*args, actor="e2e-operator")


def executions(c: Cluster, entry: str) -> list[Any]:
    return [r for r in c.rows(c.ticks) if r.entry == entry]


def history(c: Cluster, entry: str) -> list[Any]:
    backend = c.backend
    assert isinstance(backend, SQLBackend)
    return schedule_store(backend).history([f"{c.namespace}-beat"], entry, limit=1000)


def recorded(c: Cluster, entry: str, pick: Any, what: str) -> list[Any]:
    """The entry's history rows ``pick`` accepts, once there are some: the leader writes
    its history in batches, a moment after the sends the workers already ran."""
    return wait_until(lambda: [h for h in history(c, entry) if pick(h)], 30, what)


def audit_at(c: Cluster, action: str, name: str) -> int:
    backend = c.backend
    assert isinstance(backend, SQLBackend)
    rows = schedule_store(backend).audit(f"{c.namespace}-beat", limit=1000)
    return max(a.at for a in rows if a.action == action and a.name == name)


def clicks(c: Cluster, name: str) -> set[int]:
    """The times of the "run now"s of ``name``: each one's key (its ``election_run``)."""
    backend = c.backend
    assert isinstance(backend, SQLBackend)
    rows = schedule_store(backend).audit(f"{c.namespace}-beat", limit=1000)
    return {a.at for a in rows if a.action == "run_now" and a.name == name}


def test_operations_from_a_third_shell_take_effect_on_the_leader(cluster: Cluster) -> None:
    c = cluster
    for name in ("w1", "w2"):
        # --election: a run the killed leader sent and had not marked is sent again by
        # the next (its task id, election_resent); the workers' check runs it once
        c.start(name)
    c.start_beat("b1")
    c.start_beat("b2")
    first = c.wait_beat_leader(30)
    delays: dict[str, float] = {}

    cli(c, "add", "dyn", TICK, "every 10s", "--args", '["dyn"]')
    cli(c, "edit", "dyn", "--schedule", "every 2s")  # 10 s -> 2 s
    edited = audit_at(c, "edit", "dyn")
    wait_until(lambda: len(executions(c, "dyn")) >= 2, 30, "two runs of the edited entry")
    first_run = min(h.sent_at for h in recorded(c, "dyn", lambda h: h.kind == "run", "a run"))
    # created with 10 s, edited at once to 2 s: the first run comes 2 s after it was added
    delays["edit 10 s -> 2 s (first run after)"] = (first_run - edited) / 1e6
    assert first_run - audit_at(c, "add", "dyn") < 10_000_000

    # run now, from two shells at once: one run
    outs: list[str] = []
    shells = [threading.Thread(target=lambda: outs.append(cli(c, "run", "dyn"))) for _ in "ab"]
    for t in shells:
        t.start()
    for t in shells:
        t.join()
    wait_until(lambda: any(r.run in clicks(c, "dyn") for r in executions(c, "dyn")), 30,
               "the run now")  # fmt: skip
    delays["run now"] = (
        recorded(c, "dyn", lambda h: h.kind == "run_now", "the run now")[0].sent_at
        - audit_at(c, "run_now", "dyn")
    ) / 1e6

    cli(c, "pause", "dyn")
    paused = audit_at(c, "pause", "dyn")
    wait_until(lambda: len(executions(c, "every-second-a")) >= 3, 30, "static ticks")
    base = len(executions(c, "every-second-a"))
    wait_until(lambda: len(executions(c, "every-second-a")) >= base + 4, 30, "4 s passing")
    sent_after = [h for h in history(c, "dyn") if h.kind == "run" and h.sent_at > paused]
    assert len(sent_after) <= 1  # at most a run the leader had in hand when it looked
    delays["pause (last run after it)"] = max(
        [(h.sent_at - paused) / 1e6 for h in sent_after], default=0.0
    )
    before = len(executions(c, "dyn"))
    cli(c, "resume", "dyn", "--missed", "skip")
    wait_until(lambda: any(h.kind == "missed" for h in history(c, "dyn")), 30, "missed runs")
    wait_until(lambda: len(executions(c, "dyn")) > before, 30, "runs again after resume")

    # the leader dies in the middle
    c.signal(first, signal.SIGKILL)
    second = c.wait_beat_leader(30, other_than=first)
    assert second != first
    cli(c, "pause", "dyn")
    wait_until(lambda: len(executions(c, "every-second-b")) >= base + 10, 60, "time passing")
    caught = len(executions(c, "dyn"))
    cli(c, "resume", "dyn", "--missed", "catch_up")
    resumed = audit_at(c, "resume", "dyn")
    wait_until(lambda: len(executions(c, "dyn")) > caught, 30, "the catch-up run")
    delays["resume, catch up"] = (
        min(h.sent_at for h in recorded(c, "dyn", lambda h: h.sent_at > resumed, "a run")) - resumed
    ) / 1e6

    # overlap: a task that runs 3 periods is not sent again while it runs
    cli(c, "add", "slow", TICK, "every 1s", "--args", '["slow", 3.0]', "--overlap", "skip")
    wait_until(
        lambda: sum(1 for r in executions(c, "slow") if r.ended_at) >= 2, 60, "two slow runs"
    )
    slow = sorted(executions(c, "slow"), key=lambda r: r.started_at)
    for a, b in itertools.pairwise(slow):
        assert a.ended_at is not None and b.started_at >= a.ended_at, "slow runs overlapped"
    wait_until(lambda: sum(h.count for h in history(c, "slow") if h.kind == "skipped") >= 2,
               30, "two skipped runs, counted in the history")  # fmt: skip
    finished = recorded(c, "slow", lambda h: h.kind == "run" and h.finished_at, "an end")
    assert finished and all(h.outcome == "SUCCESS" for h in finished)  # workers' reports
    assert all(h.duration_us and h.duration_us >= 2_900_000 for h in finished)

    cli(c, "remove", "dyn")
    cli(c, "remove", "slow")
    removed = audit_at(c, "remove", "dyn")
    mark = len(executions(c, "every-second-a"))
    wait_until(lambda: len(executions(c, "every-second-a")) >= mark + 3, 30, "time passing")
    late = [h for h in history(c, "dyn") if h.sent_at > removed]
    assert len(late) <= 1
    listed = cli(c, "list")
    assert "dyn" not in listed and "every-second-a" in listed

    # nothing twice, nothing lost
    done = c.rows(c.ticks)
    keyed = [(r.entry, r.run) for r in done if r.run is not None]
    twice = [k for k, n in collections.Counter(keyed).items() if n > 1]
    assert twice == [], f"runs executed twice: {twice}"
    executed = {r.task_id for r in done}
    for entry in ("dyn", "slow"):
        sent = {h.task_id for h in history(c, entry) if h.task_id}
        assert sent <= executed, f"{entry}: sent but never executed: {sent - executed}"
    runs_now = [r for r in executions(c, "dyn") if r.run in clicks(c, "dyn")]
    # two shells at once: one run per request the CLI accepted ("already pending": none;
    # a second shell that starts after the leader served the first makes a request of
    # its own, as a second click would)
    accepted = sum("requested" in out for out in outs)
    assert 1 <= accepted <= 2 and len(runs_now) == accepted, (outs, runs_now)
    print(f"\n[{getattr(c, 'kind', '?')}] delay from the audit record to the leader's effect:")
    for what, seconds in delays.items():
        print(f"  {what:<36} {seconds:7.3f} s")


def _age_run_state(c: Cluster, seconds: float) -> None:
    """Move every stored last run back: as if every beat had been down that long."""
    table = c.backend.beat_run  # type: ignore[attr-defined]
    with c.engine.begin() as conn:
        conn.execute(
            sa.update(table).values(last_run_at=table.c.last_run_at - int(seconds * 1_000_000))
        )


def test_catch_up_policies_after_every_beat_was_down(cluster: Cluster) -> None:
    """Every beat stops; the shared state is what five and a half minutes of outage leave
    (each entry's last run moved back 330 s: five runs of a 60 s entry fell due, the last
    30 s ago); two beats start again. latest: one run; skip: none; all (max 3): three."""
    c = cluster
    c.start("w1", election=False)
    c.start_beat("b1")
    c.wait_beat_leader(30)
    policies = {"latest": [], "skip": ["--catch-up", "skip"],
                "all": ["--catch-up", "all", "--catch-up-max", "3"]}  # fmt: skip
    for name, extra in policies.items():
        cli(c, "add", name, TICK, "every 1s", "--args", f'["{name}"]', *extra)
    wait_until(lambda: all(executions(c, n) for n in policies), 30, "a first run of each")
    for name in policies:
        cli(c, "edit", name, "--schedule", "every 60s")
    mark = len(executions(c, "every-second-a"))
    wait_until(lambda: len(executions(c, "every-second-a")) >= mark + 2, 30, "the edits applied")
    before = {n: len(executions(c, n)) for n in policies}
    c.signal("b1", signal.SIGTERM)
    c.wait_exit("b1")
    _age_run_state(c, 330)
    c.start_beat("b2")
    c.start_beat("b3")
    c.wait_beat_leader(30)
    wait_until(lambda: len(executions(c, "all")) >= before["all"] + 3, 60, "three catch-up runs")
    mark = len(executions(c, "every-second-a"))
    wait_until(lambda: len(executions(c, "every-second-a")) >= mark + 3, 30, "time passing")
    after = {n: len(executions(c, n)) - before[n] for n in policies}
    assert after == {"latest": 1, "skip": 0, "all": 3}
    missed = {n: sum(h.count for h in history(c, n) if h.kind == "missed") for n in policies}
    assert missed == {"latest": 0, "skip": 5, "all": 2}
