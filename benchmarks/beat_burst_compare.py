"""beat_burst.py from two source trees in one run, alternating, for a before/after table.

    .venv/bin/python benchmarks/beat_burst_compare.py                      # before: /work/before
    .venv/bin/python benchmarks/beat_burst_compare.py --before /work/before --after . --rounds 3
    .venv/bin/python benchmarks/beat_burst_compare.py --entries 1000 --rounds 1 \\
        --before /work/before --after /work/before          # smoke: both sides one tree

Issue 41 (the beat refactor): the same burst (``beat_burst.py``: N entries
``crontab(minute="*")`` due at one minute boundary, one real ``celery beat`` process, PostgreSQL
and RabbitMQ on loopback) measured on the tree before the change and on the tree after it. Each
measurement is one ``beat_burst.py`` process for one N and one scheduler, taken from the tree
it measures and run with ``PYTHONPATH=<tree>``, ``cwd=<tree>`` and this venv's Python (the
venv's editable install points at the main checkout; PYTHONPATH comes first on ``sys.path``
and the editable finder is appended to ``sys.meta_path`` after the path finder, so the tree
wins: every child checks it, see below). For each round, each N and each scheduler the two
trees run back to back, before then after (A B A B ...): a change of the machine's load lands
on both sides alike.

The checks, before anything is measured and again in every child: ``celery_election`` as
imported by the child (``__file__``) lies inside its tree, ``_root.ROOT`` (which
``beat_burst.py`` puts on the beat's ``PYTHONPATH``) is the tree, and a probe process started
the way ``beat_burst.py`` starts the beat (``PYTHONPATH=<tree>``, another cwd) imports
``celery_election.beat.scheduler`` from the tree. A child that fails a check exits with
status 3 and the run stops.

Printed per N: a markdown table, one row per scheduler and metric: the median of the before
runs, of the after runs, the ratio after/before, and every run in order. Metrics (from
``beat_burst.py``'s JSON): ``last send s`` (boundary to the last of the N sends; ``*``: not all N
went out within ``--window``, the value is then the window, not a time), ``CPU s`` (the beat's
and its publishers' CPU over the burst), ``stmt/send`` (leader only). ``stock`` does not import
``celery_election``: its two columns differ by noise alone, the run's noise gauge.

Every run's row, the trees (commit, uncommitted changes under ``celery_election/``, a hash of
its ``.py`` files at each run: a tree edited during the run is reported) and the machine go to
``--json``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import hashlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import _root
from _machine import machine_info

HERE = Path(__file__).resolve().parent
DEFAULT_JSON = HERE / "results" / "beat_burst_compare.json"
PG_DEFAULT = os.environ.get(
    "CELERY_ELECTION_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
AMQP_DEFAULT = os.environ.get(
    "CELERY_ELECTION_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//"
)
SIDES = ("before", "after")
METRICS = (("last_send_s", "last send s"), ("cpu_s", "CPU s"), ("statements_per_send", "stmt/send"))
CHECK_FAILED = 3

# Run in each child as ``python -c CHILD TREE SCRIPT ARGS...``: check where the package comes
# from, then run the tree's beat_burst.py as __main__ (its own directory first on sys.path, as
# ``python benchmarks/beat_burst.py`` would have it).
CHILD = r"""
import os, runpy, subprocess, sys, tempfile
from pathlib import Path

tree, script = Path(sys.argv[1]).resolve(), Path(sys.argv[2]).resolve()

def fail(msg):
    print(f"[compare] CHECK FAILED: {msg}", file=sys.stderr, flush=True)
    sys.exit(3)

import celery_election

pkg = Path(celery_election.__file__).resolve()
if not pkg.is_relative_to(tree):
    fail(f"celery_election from {pkg}, not from {tree}")
sys.path.insert(0, str(script.parent))
import _root

if _root.ROOT.resolve() != tree:
    fail(f"_root.ROOT is {_root.ROOT}, not {tree}")
probe = "import celery_election.beat.scheduler as s; print(s.__file__)"
with tempfile.TemporaryDirectory() as elsewhere:
    env = {**os.environ, "PYTHONPATH": str(_root.ROOT)}
    got = subprocess.run([sys.executable, "-c", probe], cwd=elsewhere, env=env,
                         capture_output=True, text=True).stdout.strip()
if not got or not Path(got).resolve().is_relative_to(tree):
    fail(f"a beat started like beat_burst.py's would import {got or 'nothing'}")
print(f"[compare] child {os.getpid()}: celery_election from {pkg.parent}", file=sys.stderr,
      flush=True)
sys.argv = [str(script), *sys.argv[3:]]
runpy.run_path(str(script), run_name="__main__")
"""


class Interrupted(Exception):
    """SIGTERM or Ctrl-C: the running child is stopped the way beat_burst.py cleans up."""


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def git(tree: Path, *argv: str) -> str:
    done = subprocess.run(["git", "-C", str(tree), *argv], capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else "?"


def tree_hash(tree: Path) -> str:
    """sha256 of the package's .py files (path and content), 12 hex digits."""
    digest = hashlib.sha256()
    pkg = tree / "celery_election"
    for path in sorted(pkg.rglob("*.py")):
        digest.update(str(path.relative_to(pkg)).encode() + b"\0")
        with contextlib.suppress(OSError):
            digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def tree_info(tree: Path) -> dict[str, Any]:
    dirty = git(tree, "status", "--porcelain", "--", "celery_election")
    return {
        "path": str(tree),
        "commit": git(tree, "rev-parse", "--short", "HEAD"),
        "uncommitted_in_package": len(dirty.splitlines()) if dirty != "?" else None,
        "hash_at_start": tree_hash(tree),
    }


def check_tree(tree: Path, python: str) -> None:
    """Before the first run: the tree has the package and the script, and PYTHONPATH wins."""
    script = tree / "benchmarks" / "beat_burst.py"
    if not (tree / "celery_election" / "__init__.py").is_file() or not script.is_file():
        raise SystemExit(f"{tree}: no celery_election/ or benchmarks/beat_burst.py")
    probe = "import celery_election, sys; sys.stdout.write(celery_election.__file__)"
    env = {**os.environ, "PYTHONPATH": str(tree)}
    got = subprocess.run(
        [python, "-c", probe], cwd=tree, env=env, capture_output=True, text=True
    ).stdout
    if not got or not Path(got).resolve().is_relative_to(tree):
        raise SystemExit(f"{tree}: PYTHONPATH={tree} imports celery_election from {got!r}")


@contextlib.contextmanager
def terminate_on_signal() -> Iterator[None]:
    def handler(signum: int, frame: FrameType | None) -> None:
        raise Interrupted(signal.Signals(signum).name)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def stop(proc: subprocess.Popen[str]) -> None:
    """SIGINT to the child's process group (beat_burst.py's ``finally`` stops the beat and
    deletes its queue and tables), SIGKILL to what is left after 30 s."""
    for sig, wait in ((signal.SIGINT, 30.0), (signal.SIGKILL, 5.0)):
        if proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(wait)


def run_one(
    side: str, tree: Path, kind: str, n: int, args: argparse.Namespace, tmp: Path
) -> dict[str, Any]:
    """One beat_burst.py process of ``tree`` for one N and one scheduler: its JSON's row."""
    out = tmp / f"{side}-{kind}-{n}-{time.monotonic_ns()}.json"
    argv = [args.python, "-c", CHILD, str(tree), str(tree / "benchmarks" / "beat_burst.py"),
            "--entries", str(n), "--schedulers", kind, "--broker", args.broker, "--pg", args.pg,
            "--window", str(args.window), "--ready-timeout", str(args.ready_timeout),
            "--json", str(out)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(tree)}
    started = time.time()
    before_hash = tree_hash(tree)
    proc = subprocess.Popen(
        argv, cwd=tree, env=env, stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        stdout, _ = proc.communicate(timeout=args.child_timeout)
    except subprocess.TimeoutExpired:
        stop(proc)
        raise RuntimeError(
            f"{side} {kind} N={n}: no result in {args.child_timeout:.0f} s"
        ) from None
    except BaseException:
        stop(proc)
        raise
    if proc.returncode == CHECK_FAILED:
        raise SystemExit(f"{side} ({tree}): the child imported the wrong package; see above")
    if proc.returncode != 0 or not out.exists():
        raise RuntimeError(f"{side} {kind} N={n}: beat_burst.py exited {proc.returncode}")
    row: dict[str, Any] = json.loads(out.read_text())["runs"][0]
    row.update(
        side=side,
        tree=str(tree),
        tree_hash=before_hash,
        tree_hash_after=tree_hash(tree),
        started=started,
        loadavg=os.getloadavg(),
        table=stdout.strip(),
    )
    return row


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def fmt(value: float | None, metric: str) -> str:
    if value is None:
        return "-"
    return f"{value:.3f}" if metric == "statements_per_send" else f"{value:.2f}"


def raw(rows: list[dict[str, Any]], metric: str) -> str:
    out = []
    for r in rows:
        text = fmt(r.get(metric), metric)
        if metric == "last_send_s" and not r["complete"]:
            text += "*"
        out.append(text)
    return ", ".join(out)


def render(rows: list[dict[str, Any]], entries: list[int], kinds: list[str]) -> str:
    parts = []
    for n in entries:
        lines = [
            f"### N = {n:,}",
            "",
            "| mode | metric | before median | after median | after/before "
            "| before runs | after runs |",
            "| --- | --- | ---: | ---: | ---: | --- | --- |",
        ]
        for kind in kinds:
            mine = [r for r in rows if r["entries"] == n and r["kind"] == kind]
            for metric, label in METRICS:
                if metric == "statements_per_send" and kind == "stock":
                    continue
                side_rows = {s: [r for r in mine if r["side"] == s] for s in SIDES}
                meds = {
                    s: median([r[metric] for r in side_rows[s] if r.get(metric) is not None])
                    for s in SIDES
                }
                b, a = meds["before"], meds["after"]
                ratio = f"{a / b:.3f}" if a is not None and b else "-"
                lines.append(
                    f"| {kind} | {label} | {fmt(b, metric)} | {fmt(a, metric)} | {ratio} "
                    f"| {raw(side_rows['before'], metric)} | {raw(side_rows['after'], metric)} |"
                )
        parts.append("\n".join(lines))
    incomplete = any(not r["complete"] for r in rows)
    note = (
        "\n\n`*`: not all N sent within the window; the value is the time of the last send seen."
        if incomplete
        else ""
    )
    return "\n\n".join(parts) + note


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", type=Path, default=Path("/work/before"))
    parser.add_argument("--after", type=Path, default=_root.ROOT)
    parser.add_argument("--entries", default="1000,10000", help="Comma-separated sizes.")
    parser.add_argument("--schedulers", default="stock,leader,leader-p1",
                        help="beat_burst.py's: stock, leader, leader-pN")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--broker", default=AMQP_DEFAULT)
    parser.add_argument("--pg", default=PG_DEFAULT)
    parser.add_argument("--window", type=float, default=55.0)
    parser.add_argument("--ready-timeout", type=float, default=180.0)
    parser.add_argument("--child-timeout", type=float, default=600.0,
                        help="Seconds one beat_burst.py process may take.")  # fmt: skip
    parser.add_argument("--python", default=sys.executable,
                        help="Every child's interpreter (default: this one).")  # fmt: skip
    parser.add_argument("--json", default=str(DEFAULT_JSON))
    args = parser.parse_args(argv)
    trees = {"before": args.before.resolve(), "after": args.after.resolve()}
    entries = [int(x) for x in args.entries.split(",")]
    kinds = args.schedulers.split(",")
    for tree in trees.values():
        check_tree(tree, args.python)
    scripts = {s: (t / "benchmarks" / "beat_burst.py").read_bytes() for s, t in trees.items()}
    if scripts["before"] != scripts["after"]:
        log("[compare] NOTE: the two trees' beat_burst.py differ; each side runs its own")
    info = {s: tree_info(t) for s, t in trees.items()}
    for side, i in info.items():
        log(f"[compare] {side}: {i['path']} at {i['commit']}, "
            f"{i['uncommitted_in_package']} uncommitted file(s) in celery_election/")  # fmt: skip
    date = datetime.datetime.now(datetime.timezone.utc)
    machine = machine_info()
    rows: list[dict[str, Any]] = []
    failed: list[str] = []
    total = args.rounds * len(entries) * len(kinds) * 2
    with tempfile.TemporaryDirectory(prefix="beat-burst-compare-") as tmpdir, terminate_on_signal():
        try:
            for rnd in range(1, args.rounds + 1):
                for n in entries:
                    for kind in kinds:
                        for side in SIDES:
                            log(f"[compare] run {len(rows) + 1}/{total}: round {rnd}, "
                                f"N={n}, {kind}, {side}")  # fmt: skip
                            try:
                                row = run_one(side, trees[side], kind, n, args, Path(tmpdir))
                            except RuntimeError as exc:  # one failed run: the rest still count
                                log(f"[compare] FAILED: {exc}")
                                failed.append(f"round {rnd}: {exc}")
                                continue
                            row["round"] = rnd
                            rows.append(row)
        except (KeyboardInterrupt, Interrupted) as exc:
            log(f"[compare] interrupted ({exc or 'SIGINT'}) after {len(rows)} run(s)")
            if not rows:
                return 130
    edited = {s: sorted({info[s]["hash_at_start"]}) for s in SIDES}
    for r in rows:
        edited[r["side"]] = sorted({*edited[r["side"]], r["tree_hash"], r["tree_hash_after"]})
    header = [
        f"beat_burst.py, before/after, {date:%Y-%m-%d %H:%M} UTC, {len(rows)} run(s), "
        f"{args.rounds} round(s), load average at the end "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}",
        "",
    ]
    for side in SIDES:
        i = info[side]
        line = (f"- {side}: `{i['path']}` at {i['commit']}, {i['uncommitted_in_package']} "
                f"uncommitted file(s) in celery_election/, package hash "
                f"{', '.join(edited[side])}")  # fmt: skip
        if len(edited[side]) > 1:
            line += " (**the tree changed during the run**)"
        header.append(line)
    header.extend(f"- failed run: {f}" for f in failed)
    table = "\n".join(header) + "\n\n" + render(rows, entries, kinds)
    print(table)
    result = {
        "date": date.isoformat(),
        "machine": machine,
        "loadavg_at_end": os.getloadavg(),
        "broker": args.broker,
        "trees": info,
        "settings": {k: str(v) for k, v in vars(args).items()},
        "runs": rows,
        "failed": failed,
        "table": table,
    }
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
