"""What the tracing hooks cost the beat's send path: instructions per send, by set-up.

    .venv/bin/python benchmarks/trace_overhead.py            # about 6 minutes here
    .venv/bin/python benchmarks/trace_overhead.py --n 1000   # quicker

The send path is the beat's ``Sender`` (celery_election/beat/sender.py), driven as the
scheduler drives it for a claimed run: the claim's value (``fence.claim_of``), the fence at
the send (``Sender.prepare``: the headers, the task id, the span), Celery's own publish
(``celery.beat.Scheduler.apply_async`` on the memory broker, as a beat that knows the
task sends it) and what a sent run leaves (``Sender.sent``: counted, the ledger, the
span's end). The fence and the election are stand-ins that always lead (no database):
what is counted is this process's own work per send.

Each set-up runs in a valgrind child (``--tool=callgrind``, collection on only inside
``sys.call_tracing``, as send_overhead.py counts), ``--n`` sends after ``--warmup``:

* **base**: the code before tracing (``--base`` commit, exported to a temporary folder);
* **absent**: this code, OpenTelemetry not importable (its import blocked in the child);
* **api**: this code, ``opentelemetry-api`` installed, no SDK configured (the otel
  extra in an application that traces nothing);
* **sdk**: an SDK ``TracerProvider`` with no exporter: spans recorded and dropped (what
  recording itself costs; an exporter's cost is the user's).

Reported: Ir per send and the ratio of each to **absent** and to **base**. Results in
``results/trace_overhead.json`` and ``.txt``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _root

# (send_overhead and _machine import celery_election: only the parent imports them, so a
# child decides itself whether OpenTelemetry can be imported before anything imports it)

RESULTS = Path(__file__).resolve().parent / "results"
MODES = ("base", "absent", "api", "sdk")


class _Blocker:
    """A meta path finder that makes ``import opentelemetry`` fail (the extra not installed)."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name.split(".")[0] == "opentelemetry":
            raise ImportError(f"blocked: {name}")


def child(mode: str, code: str, n: int, warmup: int) -> None:
    """Under valgrind: ``warmup`` uncounted sends, then ``n`` counted in one call."""
    sys.path.insert(0, code)
    if mode in ("absent", "base"):
        sys.meta_path.insert(0, _Blocker())  # type: ignore[arg-type]
    if mode == "sdk":
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider

        trace.set_tracer_provider(TracerProvider())
    from celery import Celery
    from celery.beat import Scheduler

    from celery_election.backends.base import RunClaim, RunRequest, RunState
    from celery_election.beat.election import BeatTerm
    from celery_election.beat.fence import claim_of
    from celery_election.beat.policy import RunPolicy
    from celery_election.beat.sender import Sender

    assert ("opentelemetry" in sys.modules) == (mode in ("api", "sdk")), mode
    app = Celery("trace-bench", broker="memory://", set_as_current=False)
    app.conf.task_ignore_result = True

    @app.task(name="bench.tick", shared=False)
    def tick() -> None:
        pass

    lead = BeatTerm(7, "token")

    class Fence:  # leads, always: the database's part is not what is counted
        namespace = "bench"
        election = recorder = None

        def may_send(self, claim: Any) -> BeatTerm:
            return lead

        def from_db(self, us: int, like: Any) -> datetime.datetime:
            return datetime.datetime.fromtimestamp(us / 1e6, datetime.timezone.utc)

    fence = Fence()
    fence.election = fence  # sent() asks the election for its recorder (None)
    beat = Scheduler(app, lazy=True)

    def publish(entry: Any, producer: Any, **kw: Any) -> Any:  # as LeaderScheduler's
        return beat.apply_async(entry, producer, advance=False, **kw)

    sender = Sender(fence, RunPolicy(), lambda: lead, publish)  # type: ignore[arg-type]
    entry = beat.Entry("tick", "bench.tick", schedule=1.0, app=app)
    entry.last_run_at = app.now()
    at = [int(time.time() * 1e6)]

    def sends(count: int) -> None:
        for _ in range(count):
            at[0] += 1_000_000
            expected = RunState(at[0] - 1_000_000, 1, 7)
            request = RunRequest("tick", expected, at[0], 2, "", pending=True)
            claim = claim_of(lead, request, RunClaim(True, None, True))
            send = sender.prepare(entry, claim)
            assert send is not None
            sender.publish(entry, send, producer)

    with app.producer_or_acquire() as producer:
        sends(warmup)
        producer.channel.queue_purge("celery")
        sender.ledger._unmarked.clear()
        for _ in range(2):  # two counted halves (two dumps): the drift within a process
            sys.call_tracing(sends, (n // 2,))
    print(json.dumps({"mode": mode, "otel": "opentelemetry" in sys.modules}))


def measure(mode: str, code: str, n: int, warmup: int) -> dict[str, Any]:
    from send_overhead import total_ir

    with tempfile.TemporaryDirectory(prefix="trace-cg-") as tmp:
        out = Path(tmp) / "callgrind.out"
        cmd = ["valgrind", "--tool=callgrind", "--collect-atstart=no",
               "--toggle-collect=sys_call_tracing", "--dump-after=sys_call_tracing",
               f"--callgrind-out-file={out}", sys.executable, str(Path(__file__).resolve()),
               "--child", mode, "--code", code, "--n", str(n), "--warmup", str(warmup)]  # fmt: skip
        start = time.monotonic()
        proc = subprocess.run(cmd, capture_output=True, text=True,
                              env={**os.environ, "PYTHONHASHSEED": "0"})  # fmt: skip
        if proc.returncode != 0:
            sys.stderr.write(proc.stderr[-4000:])
            raise SystemExit(f"the callgrind child failed ({proc.returncode}) for {mode}")
        halves = [total_ir(out.with_name(f"{out.name}.{i}")) / (n // 2) for i in (1, 2)]
    return {"ir_per_send": sum(halves) / 2, "halves": halves,
            "wall_s": round(time.monotonic() - start, 1)}  # fmt: skip


def table(report: dict[str, Any]) -> str:
    runs = report["runs"]
    mean = {m: sum(r[m]["ir_per_send"] for r in runs) / len(runs) for m in MODES}
    lines = [
        f"trace_overhead.py, {report['date']}, commit {report['commit']} (base: "
        f"{report['base']}), N={report['n']} counted sends (two halves) after "
        f"{report['warmup']}, memory broker, PYTHONHASHSEED=0, {len(runs)} runs (a valgrind "
        "child per set-up and run; the order reversed every other run)",
        "",
        "| set-up | Ir per send, each run | mean | absent / set-up | base / set-up "
        "| runs differ by | halves differ by (max) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for mode in MODES:
        each = [r[mode]["ir_per_send"] for r in runs]
        halves = max(abs(a - b) / min(a, b) for a, b in (r[mode]["halves"] for r in runs))
        lines.append(
            f"| {mode} | {' / '.join(f'{x:,.0f}' for x in each)} | {mean[mode]:,.0f} "
            f"| {mean['absent'] / mean[mode]:.4f} | {mean['base'] / mean[mode]:.4f} "
            f"| {100 * (max(each) - min(each)) / min(each):.2f} % | {100 * halves:.2f} % |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=2000)
    p.add_argument("--warmup", type=int, default=300)
    p.add_argument("--runs", type=int, default=2, help="whole runs of the four set-ups")
    p.add_argument(
        "--base",
        help="the code before tracing (default: the parent of the "
        "commit that added celery_election/core/tracing.py)",
    )
    p.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    p.add_argument("--code", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args.child, args.code, args.n, args.warmup)
        return
    from _machine import machine_info
    from send_overhead import git_commit

    def git(*a: str) -> str:
        return subprocess.run(["git", *a], cwd=_root.ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()  # fmt: skip

    added = git("log", "--diff-filter=A", "--format=%h", "--", "celery_election/core/tracing.py")
    base = git("rev-parse", "--short", args.base or f"{added.splitlines()[-1]}~1")
    report: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": git_commit(), "base": base, "n": args.n, "warmup": args.warmup,
        "machine": machine_info(), "runs": [],
    }  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="trace-base-") as old:
        archive = subprocess.run(["git", "archive", base, "celery_election"], cwd=_root.ROOT,
                                 capture_output=True, check=True).stdout  # fmt: skip
        subprocess.run(["tar", "-x", "-C", old], input=archive, check=True)
        for run in range(args.runs):
            modes: dict[str, Any] = {}
            for mode in MODES if run % 2 == 0 else MODES[::-1]:
                print(f"run {run + 1}: {mode} under callgrind ...", file=sys.stderr, flush=True)
                code = old if mode == "base" else str(_root.ROOT)
                modes[mode] = measure(mode, code, args.n, args.warmup)
            report["runs"].append(modes)
    text = table(report)
    print(text, end="")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "trace_overhead.json").write_text(json.dumps(report, indent=2) + "\n")
    (RESULTS / "trace_overhead.txt").write_text(text)


if __name__ == "__main__":
    main()
