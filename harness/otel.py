"""Processes under ``opentelemetry-instrument``, and the spans they export.

The standard set-up, nothing of ours: ``opentelemetry-instrument`` (opentelemetry-distro)
runs ``celery ...`` with the SDK configured from ``OTEL_*`` variables, and the console
exporter writes each span as indented JSON to the process's stdout, which is its log
file here (beside Celery's log lines). :func:`spans_in` reads them back.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

from harness.cluster import Cluster
from harness.processes import Proc

#: The exporter and the SDK's batching: each span is written and flushed within 0.1 s.
OTEL_ENV = {
    "OTEL_TRACES_EXPORTER": "console",
    "OTEL_METRICS_EXPORTER": "none",
    "OTEL_LOGS_EXPORTER": "none",
    "OTEL_BSP_SCHEDULE_DELAY": "100",
    "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "1",  # one span a write: no two processes' interleave
}


def instrument_command() -> str:
    """The ``opentelemetry-instrument`` beside this interpreter (opentelemetry-distro)."""
    found = shutil.which("opentelemetry-instrument", path=str(Path(sys.executable).parent))
    if found is None:
        raise RuntimeError("opentelemetry-instrument is missing: pip install -e '.[dev]'")
    return found


def spawn(c: Cluster, name: str, args: list[str], env: dict[str, str] | None = None) -> None:
    """``Cluster._spawn`` under ``opentelemetry-instrument``: service name = ``name``."""
    cmd = [instrument_command(), sys.executable, "-m", "celery", "-A", "tests.e2e.proj", *args,
           "--loglevel", "INFO"]  # fmt: skip
    home = c.tmp / name
    home.mkdir(exist_ok=True)
    full = {**c.env, **OTEL_ENV, "OTEL_SERVICE_NAME": name, **(env or {})}
    c.workers[name] = Proc(name, cmd, env=full, cwd=home, log=c.tmp / f"{name}.log").start()


def start_worker(c: Cluster, name: str) -> None:
    """A ``celery worker --election`` (prefork, 2 processes), as ``Cluster.start`` starts one."""
    spawn(c, name, [
        "worker", "--election", "-c", "2", "-P", "prefork", "-n", f"{name}@%h.{c.namespace}",
        "-Q", f"q.{c.namespace},{c.own_queue(name)}", "--without-gossip", "--without-mingle",
        "-s", str(c.tmp / f"{name}-schedule"),
    ])  # fmt: skip


def start_beat(c: Cluster, name: str, env: dict[str, str] | None = None) -> None:
    """A standalone ``celery beat`` with the LeaderScheduler (the cluster has ``beat=True``)."""
    spawn(c, name, ["beat", "-s", str(c.tmp / f"{name}-schedule")], env)


def spans_in(path: Path) -> list[dict[str, Any]]:
    """Every span the console exporter wrote to ``path`` (each a JSON object at a line start).

    A span being written as the file is read (its end not there yet) is left for later.
    """
    text = "\n" + path.read_text(errors="replace") if path.exists() else ""
    decoder = json.JSONDecoder()
    spans = []
    at = 0
    while (at := text.find("\n{\n", at)) != -1:
        try:
            obj, end = decoder.raw_decode(text, at + 1)
        except json.JSONDecodeError:
            at += 1
            continue
        if isinstance(obj, dict) and "context" in obj and "name" in obj:
            spans.append(obj)
        at = end
    return spans


def all_spans(c: Cluster) -> list[dict[str, Any]]:
    """The spans of every process of the cluster, each tagged with its process (``_proc``)."""
    out = []
    for name in c.workers:
        for span in spans_in(c.tmp / f"{name}.log"):
            span["_proc"] = name
            out.append(span)
    return out


def render_trace(spans: list[dict[str, Any]], trace_id: str) -> str:
    """One trace as an indented tree: name, process, start offset and duration (ms)."""
    from datetime import datetime

    mine = [s for s in spans if s["context"]["trace_id"] == trace_id]
    ids = {s["context"]["span_id"] for s in mine}

    def at(s: dict[str, Any], key: str) -> float:
        return datetime.fromisoformat(s[key].replace("Z", "+00:00")).timestamp()

    t0 = min((at(s, "start_time") for s in mine), default=0.0)
    lines = [f"trace {trace_id}"]

    def walk(parent: str | None, depth: int) -> None:
        kids = [s for s in mine if (s["parent_id"] if s["parent_id"] in ids else None) == parent]
        for s in sorted(kids, key=lambda s: at(s, "start_time")):
            start, took = at(s, "start_time") - t0, at(s, "end_time") - at(s, "start_time")
            lines.append(f"{'  ' * depth}{s['name']}  [{s.get('_proc', '?')}]  "
                         f"+{start * 1000:.1f} ms, {took * 1000:.1f} ms")  # fmt: skip
            walk(s["context"]["span_id"], depth + 1)

    walk(None, 1)
    return "\n".join(lines)
