"""The history checker must catch every kind of violation it claims to, and pass clean runs.

Histories here are written by hand: each test builds the smallest one that breaks (or
keeps) one invariant, so a checker that stopped looking would fail here.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from celery_election import Elector
from celery_election.backends import MemoryBackend
from celery_election.core.clock import FakeClock
from celery_election.history import Recorder
from harness.checker import check, intervals, load

NS = "ns"


def trust(
    cand: str, mono: float, term: int | None, until: float | None, pid: int = 1
) -> dict[str, Any]:
    return {"k": "trust", "mono": mono, "wall": 1000 + mono, "pid": pid, "ns": NS,
            "cand": cand, "term": term, "until": until}  # fmt: skip


def act(term: int, mono: float, k: str = "act", **extra: Any) -> dict[str, Any]:
    return {"k": k, "mono": mono, "wall": 1000 + mono, "pid": 9, "ns": NS, "term": term, **extra}


def sends(term: int, seconds: list[float]) -> list[dict[str, Any]]:
    """Beat sends of entry "e" at those seconds, each run keyed on the one before."""
    out, run = [], 0
    for t in seconds:
        at = int((1000 + t) * 1e6)
        out.append(act(term, t, "send", entry="e", run=run, at=at))
        run = at
    return out


def handoff() -> list[dict[str, Any]]:
    """a leads term 1 (renewed to 10.0), resigns at 9; b leads term 2 from 9.5."""
    return [
        trust("a", 0.0, 1, 5.0),
        trust("a", 4.0, 1, 10.0),
        trust("a", 9.0, None, None),
        trust("b", 9.5, 2, 15.0),
    ]


def test_clean_handoff_passes_and_measures_the_gap() -> None:
    recs = [*handoff(), act(1, 8.9), act(2, 9.6)]
    rep = check(recs)
    assert rep.ok, rep.violations
    assert rep.leaderships == 2 and rep.terms == 2 and rep.acts == 2
    assert rep.gaps[NS] == [(0.5, 9.0)]
    ivs = intervals(recs)
    assert [(i.cand, i.start, i.end) for i in ivs] == [("a", 0.0, 9.0), ("b", 9.5, 15.0)]


def test_overlapping_trust_is_split_brain() -> None:
    recs = [trust("a", 0.0, 1, 10.0), trust("b", 9.0, 2, 15.0)]
    rep = check(recs)
    assert any("split brain" in v for v in rep.violations)
    assert rep.overlap_seconds == 1.0


def test_overlap_within_the_measured_clock_error_is_allowed() -> None:
    recs = [trust("a", 0.0, 1, 10.0), trust("b", 9.9995, 2, 15.0)]
    recs.append({"k": "clock_error", "mono": 0.0, "wall": 0.0, "pid": 1, "seconds": 0.001})
    rep = check(recs)
    assert rep.ok and rep.tolerated_overlaps == 1
    assert not check(recs, clock_error=0.0).ok


def test_a_killed_leader_ends_at_its_last_until() -> None:
    recs = [trust("a", 0.0, 1, 5.0), trust("b", 5.2, 2, 9.0)]
    assert check(recs).ok  # a never wrote "ended": its trust ran out at 5.0
    assert not check([trust("a", 0.0, 1, 5.3), trust("b", 5.2, 2, 9.0)]).ok


def test_term_going_down_and_term_shared() -> None:
    down = [trust("a", 0.0, 5, 1.0), trust("b", 2.0, 4, 3.0)]
    assert any("went down" in v for v in check(down).violations)
    shared = [trust("a", 0.0, 5, 1.0), trust("b", 2.0, 5, 3.0)]
    assert any("held by a and by b" in v for v in check(shared).violations)
    regained = [trust("a", 0.0, 5, 1.0), trust("a", 1.5, None, None), trust("a", 2.0, 5, 3.0)]
    assert check(regained).ok  # the same candidate may trust its own term again


def test_acts_outside_trust_or_under_another_term() -> None:
    late = [*handoff(), act(1, 9.7)]  # a acted after it resigned, while b led
    violations = check(late).violations
    assert any("outside every trust window" in v for v in violations)
    assert any("while term 2" in v for v in violations)
    unknown = [*handoff(), act(7, 3.0)]
    assert any("outside every trust window" in v for v in check(unknown).violations)


def test_duplicate_and_lost_ticks() -> None:
    base = [trust("a", 0.0, 1, 100.0)]
    sent = sends(1, [1, 2, 4.5])
    rep = check(base + sent, tick_every={"e": 1.0}, tick_settle=1.0)
    assert rep.lost_ticks == 1 and not rep.ok  # due at 3: one leader all along, never sent
    # the run after the one at 2 sent again (another leader saw the same state)
    dup = base + sent + [act(1, 4.6, "send", entry="e", run=int(1002e6), at=int(1004.6e6))]
    rep = check(dup, tick_every={"e": 1.0}, tick_settle=1.0)
    assert rep.duplicate_ticks == 1
    assert any("sent 2 times" in v for v in rep.violations)
    on_time = check(base + sends(1, [1, 2, 3.4, 4.3]), tick_every={"e": 1.0}, tick_settle=1.0)
    assert on_time.ok and on_time.lost_ticks == 0  # late within the settle time: not lost


def test_a_tick_missed_during_a_failover_is_excused() -> None:
    recs = [trust("a", 0.0, 1, 2.5), trust("b", 3.5, 2, 100.0)]
    sent = sends(1, [1.0, 2.0]) + sends(2, [4.5])
    sent[-1]["run"] = sent[-2]["at"]  # b resumed from a's last run
    rep = check(recs + sent, tick_every={"e": 1.0}, tick_settle=1.0)
    assert rep.ok, rep.violations
    assert rep.excused_ticks == 1 and rep.lost_ticks == 0


def ran(sent: list[dict[str, Any]], mono_after: float = 0.2) -> list[dict[str, Any]]:
    """A worker's execution of each of those sends (its ``ran`` record)."""
    return [act(0, s["mono"] + mono_after, "ran", entry=s["entry"], run=s["run"]) for s in sent]


def test_by_executions_a_failover_excuses_nothing() -> None:
    """Judged by executions, a due time with no run is lost whoever led then."""
    recs = [trust("a", 0.0, 1, 2.5), trust("b", 3.5, 2, 100.0), act(0, 20.0, "end")]
    sent = sends(1, [1.0, 2.0]) + sends(2, [4.5])
    sent[-1]["run"] = sent[-2]["at"]
    rep = check(recs + sent + ran(sent), tick_every={"e": 1.0}, tick_settle=1.0, executions=True)
    # due at 3: skipped in the failover (the run at 4.5 stands for the one due at 4, late)
    assert rep.lost_ticks == 1 and not rep.ok
    assert rep.excused_ticks == 0
    caught_up = sends(1, [1.0, 2.0])
    # b sends each missed due time as a run of its own (catch_up="all"): stored at it
    for k, t in enumerate([3.0, 4.0, 5.0]):
        at = int((1000 + t) * 1e6)
        caught_up.append(act(2, 4.5 + k / 100, "send", entry="e", run=caught_up[-1]["at"], at=at))
    rep = check(recs + caught_up + ran(caught_up), tick_every={"e": 1.0}, tick_settle=1.0,
                executions=True)  # fmt: skip
    assert rep.ok, rep.violations
    assert rep.executed == 5 and rep.lost_ticks == 0


def test_by_executions_a_resend_is_not_a_duplicate_and_a_second_run_is() -> None:
    base = [trust("a", 0.0, 1, 100.0), act(0, 20.0, "end")]
    sent = sends(1, [1.0, 2.0, 3.0])
    again = {**sent[1], "mono": 2.5}  # the ledger sent the run again: one task id
    rep = check(base + sent + [again] + ran(sent), tick_every={"e": 1.0}, executions=True)
    assert rep.ok, rep.violations
    assert rep.resent == 1 and rep.executed == 3 and rep.duplicate_ticks == 0
    twice = ran(sent) + ran(sent[1:2], mono_after=0.4)
    rep = check(base + sent + twice, tick_every={"e": 1.0}, executions=True)
    assert rep.duplicate_ticks == 1 and any("executed 2 times" in v for v in rep.violations)


def test_by_executions_a_run_sent_and_never_executed_is_lost() -> None:
    base = [trust("a", 0.0, 1, 100.0), act(0, 5.0, "end")]
    sent = sends(1, [1.0, 2.0, 3.0, 4.0])
    rep = check(base + sent + ran(sent[:1] + sent[2:3]), tick_every={"e": 1.0},
                tick_settle=2.0, executions=True)  # fmt: skip
    # the run at 2 never ran; the one at 4 may still be on its way at the end (5)
    assert rep.lost_ticks == 1, rep.violations
    assert [v for v in rep.violations if "never executed" in v] == [
        f"{NS}: run e after {int(1001e6)} was sent, never executed"
    ]


def test_failover_is_attributed_to_the_fault_that_hit_the_leader() -> None:
    recs = [trust("a", 0.0, 1, 5.0, pid=11), trust("b", 6.0, 2, 20.0, pid=12)]
    recs.append({"k": "fault", "mono": 3.0, "wall": 0, "pid": 1, "ns": NS, "kind": "kill",
                 "target_pid": 11, "phase": "start"})  # fmt: skip
    rep = check(recs)
    assert rep.failover == {"kill": [3.0]} and rep.faults == {"kill": 1}
    # A later fault elsewhere ends the kill's window: b's term is not the kill's doing.
    other = {**recs[-1], "mono": 4.0, "ns": "elsewhere", "kind": "restart", "target_pid": 0}
    assert check([*recs, other]).failover == {}


def test_recorder_follows_an_elector(tmp_path: Path) -> None:
    """The recorder's trust lines come from the elector itself, renewals included."""
    clock = FakeClock()
    backend = MemoryBackend(clock)
    path = tmp_path / "h.jsonl"
    elector = Elector(backend, NS, "a", ttl=3, clock=clock)
    rec = Recorder(path, role="test", monotonic=clock.monotonic).attach(elector)
    t0 = clock.monotonic()
    elector.start()
    assert clock.settled(elector.sleepers()) and elector.is_leader
    term = elector.term
    clock.advance(1.3)  # past one renew interval (0.4 x ttl)
    assert clock.settled(elector.sleepers())
    elector.stop()
    rec.close()
    records = load([path])
    lines = [(r["mono"], r["term"], r["until"]) for r in records if r["k"] == "trust"]
    assert lines[0][:2] == (t0, term) and lines[-1][1:] == (None, None)
    assert lines[1][0] >= t0 + 1.2 and lines[1][2] > lines[0][2]  # a renewal moved it
    (iv,) = intervals(records)
    assert (iv.term, iv.start, iv.end) == (term, t0, lines[-1][0])
    assert check(records).ok


def test_findings_are_counted_against_the_fault_whose_window_they_fall_in() -> None:
    def fault(kind: str, mono: float) -> dict[str, Any]:
        return {"k": "fault", "mono": mono, "wall": 0, "pid": 1, "ns": NS, "kind": kind,
                "target_pid": 0, "phase": "start"}  # fmt: skip

    recs = [trust("a", 0.0, 1, 10.0), trust("b", 9.0, 2, 30.0), fault("stall", 8.5)]
    sent = sends(2, [12, 14.5])  # the run due at 13 (b led throughout) was never sent
    recs += [*sent, act(2, 14.6, "send", entry="e", run=int(1012e6), at=int(1014.6e6))]
    recs.append(fault("kill", 13.5))
    rep = check(recs, tick_every={"e": 1.0}, tick_settle=1.0)
    assert rep.per_fault == {
        "stall": {"overlap_s": 1.0, "lost_ticks": 1},  # due at 13: b led throughout
        "kill": {"duplicate_ticks": 1},
    }


def test_a_line_recorded_after_close_is_dropped_not_written_elsewhere(tmp_path: Path) -> None:
    """The follower thread's last transition can arrive after close(): a write to the
    closed descriptor raised (EBADF), and had the number been reused, it would have gone
    into another file."""
    rec = Recorder(tmp_path / "h.jsonl", role="t")
    rec.record("act", ns="n", term=1)
    rec.close()
    other = os.open(tmp_path / "other", os.O_WRONLY | os.O_CREAT)  # may reuse the number
    try:
        rec.record("act", ns="n", term=2)
        rec.close()  # idempotent
    finally:
        os.close(other)
    assert (tmp_path / "other").read_bytes() == b""
    assert [r["term"] for r in load([tmp_path / "h.jsonl"])] == [1]


def test_by_executions_a_run_again_after_its_worker_was_killed_is_counted_apart() -> None:
    """acks_late: a worker killed after the body and before its end was recorded has the
    run redelivered and run again (documented); the same twice without a kill is not."""
    base = [trust("a", 0.0, 1, 100.0), act(0, 20.0, "end")]
    sent = sends(1, [1.0, 2.0])
    first, again = ran(sent[:1]), ran(sent[:1], mono_after=0.9)
    first[0]["ppid"] = 77
    kill = {"k": "fault", "mono": 1.3, "wall": 1001.3, "pid": 1, "kind": "kill",
            "phase": "start", "target_pid": 77}  # fmt: skip
    recs = base + sent + ran(sent[1:]) + first + again
    rep = check([*recs, kill], tick_every={"e": 1.0}, executions=True)
    assert rep.ok, rep.violations
    assert rep.rerun_after_death == 1 and rep.duplicate_ticks == 0
    rep = check(recs, tick_every={"e": 1.0}, executions=True)  # no kill: run twice
    assert rep.duplicate_ticks == 1 and not rep.ok
    late = {**kill, "mono": 3.5}  # killed long after: the run had ended
    rep = check([*recs, late], tick_every={"e": 1.0}, executions=True)
    assert rep.duplicate_ticks == 1 and not rep.ok
