"""Leader-only beat with real processes: each run is executed once, through kills and pauses.

Entries fire every second. Faults: SIGKILL of the leading beat twice, SIGSTOP of it past
its lease once (then SIGCONT: it must not send as a stale leader). Every execution records
(entry, run key: the stored time of the run it follows, task id: a hash of its own stored
time); the check is 0 duplicates per (entry, run), and no run lost, failovers included
(the run each executed key names was executed too). Runs missed while no beat led
collapse into one catch-up, as in Celery: late, not lost.
The workers run with ``--election``: a run a killed beat sent and had not marked is sent
again by the next leader under its task id, and the worker's run row runs it once.
"""

from __future__ import annotations

import collections
import itertools
import os
import signal
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from celery_election.beat.ledger import run_task_id
from celery_election.core.runstate import ENDED, run_key
from celery_election.runs.once import HEADER, ROWS
from celery_election.schedule.store import schedule_store
from harness.cluster import Cluster, wait_until

pytestmark = [
    pytest.mark.slow,
    pytest.mark.parametrize("cluster", [{"beat": True}], indirect=True, ids=["beat"]),
]
ENTRIES = ("every-second-a", "every-second-b")


def wait_ticks(c: Cluster, more: int, timeout: float = 30) -> None:
    """Until ``more`` further executions per entry have been recorded."""
    start = collections.Counter(r.entry for r in c.rows(c.ticks))
    wait_until(
        lambda: all(
            collections.Counter(r.entry for r in c.rows(c.ticks))[e] >= start[e] + more
            for e in ENTRIES
        ),
        timeout,
        f"{more} more ticks of each entry",
    )


def check_history(
    c: Cluster, faults: list[float], namespace: str, *, workers_faulted: bool = False
) -> dict[str, int]:
    """0 duplicates, and 0 runs lost, failovers included. Returns counts.

    Each execution records its run's key (the stored time of the run it follows) and its
    task id (:func:`run_task_id` of its own stored time). So for every key ``k`` executed,
    the run stored at ``k`` ran iff the task id ``run_task_id(namespace, entry, k)`` was
    executed: a run lost breaks that chain, a late tick (a machine under load) does not.

    ``workers_faulted`` (the faults killed workers, embedded beats): a run whose first
    execution started on a worker just before that worker was killed or stopped comes back
    under acks_late (the e2e project's setting) and runs again: the documented limit of a
    task whose worker dies mid-way (docs/workers.md), counted apart. Otherwise a run
    executed twice is a failure.
    """
    rows = c.rows(c.ticks)
    assert rows, "no tick was executed"
    links = late = again = 0
    for entry in ENTRIES:
        mine = sorted((r for r in rows if r.entry == entry), key=lambda r: r.started_at)
        runs = [r.run for r in mine]
        assert all(k is not None for k in runs), "a run without its key"
        first: dict[int, float] = {}
        for r in mine:
            first.setdefault(r.run, r.started_at / 1e6)
        dup = [k for k, n in collections.Counter(runs).items() if n > 1]
        cut = [k for k in dup if workers_faulted and any(f - 2.0 <= first[k] <= f for f in faults)]
        again += len(cut)
        assert [k for k in dup if k not in cut] == [], f"{entry}: runs executed twice: {dup}"
        executed = {r.task_id for r in mine}
        # 0 keys an entry's very first run; the first key may also be the state the first
        # leader stored when it loaded the schedule (no run: Celery's first is a period on)
        keys = sorted(k for k in set(runs) if k)
        for k in keys[1:]:
            links += 1
            task_id = run_task_id(namespace, entry, k)
            if task_id not in executed:  # did a worker start it (and how did it end)?
                starts = c.backend.runs.newest(c.namespace, task_id=task_id)
                seen = [(r.run, r.started_at, r.task_id) for r in mine]
                raise AssertionError(
                    f"{entry}: the run stored at {k / 1e6:.3f} was never executed (faults "
                    f"at {faults}); its run rows: {starts}; executions (key, started, "
                    f"task id): {seen}"
                )
        late += sum(1 for a, b in itertools.pairwise(keys) if b - a > 1_900_000)
    assert links >= 2 * len(ENTRIES), f"only {links} runs followed others: too few to check"
    # one record per run: the row its claim wrote (in the beats' namespace), which the
    # worker that ran it started and ended; none beside it in the workers' namespace
    ran = {r.task_id for r in rows}

    def ended() -> set[str]:
        runs = c.backend.runs.newest(namespace, limit=1_000_000)
        return {r.row.task_id for r in runs if r.row.state == ENDED}

    wait_until(lambda: ran <= ended(), 30, "every run executed ends the row its claim wrote")
    if namespace != c.namespace:
        assert not ran & {r.row.task_id for r in c.backend.runs.newest(c.namespace, limit=10**6)}
    terms = {r.term for r in rows}
    assert None not in terms
    return {"executions": len(rows), "runs_checked": links, "late_ticks": late,
            "terms": len(terms), "again_after_a_worker_fault": again}  # fmt: skip


def run_faults(c: Cluster, leader: Callable[[str | None], str]) -> list[float]:
    """Kill, pause, kill the leader; returns the wall-clock time of each fault."""
    faults = []
    first = leader(None)
    wait_ticks(c, 3)
    faults.append(time.time())
    c.signal(first, signal.SIGKILL)
    second = leader(first)
    wait_ticks(c, 3)
    faults.append(time.time())
    c.signal(second, signal.SIGSTOP)  # paused past its lease...
    third = leader(second)
    wait_ticks(c, 3)
    c.signal(second, signal.SIGCONT)  # ...and back: it must not send as a stale leader
    wait_ticks(c, 3)
    faults.append(time.time())
    c.signal(third, signal.SIGKILL)
    leader(third)
    wait_ticks(c, 4)
    return faults


def test_three_standalone_beats(cluster: Cluster) -> None:
    c = cluster
    c.start("w")  # --election: a run sent again (its task id) runs once
    for b in ("b1", "b2", "b3"):
        c.start_beat(b)
    faults = run_faults(c, lambda other: c.wait_beat_leader(30, other_than=other))
    stats = check_history(c, faults, f"{c.namespace}-beat")
    print(f"\nbeat history: {stats}")
    assert stats["terms"] >= 3


def test_a_beat_with_kombus_confirm_publish_sends_each_run_once(cluster: Cluster) -> None:
    """``broker_transport_options={"confirm_publish": True}`` (window 1 of issue 52).

    py-amqp then reads each confirm inside the publish: at 50bbd93 every send counted as
    unconfirmed, was sent again and never marked, and each entry ran once, then never.
    """
    c = cluster
    c.start("w")
    c.start_beat("b1", env={"E2E_BROKER_OPTIONS": '{"confirm_publish": true}'})
    c.wait_beat_leader(30)
    wait_ticks(c, 4)
    stats = check_history(c, [], f"{c.namespace}-beat")
    assert "not confirmed by the broker" not in (c.tmp / "b1.log").read_text()
    print(f"\nbeat history: {stats}")


def test_a_beat_run_whose_singleton_key_is_busy_runs_once_after_its_requeue(
    cluster: Cluster,
) -> None:
    """A beat-sent ``singleton_task`` whose key is held (window 2 of issue 52).

    One run a second, each holding its key for 1.5 s: most find the key busy and are
    requeued. At 50bbd93 the start was recorded before the key check, the requeue ended
    it, and the requeued copy was skipped as a duplicate: those runs never ran. Each run
    the beat sent executes once, and its history row ends SUCCESS (not IGNORED).

    The beat stops once four runs went out: more work than the key can do (1.5 s of it a
    second) grew a backlog without end, whose requeued copies took the key in no order,
    and a CI run's four runs were still waiting after a minute.
    """
    c = cluster
    c.start("w", c=4)
    c.start_beat("b1", env={"E2E_EXCLUSIVE_SECONDS": "1.5"})
    c.wait_beat_leader(30)
    ns, entry = f"{c.namespace}-beat", "exclusive-entry"
    store = schedule_store(c.backend)  # type: ignore[arg-type]
    sent = wait_until(
        lambda: (runs := [h for h in store.history(ns, entry, limit=100) if h.kind == "run"])
        and len(runs) >= 4 and runs[-4:],
        60, "four runs sent",
    )  # fmt: skip
    assert len(sent) == 4
    c.signal("b1", signal.SIGTERM)  # a backlog of a few runs: each gets the key in turn
    c.wait_exit("b1")
    # the runs the broker took: one whose publish the SIGTERM cut stays claimed, owed to the
    # next leader (none here)
    ids = [h.task_id for h in store.history(ns, entry, limit=100)
           if h.kind == "run" and h.state != "claimed"]  # fmt: skip
    assert len(ids) >= 3, ids

    def executions() -> Counter[str]:
        return Counter(r.task_id for r in c.rows(c.ticks) if r.task_id in ids)

    wait_until(lambda: len(executions()) == len(ids) or None, 60, f"runs {ids} executed")
    assert set(executions().values()) == {1}
    assert "requeued: key" in (c.tmp / "w.log").read_text()  # the window was crossed

    def ends() -> dict[str, str | None]:
        return {h.task_id: h.outcome for h in store.history(ns, entry, limit=100)
                if h.task_id in ids}  # fmt: skip

    wait_until(lambda: None not in ends().values() or None, 30, "their history rows end")
    assert set(ends().values()) == {"SUCCESS"}, ends()


def test_runs_whose_confirm_changed_nothing_are_sent_again_by_the_same_leader(
    cluster: Cluster,
) -> None:
    """The leading beat's first confirm changes nothing (window 3 of issue 52; proj.py's
    E2E_FIRST_MARK_CHANGES_NOTHING): its runs stay claimed in the store and the ledger
    forgets them. A worker that starts a run ends its claim too, so the worker starts only
    once the leader found them: at 50bbd93 both entries stalled until the next failover;
    here the leader's recheck sends them again (the worker runs each once) and they go on."""
    c = cluster
    c.start_beat("b1", env={"E2E_FIRST_MARK_CHANGES_NOTHING": "1"})
    leader = c.wait_beat_leader(30)
    log = c.tmp / "b1.log"
    wait_until(lambda: "did not confirm" in log.read_text(), 60, "the recheck's resend")
    c.start("w")
    wait_ticks(c, 4)
    stats = check_history(c, [], f"{c.namespace}-beat")
    assert stats["terms"] == 1 and c.beat_leader() == leader  # no failover


def test_three_workers_with_embedded_beat(cluster: Cluster) -> None:
    c = cluster
    c.start("w1", "-B")
    c.wait_candidates(1)
    c.start("w2", "-B")
    c.start("w3", "-B")
    c.wait_candidates(3)
    faults = run_faults(c, lambda other: c.wait_leader(30, other_than=other))
    stats = check_history(c, faults, c.namespace, workers_faulted=True)
    print(f"\nbeat history: {stats}")
    assert stats["terms"] >= 3


def children(pid: int) -> set[int]:
    """The live child processes of ``pid`` (a beat's publishers)."""
    try:
        return {int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()}
    except FileNotFoundError:
        return set()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has ended


def test_three_standalone_beats_with_publishers(cluster: Cluster) -> None:
    """The same faults with every send going out through a publisher process
    (``election_beat_publishers = 1``): each run once, and a SIGKILLed beat's publisher
    ends with it (no orphan keeps a broker connection open)."""
    c = cluster
    c.start("w")  # --election: a run sent again (its task id) runs once
    for b in ("b1", "b2", "b3"):
        c.start_beat(b, env={"E2E_PUBLISHERS": "1"})
    publishers: dict[str, set[int]] = {}

    def leader(other: str | None) -> str:
        name = c.wait_beat_leader(30, other_than=other)
        pid = c.workers[name].popen.pid  # type: ignore[union-attr]
        publishers[name] = wait_until(lambda: children(pid) or None, 10, f"{name}'s publisher")
        return name

    faults = run_faults(c, leader)
    stats = check_history(c, faults, f"{c.namespace}-beat")
    print(f"\nbeat history with publishers: {stats}")
    assert stats["terms"] >= 3
    killed = [name for name, proc in c.workers.items() if proc.returncode == -signal.SIGKILL]
    assert len(killed) == 2
    for name in killed:
        wait_until(
            lambda name=name: not any(alive(p) for p in publishers[name]) or None,  # type: ignore[misc]
            10,
            f"the publisher of the SIGKILLed {name} to end",
        )


def test_an_embedded_beat_forks_its_publisher_and_sends_each_run_once(cluster: Cluster) -> None:
    """``worker -B --election`` with ``election_beat_publishers = 1``: the beat (a child of
    the worker) forks its publisher, fenced by the worker's own shared record."""
    c = cluster
    c.start("w1", "-B", env={"E2E_PUBLISHERS": "1"})
    c.wait_leader(30)
    wait_ticks(c, 4)
    worker = c.workers["w1"].popen.pid  # type: ignore[union-attr]
    beats = [p for p in children(worker) if children(p)]  # the pool's children have none
    assert len(beats) == 1, "the embedded beat and its publisher"
    stats = check_history(c, [], c.namespace)
    assert stats["terms"] == 1


def test_a_run_sent_again_while_its_first_copy_runs_is_run_once(cluster: Cluster) -> None:
    """A second copy of a run comes while the first runs (each run lasts 10 s,
    ``acks_late``, free pool slots): kombu's publish retry, a redelivery, a copy a
    deposed leader sent; here the test's own publish of the run's message. It is put off
    while the first copy's worker lives, then skipped once the run ended; the run runs
    once, and both its row and its history row end with the first copy's end (window 10
    of issue 52: at 50bbd93 the skipped copy closed the history row IGNORED while the
    first copy ran). A new leader would not send it again: the worker's start ended its
    claim (tests/integration/test_run_ledger.py)."""
    c = cluster
    c.start("w", c=6)
    c.start_beat("b1", env={"E2E_TICK_SECONDS": "10"})
    c.wait_beat_leader(30)
    first = wait_until(lambda: c.rows(c.ticks) or None, 30, "the first run started")[0]
    task_id, beat_ns = first.task_id, f"{c.namespace}-beat"
    headers = {HEADER: first.run, ROWS: beat_ns, "election_term": first.term}
    c.app.send_task("tests.e2e.proj.tick", [first.entry, 10.0], task_id=task_id, headers=headers)
    log = c.tmp / "w.log"
    wait_until(lambda: f"[{task_id}] delayed" in log.read_text() or None, 30,
               "the second copy, put off by the worker")  # fmt: skip
    assert c.rows(c.ticks)[0].ended_at is None  # judged while the first copy ran
    wait_until(lambda: c.rows(c.ticks)[0].ended_at or None, 30, "the first copy's end")
    wait_until(lambda: f"[{task_id}] skipped" in log.read_text() or None, 30,
               "the copy back after the end, skipped")  # fmt: skip
    assert [r.task_id for r in c.rows(c.ticks)].count(task_id) == 1
    stored = c.backend.runs.load(beat_ns, run_key(task_id))
    assert stored is not None and stored.row.state == ENDED, stored
    assert stored.row.outcome == "SUCCESS" and stored.row.attempt == 1, stored
    store = schedule_store(c.backend)  # type: ignore[arg-type]
    row = wait_until(
        lambda: next((h for h in store.history(beat_ns, first.entry, limit=50)
                      if h.task_id == task_id and h.outcome), None),
        30, "the run's history row ends",
    )  # fmt: skip
    assert row.outcome == "SUCCESS" and row.duration_us > 9_000_000, row


@pytest.mark.tier2
def test_a_run_now_whose_leader_dies_before_its_send_runs_once(cluster: Cluster) -> None:
    """Window 9 of issue 52: b1 claims an operator's "run now" and is SIGKILLed before it
    sends it (its send waits: proj.py's E2E_HANG_RUN_NOW_FILE). At 50bbd93 the claim had
    consumed the click and nothing kept it: the run never ran. Now the claim wrote the
    run's row: b2 sends it at its promotion, and the worker runs it once."""
    c = cluster
    hang = c.tmp / "hang-run-now"
    hang.touch()
    c.start("w")
    c.start_beat("b1", env={"E2E_HANG_RUN_NOW_FILE": str(hang)})
    assert c.wait_beat_leader(30) == "b1"
    c.start_beat("b2")
    wait_ticks(c, 2)
    c.schedule_cli("run", "every-second-a")
    log = c.tmp / "b1.log"
    wait_until(lambda: "run now: every-second-a" in log.read_text() or None, 30,
               "b1's claim of the run now")  # fmt: skip
    c.signal("b1", signal.SIGKILL)
    assert c.wait_beat_leader(30, other_than="b1") == "b2"
    store = schedule_store(c.backend)  # type: ignore[arg-type]
    (click,) = [a.at for a in store.audit(f"{c.namespace}-beat") if a.action == "run_now"]

    def runs_now() -> list[Any]:
        return [r for r in c.rows(c.ticks) if r.entry == "every-second-a" and r.run == click]

    wait_until(lambda: runs_now() or None, 30, "the run now, executed")
    wait_ticks(c, 3)
    assert len(runs_now()) == 1
