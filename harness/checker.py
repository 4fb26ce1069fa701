"""Reads the histories ``celery_election.history.Recorder`` writes, and judges them.

The record kinds and the clock they are read on are described in
``celery_election/history.py``. ``check()`` holds a history to the invariants in
docs/design.md: the e2e, chaos and liveness tests and the chaos benchmark judge their
runs with it. Not part of the package (the package only writes histories).
"""

from __future__ import annotations

import bisect
import itertools
import json
import os
import statistics
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Interval", "Report", "check", "intervals", "load"]


def run_key(record: dict[str, Any]) -> tuple[str, str, int]:
    """A beat run's key in a history record (a send, or a worker's execution)."""
    return record["ns"], record["entry"], record["run"]


def load(paths: Iterable[str | os.PathLike[str]]) -> list[dict[str, Any]]:
    """Every record of every file; a torn last line (SIGKILL mid-write) is skipped."""
    out: list[dict[str, Any]] = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for line in f:
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
    out.sort(key=lambda r: r["mono"])
    return out


@dataclass
class Interval:
    """One candidate's trusted leadership under one term, on the boot-time clock."""

    ns: str
    cand: str
    term: int
    start: float
    end: float
    pid: int = 0


def intervals(records: Iterable[dict[str, Any]]) -> list[Interval]:
    """Trusted-leadership intervals from ``trust`` records.

    An interval starts at the record that first shows a term. Each record's ``until``
    holds until the next record replaces it (a liveness session can bring the end
    closer, not only push it back), so the interval ends at the latest of each record's
    ``until`` cut at the next record, and at the record that ends the term. A process
    killed or stopped while leading therefore ends at its last ``until``: it could not
    act after that.
    """
    by_cand: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        if r["k"] == "trust":
            by_cand[(r["ns"], r["cand"])].append(r)
    out: list[Interval] = []
    for (ns, cand), recs in by_cand.items():
        recs.sort(key=lambda r: r["mono"])
        cur: Interval | None = None
        until = 0.0  # the newest record's until (cur.end: the latest end before it)
        for r in recs:
            if cur is not None:
                cur.end = max(cur.end, min(until, r["mono"]))
                if r["term"] is None or r["term"] != cur.term:
                    out.append(cur)
                    cur = None
            if r["term"] is None:
                continue
            if cur is None:
                cur = Interval(ns, cand, r["term"], r["mono"], r["mono"], r["pid"])
            until = r["until"]
        if cur is not None:
            cur.end = max(cur.end, until)
            out.append(cur)
    out.sort(key=lambda i: (i.ns, i.start))
    return out


@dataclass
class Report:
    """What the checker found: violations (must be empty) and what it measured."""

    violations: list[str] = field(default_factory=list)
    clock_error: float = 0.0
    overlap_seconds: float = 0.0
    #: Overlaps no longer than the clock error: allowed, but counted (0 in a clean run).
    tolerated_overlaps: int = 0
    leaderships: int = 0
    terms: int = 0
    acts: int = 0
    sends: int = 0
    duplicate_ticks: int = 0
    lost_ticks: int = 0
    excused_ticks: int = 0
    #: Judged by executions (``ran`` records): runs executed, and runs sent more than once
    #: (a re-send of the run ledger: one task id, not a duplicate unless it ran twice).
    executed: int = 0
    resent: int = 0
    #: Runs executed again because the worker of the first execution was killed after its
    #: body and before its end was recorded (acks_late: docs/workers.md), not violations.
    rerun_after_death: int = 0
    #: Seconds without a trusted leader, per namespace, each with when it began.
    gaps: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    #: Per fault kind: seconds from the fault's start to the next leader's first trust.
    failover: dict[str, list[float]] = field(default_factory=dict)
    faults: dict[str, int] = field(default_factory=dict)
    #: Per fault kind: overlap seconds and duplicate/lost/excused ticks in its windows.
    per_fault: dict[str, dict[str, float]] = field(default_factory=dict)
    #: Faults a driver failed to inject (about the harness, not the system under test).
    harness_errors: list[str] = field(default_factory=list)
    #: (mono, what, amount) of each overlap, duplicate, lost or excused tick.
    events: list[tuple[float, str, float]] = field(default_factory=list, repr=False)

    @property
    def ok(self) -> bool:
        return not self.violations

    def summary(self) -> dict[str, Any]:
        def stats(xs: list[float]) -> dict[str, float]:
            if not xs:
                return {}
            xs = sorted(xs)
            return {
                "n": len(xs),
                "p50": statistics.median(xs),
                "max": xs[-1],
            }

        return {
            "ok": self.ok,
            "violations": self.violations[:50],
            "violation_count": len(self.violations),
            "clock_error_s": self.clock_error,
            "overlap_s": self.overlap_seconds,
            "tolerated_overlaps": self.tolerated_overlaps,
            "leaderships": self.leaderships,
            "terms": self.terms,
            "acts": self.acts,
            "sends": self.sends,
            "duplicate_ticks": self.duplicate_ticks,
            "lost_ticks": self.lost_ticks,
            "excused_ticks": self.excused_ticks,
            "executed": self.executed,
            "resent": self.resent,
            "rerun_after_death": self.rerun_after_death,
            "faults": self.faults,
            "failover_s": {k: stats(v) for k, v in sorted(self.failover.items())},
            "per_fault": self.per_fault,
            "harness_errors": self.harness_errors,
            "gaps_s": {ns: stats([g for g, _ in v]) for ns, v in sorted(self.gaps.items())},
        }


def _covering(ivs: list[Interval], t: float) -> Iterator[Interval]:
    return (i for i in ivs if i.start <= t <= i.end)


def check(
    records: list[dict[str, Any]],
    *,
    tick_every: dict[str, float] | None = None,
    tick_settle: float = 2.0,
    clock_error: float | None = None,
    executions: bool = False,
) -> Report:
    """Judge a history against the invariants in docs/design.md.

    Violations: two candidates trusted at once (beyond the measured clock error); a term
    that goes down, or one term held by two candidates; an act or a send outside a trust
    window of its own term, or inside another term's; a beat run sent twice (two sends
    with one key); a run never sent although one leader was trusted from its due time
    (the previous run's time + its period) until ``tick_settle`` seconds after it
    (``tick_every`` maps an entry to its period in seconds).

    ``executions``: judge the beat's runs by what the workers ran (``ran`` records, one
    per execution, with the run's key) instead: a run executed twice is a duplicate, one
    sent and never executed is lost, and so is every due time skipped between two runs,
    whoever led then (no failover is excused: the entries catch up every missed due time).
    A run sent twice and executed once is a re-send, counted, not a violation.
    """
    rep = Report()
    errs = [r["seconds"] for r in records if r["k"] == "clock_error"]
    rep.clock_error = clock_error if clock_error is not None else max(errs, default=0.0)
    eps = rep.clock_error
    ivs = intervals(records)
    rep.leaderships = len(ivs)
    by_ns: dict[str, list[Interval]] = defaultdict(list)
    for iv in ivs:
        by_ns[iv.ns].append(iv)

    for ns, group in by_ns.items():
        group.sort(key=lambda i: i.start)
        holders: dict[int, str] = {}
        for iv in group:
            if holders.setdefault(iv.term, iv.cand) != iv.cand:
                rep.violations.append(
                    f"{ns}: term {iv.term} held by {holders[iv.term]} and by {iv.cand}"
                )
        rep.terms += len(holders)
        highest: Interval | None = None
        for iv in group:
            if highest is not None and iv.term < highest.term:
                rep.violations.append(
                    f"{ns}: term went down from {highest.term} ({highest.cand}) to "
                    f"{iv.term} ({iv.cand}) at mono {iv.start:.6f}"
                )
            if highest is None or iv.term > highest.term:
                highest = iv
        # Overlap between different terms: intervals sorted by start, so only the ones
        # still open can overlap the next.
        open_: list[Interval] = []
        reach = None
        gaps: list[tuple[float, float]] = []
        for iv in group:
            if reach is not None and iv.start > reach:
                gaps.append((iv.start - reach, reach))
            reach = iv.end if reach is None else max(reach, iv.end)
            open_ = [o for o in open_ if o.end > iv.start]
            for o in open_:
                if o.term == iv.term:
                    continue
                overlap = min(o.end, iv.end) - iv.start
                rep.overlap_seconds += max(0.0, overlap)
                if overlap > 0:
                    rep.events.append((iv.start, "overlap_s", overlap))
                if 0 < overlap <= eps:
                    rep.tolerated_overlaps += 1
                if overlap > eps:
                    rep.violations.append(
                        f"{ns}: split brain for {overlap:.6f}s at mono {iv.start:.6f}: "
                        f"term {o.term} ({o.cand}) and term {iv.term} ({iv.cand})"
                    )
            open_.append(iv)
        rep.gaps[ns] = gaps

    sent: dict[tuple[str, str, int], list[float]] = defaultdict(list)
    times: dict[tuple[str, str], list[int]] = defaultdict(list)
    index = {ns: _Index(group) for ns, group in by_ns.items()}
    empty = _Index([])
    for r in records:
        if r["k"] not in ("act", "send"):
            continue
        near = index.get(r["ns"], empty).around(r["mono"], slack=1.0)
        t = r["mono"]
        # The reading precedes the check, so it may precede the trust record a little (a
        # thread descheduled in between); it may never pass the window's end.
        own = [i for i in near if i.term == r["term"] and i.start - 1.0 <= t <= i.end + eps]
        if not own:
            rep.violations.append(
                f"{r['ns']}: {r.get('what', r['k'])} by pid {r['pid']} under term {r['term']} "
                f"at mono {t:.6f}, outside every trust window of that term"
            )
        for other in _covering(near, t):
            if other.term != r["term"] and other.start + eps < t < other.end - eps:
                rep.violations.append(
                    f"{r['ns']}: {r.get('what', r['k'])} by pid {r['pid']} under term "
                    f"{r['term']} at mono {t:.6f}, while term {other.term} ({other.cand}) led"
                )
        if r["k"] == "act":
            rep.acts += 1
        else:
            rep.sends += 1
            sent[run_key(r)].append(t)
            times[(r["ns"], r["entry"])].append(r["at"])
    if executions:
        _check_executions(rep, records, sent, times, tick_every or {}, tick_settle)
    else:
        for (ns, entry, run), monos in sent.items():
            if len(monos) > 1:
                rep.duplicate_ticks += len(monos) - 1
                rep.events += [(t, "duplicate_ticks", 1) for t in monos[1:]]
                rep.violations.append(f"{ns}: run {entry} after {run} sent {len(monos)} times")
        if tick_every:
            _check_lost(rep, records, times, by_ns, tick_every, tick_settle)
    _attribute_failovers(rep, records, by_ns)
    return rep


class _Index:
    """Intervals of one namespace by start, to find those around an instant quickly."""

    def __init__(self, group: list[Interval]) -> None:
        self.group = sorted(group, key=lambda i: i.start)
        self.starts = [i.start for i in self.group]
        self.longest = max((i.end - i.start for i in self.group), default=0.0)

    def around(self, t: float, slack: float) -> list[Interval]:
        hi = bisect.bisect_right(self.starts, t + slack)
        lo = bisect.bisect_left(self.starts, t - self.longest - slack)
        return self.group[lo:hi]


def _check_lost(
    rep: Report,
    records: list[dict[str, Any]],
    times: dict[tuple[str, str], list[int]],
    by_ns: dict[str, list[Interval]],
    tick_every: dict[str, float],
    settle: float,
) -> None:
    """A run never sent is lost unless leadership changed around its due time.

    Beat counts each run from the previous one (stock Celery's rule), so a run is missing
    where two consecutive sends of an entry lie more than a period apart (plus
    ``settle``); the runs in between fell due at the earlier run's time + k periods.
    """
    # Run times are on the database's clock; map them onto the boot-time clock with the
    # offset a driver with a true wall clock saw (else the senders', median).
    offsets = [r["wall"] - r["mono"] for r in records if r.get("role") == "driver"]
    offsets = offsets or [r["wall"] - r["mono"] for r in records if r["k"] == "send"]
    if not offsets:
        return
    offset = statistics.median(offsets)
    for (ns, entry), ats in times.items():
        every = tick_every.get(entry)
        if not every:
            continue
        step = round(every * 1_000_000)
        slack = round(settle * 1_000_000)
        group = by_ns.get(ns, [])
        ats = sorted(ats)
        for before, after in itertools.pairwise(ats):
            due = before + step
            while due + slack < after:
                at = due / 1_000_000 - offset
                if any(i.start <= at and i.end >= at + settle for i in group):
                    rep.lost_ticks += 1
                    rep.events.append((at, "lost_ticks", 1))
                    rep.violations.append(
                        f"{ns}: run {entry} due {due} never sent, though one leader was "
                        f"trusted from its due time for {settle}s"
                    )
                else:
                    rep.excused_ticks += 1
                    rep.events.append((at, "excused_ticks", 1))
                due += step


def _check_executions(
    rep: Report,
    records: list[dict[str, Any]],
    sent: dict[tuple[str, str, int], list[float]],
    times: dict[tuple[str, str], list[int]],
    tick_every: dict[str, float],
    settle: float,
) -> None:
    """Each run executed exactly once, and no due time without a run (see :func:`check`).

    A run sent in the last ``settle`` seconds of the history may still be on its way: not
    counted lost. Due times: consecutive runs of an entry stand ``period`` apart when one
    was caught up, and less than two periods when sent on time (Celery stores the send's
    time); two periods or more apart, the due times between them had no run.
    """
    ran: dict[tuple[str, str, int], list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        if r["k"] == "ran":
            ran[run_key(r)].append(r)
    killed = [r for r in records if r["k"] == "fault" and r.get("phase", "start") == "start"
              and r["kind"] in _KILLS]  # fmt: skip
    end = max((r["mono"] for r in records), default=0.0)
    for key, monos in sent.items():
        ns, entry, run = key
        rep.resent += len(monos) - 1
        done = sorted(ran.get(key, []), key=lambda r: r["mono"])
        rep.executed += min(len(done), 1)
        again = [r for r in done[1:] if not _died_after(done[0], killed)]
        rep.rerun_after_death += len(done[1:]) - len(again)
        if again:
            rep.duplicate_ticks += len(again)
            rep.events += [(r["mono"], "duplicate_ticks", 1) for r in again]
            rep.violations.append(f"{ns}: run {entry} after {run} executed {len(done)} times")
        elif not done and min(monos) < end - settle:
            rep.lost_ticks += 1
            rep.events.append((min(monos), "lost_ticks", 1))
            rep.violations.append(f"{ns}: run {entry} after {run} was sent, never executed")
    for key in ran:
        if key not in sent:
            rep.violations.append(f"{key[0]}: run {key[1]} after {key[2]} ran, never sent")
    offsets = [r["wall"] - r["mono"] for r in records if r.get("role") == "driver"]
    offset = statistics.median(offsets) if offsets else 0.0
    for (ns, entry), ats in times.items():
        every = tick_every.get(entry)
        if not every:
            continue
        step = round(every * 1_000_000)
        for before, after in itertools.pairwise(sorted(set(ats))):
            for due in range(before + step, after - step + 1, step):  # skipped due times
                rep.lost_ticks += 1
                rep.events.append((due / 1_000_000 - offset, "lost_ticks", 1))
                rep.violations.append(f"{ns}: run {entry} due {due} never sent")


#: Faults that end a process at once (``skew`` kills it and starts it with a wrong clock).
_KILLS = ("kill", "skew")


def _died_after(
    execution: dict[str, Any], killed: list[dict[str, Any]], within: float = 2.0
) -> bool:
    """Whether the worker of ``execution`` (its ``ppid``) was killed right after it ran.

    Its end may not have been recorded: under ``acks_late`` the run comes back and runs
    again, as documented (docs/workers.md), not a duplicate of a finished run.
    """
    ppid, t = execution.get("ppid"), execution["mono"]
    return ppid is not None and any(
        f.get("target_pid") == ppid and t <= f["mono"] <= t + within for f in killed
    )


def _attribute_failovers(
    rep: Report, records: list[dict[str, Any]], by_ns: dict[str, list[Interval]]
) -> None:
    """For each fault that hit a leader: seconds until another term was trusted."""
    faults = [r for r in records if r["k"] == "fault" and r.get("phase", "start") == "start"]
    # Each fault owns the time from its start to the next fault's: what happened then
    # (an overlap, a duplicate, a lost or excused tick) is counted against its kind.
    starts = [f["mono"] for f in faults]
    for t, what, amount in rep.events:
        n = bisect.bisect_right(starts, t) - 1
        kind = faults[n]["kind"] if n >= 0 else "none"
        bucket = rep.per_fault.setdefault(kind, {})
        bucket[what] = bucket.get(what, 0) + amount
    for n, r in enumerate(faults):
        kind = r["kind"]
        rep.faults[kind] = rep.faults.get(kind, 0) + 1
        ns, t = r.get("ns") or "", r["mono"]
        group = by_ns.get(ns, [])
        hit = [i for i in group if i.start <= t <= i.end and i.pid == r.get("target_pid")]
        if not hit:
            continue
        # The first leadership that began after the fault and before the next fault (one
        # fault at a time; a restart or an unreachable database reaches every namespace).
        bound = faults[n + 1]["mono"] if n + 1 < len(faults) else float("inf")
        after = [i for i in group if t < i.start < bound]
        if after:
            first = min(after, key=lambda i: i.start)
            if first.term != hit[0].term:
                rep.failover.setdefault(kind, []).append(first.start - t)
