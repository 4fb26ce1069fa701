"""Long randomized fault runs: ``python benchmarks/chaos.py --minutes 30 --backend pg-notify``.

Starts electors, ``celery worker --election`` processes and LeaderScheduler beats (all but
the memory backend), applies seeded random faults one after another for the given time,
then checks the combined history (harness.checker) and writes a report:
``benchmarks/results/chaos-<backend>.json`` and a markdown table beside it. Exit status 1
if any invariant was violated. The driver is harness/chaos/driver.py; the faults are in
harness/chaos/faults.py. ``restart`` restarts the loopback database server: do not run this
next to other work that needs the same server.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import _root
from _machine import machine_info

from harness.chaos.driver import BACKENDS, FAULTS, Settings, judge, make

ROOT = _root.ROOT


def table(summary: dict[str, Any]) -> str:
    """The report as markdown: one row per fault kind, findings counted in its windows."""
    failover, per_fault = summary["failover_s"], summary["per_fault"]
    rows = [
        "| fault | injected | overlap s | duplicate ticks | lost ticks | ticks missed in "
        "failover | failover after it hit the leader: n / p50 / max (s) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for kind, count in sorted(summary["faults"].items()):
        f, found = failover.get(kind) or {}, per_fault.get(kind) or {}
        seen = f"{f['n']} / {f['p50']:.3f} / {f['max']:.3f}" if f else "-"
        rows.append(
            f"| {kind} | {count} | {found.get('overlap_s', 0):.3f} | "
            f"{found.get('duplicate_ticks', 0):.0f} | {found.get('lost_ticks', 0):.0f} | "
            f"{found.get('excused_ticks', 0):.0f} | {seen} |"
        )
    return "\n".join(rows)


def write(result: dict[str, Any], out: Path) -> str:
    """Write the JSON and the markdown report; return the markdown."""
    summary = result["report"]
    out.write_text(json.dumps(result, indent=1) + "\n")
    md = (
        f"# chaos {result['backend']}: {result['minutes']} min, seed {result['seed']}, "
        f"ttl {result['ttl']}s, {result['started'][:10]}\n\n"
        f"Processes: {result['processes']}. "
        f"Faults drawn from: {', '.join(result['fault_kinds'])}.\n\n"
        f"violations: {summary['violation_count']}; overlap {summary['overlap_s']:.6f}s "
        f"(clock error allowed {summary['clock_error_s'] * 1000:.3f} ms, "
        f"overlaps within it: {summary['tolerated_overlaps']}); "
        f"runs executed {summary.get('executed', 0)} (sent again: {summary.get('resent', 0)}; "
        f"run again after their worker was killed before their end was recorded: "
        f"{summary.get('rerun_after_death', 0)}); "
        f"duplicate ticks {summary['duplicate_ticks']}; lost ticks {summary['lost_ticks']} "
        f"(missed in failover windows: {summary['excused_ticks']}); "
        f"leaderships {summary['leaderships']}, acts {summary['acts']}, "
        f"beat sends {summary['sends']}\n\n{table(summary)}\n"
    )
    for v in summary["violations"]:
        md += f"\n- VIOLATION: {v}"
    for e in summary.get("harness_errors", []):
        md += f"\n- harness error (a fault not injected): {e}"
    out.with_suffix(".md").write_text(md + "\n")
    return md


def matrix(results: list[dict[str, Any]]) -> str:
    """Fault x backend from several reports: injected, overlap s / duplicate / lost ticks,
    and the failover seen (p50 and max seconds, when the fault hit the leader)."""
    kinds = sorted({k for r in results for k in r["report"]["faults"]})
    head = "| fault | " + " | ".join(r["backend"] for r in results) + " |"
    rows = [head, "| --- |" + " --- |" * len(results)]
    for kind in kinds:
        cells = []
        for r in results:
            rep = r["report"]
            n = rep["faults"].get(kind)
            if not n:
                cells.append("n/a")
                continue
            found = rep["per_fault"].get(kind, {})
            f = rep["failover_s"].get(kind) or {}
            seen = f"{f['p50']:.2f} s (max {f['max']:.2f})" if f else "no failover"
            cells.append(
                f"{n}x: {found.get('overlap_s', 0):.3f} / {found.get('duplicate_ticks', 0):.0f}"
                f" / {found.get('lost_ticks', 0):.0f}; {seen}"
            )
        rows.append(f"| {kind} | " + " | ".join(cells) + " |")
    total = ["**all**"]
    for r in results:
        rep = r["report"]
        ran = (
            f"{rep['executed']} runs executed once ({rep['resent']} sent twice, "
            f"{rep.get('rerun_after_death', 0)} run again after a kill); "
            if rep.get("executed")
            else ""
        )
        total.append(
            f"{sum(rep['faults'].values())}x: {rep['overlap_s']:.3f} / "
            f"{rep['duplicate_ticks']} / {rep['lost_ticks']}; {ran}"
            f"{rep['violation_count']} violations, {r['minutes']:g} min"
        )
    rows.append("| " + " | ".join(total) + " |")
    return "\n".join(rows)


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", choices=BACKENDS, default="memory")
    p.add_argument("--minutes", type=float, default=5.0)
    p.add_argument("--seed", type=int, default=None, help="default: the time")
    p.add_argument("--ttl", type=float, default=2.0)
    p.add_argument("--electors", type=int, default=3)
    p.add_argument("--workers", type=int, default=2, help="celery workers (not memory)")
    p.add_argument("--beats", type=int, default=2, help="celery beats (not memory)")
    p.add_argument("--faults", default=None, help="comma-separated subset of the defaults")
    p.add_argument("--out", default=None, help="report path (default benchmarks/results/)")
    p.add_argument("--workdir", default=None, help="keep logs and history here")
    p.add_argument(
        "--rejudge",
        default=None,
        metavar="REPORT.json",
        help="check --workdir's history again and rewrite this report",
    )
    p.add_argument(
        "--matrix",
        nargs="+",
        default=None,
        metavar="REPORT.json",
        help="print the fault x backend table of these reports",
    )
    args = p.parse_args()
    if args.matrix:
        print(matrix([json.loads(Path(f).read_text()) for f in args.matrix]))
        return 0
    if args.rejudge:
        result = json.loads(Path(args.rejudge).read_text())
        history = Path(args.workdir) / "history.jsonl"
        workers = result["processes"]["workers"] > 0
        report = judge(history, settle=2 * result["ttl"] + 1, executions=workers)
        result["report"] = report.summary()
        print(write(result, Path(args.rejudge)))
        return 0 if report.ok else 1

    seed = args.seed if args.seed is not None else int(time.time())
    memory = args.backend == "memory"
    settings = Settings(
        backend=args.backend,
        seed=seed,
        ttl=args.ttl,
        electors=args.electors,
        workers=0 if memory else args.workers,
        beats=0 if memory else args.beats,
        faults=tuple(args.faults.split(",")) if args.faults else None,
        pg_url=os.environ.get("CELERY_ELECTION_TEST_PG_URL", Settings.pg_url),
        mysql_url=os.environ.get("CELERY_ELECTION_TEST_MYSQL_URL", Settings.mysql_url),
        amqp_url=os.environ.get("CELERY_ELECTION_TEST_AMQP_URL", Settings.amqp_url),
    )
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix=f"chaos-{args.backend}-"))
    started = datetime.now(timezone.utc)
    print(f"chaos: {args.backend}, seed {seed}, {args.minutes} min, logs in {workdir}", flush=True)
    run = make(settings, workdir)
    # SIGTERM ends the run like Ctrl-C: processes stopped, tables and queues dropped.
    signal.signal(signal.SIGTERM, _interrupt)
    report = run.run(args.minutes * 60, progress=lambda line: print(line, flush=True))
    summary = report.summary()
    result = {
        "backend": args.backend,
        "seed": seed,
        "minutes": args.minutes,
        "ttl": args.ttl,
        "processes": {"electors": args.electors, "workers": settings.workers,
                      "beats": settings.beats},
        "fault_kinds": list(settings.faults or FAULTS[args.backend]),
        "started": started.isoformat(timespec="seconds"),
        "machine": machine_info(),
        "report": summary,
        "steps": run.log,
    }  # fmt: skip
    out = Path(args.out or ROOT / "benchmarks" / "results" / f"chaos-{args.backend}.json")
    print(write(result, out))
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
