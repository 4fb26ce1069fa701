"""What sending a ``@leader_task`` costs beside a plain task: publishing included.

    .venv/bin/python benchmarks/send_overhead.py                  # memory broker and RabbitMQ
    .venv/bin/python benchmarks/send_overhead.py --n 2000 --repeat 9

``task_overhead.py`` times the worker side and leaves publishing out; this is the sender's
side. In one process, one app with ``init_app`` (so its ``LeaderRouter`` is in
``task_routes``, as in every real app), a plain task and a ``@leader_task``: each
repetition sends ``--n`` messages of each kind by ``apply_async`` and ``--n`` by
``send_task`` (by name), in alternating chunks of 100 (P L L P ...), so load from other
processes falls on both kinds alike. Reported per broker and way of sending: sends/s of
each kind (p50 over repetitions) and the ratio leader / plain. Target: >= 0.98. The memory
broker shows the library's own cost; RabbitMQ, what a user sees.

    .venv/bin/python benchmarks/send_overhead.py --callgrind --runs 2   # instructions per send

``--callgrind`` counts instructions instead of timing, which repeats whatever else the
machine does. Per broker, one child process runs under ``valgrind --tool=callgrind
--collect-atstart=no --toggle-collect=sys_call_tracing --dump-after=sys_call_tracing``:
it warms each way and kind up (``--warmup`` sends), then calls ``counted_sends`` four
times, n/2 sends each, in the order plain, leader, leader, plain, through
``sys.call_tracing``. Callgrind sees C functions, not Python ones, and ``sys.call_tracing``
(C: ``sys_call_tracing``) is called nowhere else, so collection is on exactly while
``counted_sends`` runs and each call is dumped to a part file of its own. Before each
call, uncounted: the queues are purged and ``gc.collect()`` runs. Reported: instructions
(Ir) per send of each kind, plain / leader (the counterpart of leader / plain throughput:
>= 0.98 means a leader send costs at most about 2 % more), the difference, how far the two
halves of each kind are apart; the C functions whose self cost differs most per send, and
the Python functions a leader send calls a different number of times than a plain send
(counted with ``sys.setprofile``, outside valgrind). Results:
``results/send_overhead_callgrind.json`` and ``.txt``. Run time on the loaded 2-core
machine: 3 to 4.5 min per broker at ``--n 2000`` (about 1 min of it to start Python and
Celery under valgrind), 7.5 to 8 min a run.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import datetime
import gc
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _root  # puts the repository on sys.path
from _machine import machine_info
from celery import Celery
from kombu import Connection

from celery_election import init_app, leader_task

CHUNK = 100


def make_app(broker: str) -> tuple[Celery, Any, Any]:
    app = Celery(f"send{uuid.uuid4().hex[:6]}", broker=broker, set_as_current=False)
    app.conf.update(task_ignore_result=True, election_namespace=f"send{uuid.uuid4().hex[:6]}")
    init_app(app)

    @app.task(name="bench.plain", shared=False)
    def plain() -> None:
        pass

    @leader_task(app=app, name="bench.leader", shared=False)
    def leader() -> None:
        pass

    return app, plain, leader


def make_ways(
    app: Celery, plain: Any, leader: Any, producer: Any
) -> dict[str, tuple[Callable[[], Any], Callable[[], Any]]]:
    """way of sending -> (send one plain task, send one leader task)."""
    return {
        "apply_async": (
            lambda: plain.apply_async(producer=producer),
            lambda: leader.apply_async(producer=producer),
        ),
        "send_task": (
            lambda: app.send_task("bench.plain", producer=producer),
            lambda: app.send_task("bench.leader", producer=producer),
        ),
    }


def cleanup(app: Celery) -> None:
    with app.connection_for_write() as conn:  # leave nothing behind on a real broker
        for queue in ("celery", f"election-leader.{app.conf.election_namespace}"):
            with contextlib.suppress(Exception):
                conn.default_channel.queue_delete(queue)
    app.close()


def rate(send: Callable[[], Any], n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        send()
    return n / (time.perf_counter() - start)


def measure(broker: str, n: int, repeat: int) -> dict[str, tuple[float, float, float]]:
    """way -> (plain sends/s p50, leader sends/s p50, ratio p50)."""
    app, plain, leader = make_app(broker)
    results: dict[str, tuple[float, float, float]] = {}
    with app.producer_or_acquire() as producer:
        ways = make_ways(app, plain, leader, producer)
        for way, (send_plain, send_leader) in ways.items():
            rate(send_plain, CHUNK)  # warm-up: connections, routes, the queue declared
            rate(send_leader, CHUNK)
            plains, leaders, ratios = [], [], []
            for _ in range(repeat):
                p_time = l_time = 0.0
                for i in range(n // CHUNK):
                    order = (send_plain, send_leader) if i % 2 == 0 else (send_leader, send_plain)
                    for send in order:
                        t = CHUNK / rate(send, CHUNK)
                        if send is send_plain:
                            p_time += t
                        else:
                            l_time += t
                plains.append(n / p_time)
                leaders.append(n / l_time)
                ratios.append(p_time / l_time)
            results[way] = (
                statistics.median(plains),
                statistics.median(leaders),
                statistics.median(ratios),
            )
    cleanup(app)
    return results


# --- --callgrind: instructions per send -------------------------------------------------

RESULTS = Path(__file__).resolve().parent / "results"
KINDS = ("plain", "leader")
ANNOTATE_LINE = re.compile(r"^\s*([\d,]+)\s+\([^)]*\)\s+(.*?)\s*$")


def counted_sends(send: Callable[[], Any], n: int) -> None:
    """The counted region: the child calls it through ``sys.call_tracing``."""
    for _ in range(n):
        send()


def callgrind_child(broker: str, n: int, warmup: int) -> None:
    """Under valgrind: per way, four counted (dumped) calls of n/2 sends, P L L P.

    Before each, uncounted: the queues are purged (the memory broker keeps every message in
    this process, and a growing heap makes the garbage collector's full passes dearer) and
    ``gc.collect()`` runs, so that each counted call starts from the same state; the order
    P L L P cancels what drift is left. Prints the order of the parts.
    """
    app, plain, leader = make_app(broker)
    queues = ("celery", f"election-leader.{app.conf.election_namespace}")
    order = []
    with app.producer_or_acquire() as producer:
        for way, sends in make_ways(app, plain, leader, producer).items():
            for send in sends:  # warm-up: connection, routes, queues, the adaptive interpreter
                counted_sends(send, warmup)
            for half, kind in enumerate(("plain", "leader", "leader", "plain")):
                for queue in queues:
                    with contextlib.suppress(Exception):
                        producer.channel.queue_purge(queue)
                gc.collect()
                send = sends[KINDS.index(kind)]
                sys.call_tracing(counted_sends, (send, n // 2))
                order.append([way, kind, half // 2])
    cleanup(app)
    print(json.dumps(order))


def reachable(url: str) -> bool:
    try:
        with Connection(url, connect_timeout=3) as conn:
            conn.ensure_connection(max_retries=1)
        return True
    except Exception:
        return False


def self_costs(part: Path, total: int) -> dict[str, int]:
    """C function -> exclusive Ir in one callgrind part file (``callgrind_annotate``).

    Left out: the frames that were on the stack when collection was switched on (main,
    ``PyEval_EvalCode`` ...), which callgrind_annotate lists with the part's whole cost.
    """
    out = subprocess.run(
        ["callgrind_annotate", "--inclusive=no", "--threshold=100", "--auto=no", str(part)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    costs: dict[str, int] = {}
    body = out.split("file:function", 1)[-1].split("\n-----", 1)[-1]
    for line in body.splitlines():
        m = ANNOTATE_LINE.match(line)
        if m and ":" in m.group(2):
            cost = int(m.group(1).replace(",", ""))
            if cost >= total:
                continue
            where, _, func = m.group(2).partition(":")
            func = re.sub(r" \[.*\]$", "", func)
            key = f"{func} ({Path(where).name})"
            costs[key] = costs.get(key, 0) + cost
    return costs


def total_ir(part: Path) -> int:
    for line in part.read_text().splitlines():
        if line.startswith("totals:"):
            return int(line.split()[1])
    raise ValueError(f"no totals line in {part}")


def callgrind_broker(broker: str, n: int, warmup: int, top: int) -> dict[str, Any]:
    """One valgrind child for ``broker``: Ir of each way and kind, and the top C diffs."""
    with tempfile.TemporaryDirectory(prefix="send-cg-") as tmp:
        out = Path(tmp) / "callgrind.out"
        cmd = [
            "valgrind",
            "--tool=callgrind",
            "--collect-atstart=no",
            "--toggle-collect=sys_call_tracing",
            "--dump-after=sys_call_tracing",
            f"--callgrind-out-file={out}",
            sys.executable,
            str(Path(__file__).resolve()),
            "--callgrind-child",
            broker,
            "--n",
            str(n),
            "--warmup",
            str(warmup),
        ]
        env = {**os.environ, "PYTHONHASHSEED": "0"}
        start = time.monotonic()
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        wall = time.monotonic() - start
        if proc.returncode != 0:
            sys.stderr.write(proc.stderr[-4000:])
            raise SystemExit(f"the callgrind child failed ({proc.returncode}) for {broker}")
        order = json.loads(proc.stdout.strip().splitlines()[-1])
        parts = [out.with_name(f"{out.name}.{i}") for i in range(1, len(order) + 1)]
        ir: dict[tuple[str, str], list[int]] = collections.defaultdict(list)
        costs: dict[tuple[str, str], collections.Counter[str]] = collections.defaultdict(
            collections.Counter
        )
        for (way, kind, _half), part in zip(order, parts, strict=True):
            total = total_ir(part)
            ir[way, kind].append(total)
            costs[way, kind].update(self_costs(part, total))
    per_call = (n // 2) * 2
    ways: dict[str, Any] = {}
    for way in dict.fromkeys(w for w, _, _ in order):
        p_ir, l_ir = sum(ir[way, "plain"]), sum(ir[way, "leader"])
        p_cost, l_cost = costs[way, "plain"], costs[way, "leader"]
        diffs = sorted(
            ((f, (l_cost[f] - p_cost[f]) / per_call) for f in {*p_cost, *l_cost}),
            key=lambda kv: -kv[1],
        )
        ways[way] = {
            "plain_ir_halves": ir[way, "plain"],
            "leader_ir_halves": ir[way, "leader"],
            "plain_ir_per_send": p_ir / per_call,
            "leader_ir_per_send": l_ir / per_call,
            "plain_over_leader": p_ir / l_ir,
            "leader_minus_plain_per_send": (l_ir - p_ir) / per_call,
            "c_self_more_per_leader_send": [d for d in diffs[:top] if d[1] > 0],
            "c_self_less_per_leader_send": [d for d in diffs[::-1][:top] if d[1] < 0],
        }
    return {"wall_s": round(wall, 1), "ways": ways}


def python_calls(broker: str, sends: int = 200) -> dict[str, dict[str, list[Any]]]:
    """way -> Python function -> [calls per plain send, per leader send], where they differ.

    Counted with ``sys.setprofile`` in this process (not under valgrind): the functions a
    leader send runs that a plain one does not (or runs a different number of times).
    """
    app, plain, leader = make_app(broker)
    result: dict[str, dict[str, list[Any]]] = {}
    with app.producer_or_acquire() as producer:
        for way, sends_ in make_ways(app, plain, leader, producer).items():
            counts = []
            for send in sends_:
                counted_sends(send, 100)  # warm-up
                calls: collections.Counter[str] = collections.Counter()

                def profile(frame: Any, event: str, arg: Any, calls: Any = calls) -> None:
                    if event == "call":
                        code = frame.f_code
                        mod = frame.f_globals.get("__name__", "?")
                        calls[f"{mod}.{code.co_qualname}"] += 1

                sys.setprofile(profile)
                try:
                    counted_sends(send, sends)
                finally:
                    sys.setprofile(None)
                calls.pop(f"{__name__}.counted_sends", None)
                calls.pop(f"{__name__}.profile", None)
                counts.append(calls)
            p_calls, l_calls = counts
            diff = {
                f: [p_calls[f] / sends, l_calls[f] / sends]
                for f in {*p_calls, *l_calls}
                if p_calls[f] != l_calls[f]
            }
            result[way] = dict(sorted(diff.items(), key=lambda kv: (kv[1][0] - kv[1][1], kv[0])))
    cleanup(app)
    return result


def git_commit() -> str:
    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=_root.ROOT, capture_output=True, text=True
        ).stdout.strip()

    dirty = git("status", "--porcelain", "--untracked-files=no")
    return git("rev-parse", "--short", "HEAD") + ("-dirty" if dirty else "")


def halves(r: dict[str, Any]) -> str:
    """How far the two counted halves of each kind are apart: plain %, leader %."""

    def spread(pair: list[int]) -> float:
        return 100 * abs(pair[0] - pair[1]) / min(pair)

    return f"{spread(r['plain_ir_halves']):.2f} %, {spread(r['leader_ir_halves']):.2f} %"


def callgrind_table(report: dict[str, Any]) -> str:
    lines = [
        f"send_overhead.py --callgrind, {report['date']}, commit {report['commit']}, "
        f"N={report['n']} counted sends of each kind after {report['warmup']} warm-up "
        f"sends, PYTHONHASHSEED=0",
        "",
        "| run | broker | way | plain Ir/send | leader Ir/send | plain / leader "
        "| leader - plain Ir/send | halves differ by |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for run in report["runs"]:
        for broker, res in run["brokers"].items():
            for way, r in res["ways"].items():
                lines.append(
                    f"| {run['run']} | {broker} | {way} | {r['plain_ir_per_send']:,.0f} "
                    f"| {r['leader_ir_per_send']:,.0f} | {r['plain_over_leader']:.4f} "
                    f"| {r['leader_minus_plain_per_send']:+,.0f} | {halves(r)} |"
                )
    lines.append("")
    lines.append(
        "Wall time per valgrind child (s): "
        + "; ".join(
            f"run {run['run']} "
            + ", ".join(f"{b} {r['wall_s']}" for b, r in run["brokers"].items())
            for run in report["runs"]
        )
    )
    first = report["runs"][0]["brokers"]
    for broker, res in first.items():
        for way, r in res["ways"].items():
            lines += [
                "",
                f"C functions, self Ir per leader send minus per plain send, largest either "
                f"way (run 1, {broker}, {way}):",
            ]
            for func, d in r["c_self_more_per_leader_send"] + r["c_self_less_per_leader_send"]:
                lines.append(f"  {d:+10,.1f}  {func}")
    for broker, ways in report["python_calls"].items():
        for way, diff in ways.items():
            lines += ["", f"Python calls per send that differ, plain -> leader ({broker}, {way}):"]
            for func, (p, le) in diff.items():
                lines.append(f"  {p:5.2f} -> {le:5.2f}  {func}")
    return "\n".join(lines) + "\n"


def run_callgrind(args: argparse.Namespace) -> None:
    if shutil.which("valgrind") is None:
        raise SystemExit("--callgrind needs valgrind on PATH")
    brokers = {"memory": "memory://"}
    if reachable(args.amqp):
        brokers["RabbitMQ"] = args.amqp
    else:
        print(f"RabbitMQ not reachable at {args.amqp}: memory broker only", file=sys.stderr)
    report: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": git_commit(),
        "n": args.n,
        "warmup": args.warmup,
        "valgrind": subprocess.run(
            ["valgrind", "--version"], capture_output=True, text=True
        ).stdout.strip(),
        "machine": machine_info(),
        "runs": [],
    }
    for run in range(1, args.runs + 1):
        brokers_out = {}
        for name, url in brokers.items():
            print(f"run {run}: {name} under callgrind ...", file=sys.stderr, flush=True)
            brokers_out[name] = callgrind_broker(url, args.n, args.warmup, args.top)
        report["runs"].append({"run": run, "brokers": brokers_out})
    report["python_calls"] = {name: python_calls(url) for name, url in brokers.items()}
    table = callgrind_table(report)
    print(table, end="")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "send_overhead_callgrind.json").write_text(json.dumps(report, indent=2) + "\n")
    (RESULTS / "send_overhead_callgrind.txt").write_text(table)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=2000, help="sends of each kind per repetition")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--amqp", default="amqp://guest:guest@127.0.0.1:5672//")
    p.add_argument("--callgrind", action="store_true", help="count instructions per send")
    p.add_argument("--warmup", type=int, default=300, help="--callgrind: uncounted sends first")
    p.add_argument("--runs", type=int, default=1, help="--callgrind: whole runs, to compare")
    p.add_argument("--top", type=int, default=12, help="--callgrind: C functions listed")
    p.add_argument("--callgrind-child", metavar="BROKER", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.callgrind_child:
        callgrind_child(args.callgrind_child, args.n, args.warmup)
        return
    if args.callgrind:
        run_callgrind(args)
        return
    print("| broker | way | plain sends/s | leader sends/s | leader / plain (p50) |")
    print("| --- | --- | --- | --- | --- |")
    for name, broker in (("memory", "memory://"), ("RabbitMQ", args.amqp)):
        for way, (plain, leader, ratio) in measure(broker, args.n, args.repeat).items():
            print(f"| {name} | {way} | {plain:,.0f} | {leader:,.0f} | {ratio:.3f} |")


if __name__ == "__main__":
    main()
