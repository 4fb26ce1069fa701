"""How short can the liveness delta be before a healthy leader loses leadership by itself?

    .venv/bin/python benchmarks/liveness.py --quick     # 15 s per cell
    .venv/bin/python benchmarks/liveness.py             # 60 s per cell

A leader's trust ends delta x 11/12 after the start of its last good ping, and it pings
every delta / 4 from a thread of its own. Under load (a busy CI box, a GC pass in a big
heap, the GIL held by a long C call) a ping can come late; if three in a row do, the
leader steps down although nothing failed. This measures it: for each delta and database,
one leader elector runs in this process while

* ``--burners`` processes (default 2 x CPUs) spin on every core, and
* a thread in this process churns the cyclic garbage collector (lists of dicts that
  reference each other, about 200k objects alive), so full collections happen all run.

Reported per cell: spurious revocations (the leader lost leadership although the
database and the process were healthy: must be 0 at the default), elections, and the
gap between the starts of consecutive good pings (p50 / p99 / max), the quantity the
delta must cover: a gap above delta x 11/12 ends trust.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import multiprocessing
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import _root  # noqa: F401  (the repository root on sys.path: harness)

from celery_election import Elector, backend_from_url
from celery_election.core.clock import boottime
from harness.stats import percentile as pct

HERE = Path(__file__).resolve().parent

URLS = {
    "postgresql": "postgresql+psycopg://postgres@127.0.0.1:5432/test",
    "mariadb": "mysql+pymysql://root@127.0.0.1:3306/test",
    "sqlite": "sqlite:////tmp/celery-election-liveness-bench.db",
}


def burn(stop: Any) -> None:
    """Spin until told to stop: one core's worth of load."""
    x = 0
    while not stop.is_set():
        for _ in range(100_000):
            x += 1


def churn(stop: threading.Event) -> None:
    """Keep the cyclic GC busy: a heap of cross-referenced dicts, replaced piecemeal."""
    heap: list[list[dict[str, Any]]] = []
    while not stop.is_set():
        block = [{"i": i} for i in range(2_000)]
        for a, b in itertools.pairwise(block):
            a["next"], b["prev"] = b, a
        heap.append(block)
        if len(heap) > 100:
            heap.pop(0)


def cell(url: str, delta: float, seconds: float) -> dict[str, Any]:
    backend = backend_from_url(url, table_prefix=f"lvb{os.getpid()}_")
    backend.install()
    elector = Elector(backend, "bench", candidate_id="leader", ttl=10, liveness=delta)
    sub = elector.subscribe()
    elector.start()
    try:
        if not elector.wait_for_leadership(30):
            raise RuntimeError(f"no leadership on {url}")
        deadline = time.monotonic() + 10
        while elector.liveness != "holding":
            if time.monotonic() > deadline:
                raise RuntimeError("the leader never took the liveness lock")
            time.sleep(0.01)
        live = elector._live
        assert live is not None
        starts: list[float] = []
        inner = live.session.ping

        def timed_ping() -> None:
            started = boottime()
            inner()
            starts.append(started)

        live.session.ping = timed_ping  # type: ignore[method-assign]
        time.sleep(seconds)
        revoked = elected = 0
        reasons: dict[str, int] = {}
        while (t := sub.get(timeout=0)) is not None:
            if t.kind == "revoked":
                revoked += 1
                key = t.reason.value if t.reason is not None else "?"
                reasons[key] = reasons.get(key, 0) + 1
            else:
                elected += 1
    finally:
        elector.stop()
        backend.uninstall()
        backend.close()
    gaps = [b - a for a, b in itertools.pairwise(starts)] or [float("nan")]

    return {
        "delta": delta,
        "revoked": revoked,
        "elected_again": elected - 1,
        "reasons": reasons,
        "pings": len(starts),
        "gap_p50": pct(gaps, 0.5),
        "gap_p99": pct(gaps, 0.99),
        "gap_max": max(gaps),
        "trust_after_ping": delta * 11 / 12,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--deltas", default="0.25,0.5,1.0")
    p.add_argument("--backends", default="postgresql,mariadb,sqlite")
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--burners", type=int, default=2 * (os.cpu_count() or 1))
    p.add_argument("--quick", action="store_true", help="15 s per cell")
    p.add_argument("--json", default=str(HERE / "results" / "liveness.json"))
    args = p.parse_args()
    seconds = 15.0 if args.quick else args.seconds
    stop = multiprocessing.Event()
    burners = [multiprocessing.Process(target=burn, args=(stop,)) for _ in range(args.burners)]
    for b in burners:
        b.start()
    churn_stop = threading.Event()
    churner = threading.Thread(target=churn, args=(churn_stop,), daemon=True)
    churner.start()
    gc_before = gc.get_stats()[2]["collections"]
    rows = []
    try:
        for name in args.backends.split(","):
            for delta in [float(d) for d in args.deltas.split(",")]:
                row = {"backend": name, **cell(URLS[name], delta, seconds)}
                rows.append(row)
                print(
                    f"{name:10} delta {delta:4.2f}s  revoked {row['revoked']}  "
                    f"ping gap p50 {row['gap_p50'] * 1000:6.1f} ms  "
                    f"p99 {row['gap_p99'] * 1000:6.1f} ms  max {row['gap_max'] * 1000:6.1f} ms  "
                    f"(trust lasts {row['trust_after_ping'] * 1000:.0f} ms after a ping)",
                    flush=True,
                )
    finally:
        stop.set()
        churn_stop.set()
        for b in burners:
            b.join(5)
    full_gcs = gc.get_stats()[2]["collections"] - gc_before
    out = {
        "seconds_per_cell": seconds,
        "burners": args.burners,
        "cpus": os.cpu_count(),
        "full_gc_passes": full_gcs,
        "rows": rows,
    }
    Path(args.json).write_text(json.dumps(out, indent=2))
    print("| database | delta | spurious revocations | ping gap p50 | p99 | max |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(
            f"| {r['backend']} | {r['delta']:g} s | {r['revoked']} | "
            f"{r['gap_p50'] * 1000:.0f} ms | {r['gap_p99'] * 1000:.0f} ms | "
            f"{r['gap_max'] * 1000:.0f} ms |"
        )
    print(f"{args.burners} spinning processes on {os.cpu_count()} CPUs; {full_gcs} full GC passes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
