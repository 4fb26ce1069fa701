"""Each beat run once under faults: what a user counts when the leading beat fails mid-burst.

    .venv/bin/python benchmarks/beat_faults.py --fault kill            # one fault, ~1 min
    .venv/bin/python benchmarks/beat_faults.py --fault all --out F.md  # every fault, a table

The set-up, the faults and how runs are counted: ``harness/beat_faults.py``. Each fault
runs on a fresh cluster: after a warm-up boundary, a quiet one (each of its runs must
arrive once: the set-up is sound), then the fault at the next; the table gives that
boundary's runs lost and run twice, and how late the last one started.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.beat_faults import FAULTS, Run, Settings


def render(rows: list[dict[str, Any]], entries: int) -> str:
    out = [
        f"{entries} entries due at one boundary, 3 beats (LeaderScheduler, PostgreSQL, "
        "RabbitMQ), 2 workers recording each execution.",
        "",
        "| fault | what | first boundary (lost/twice) | runs | lost | run twice | interrupted "
        "| ran again after the kill | last started |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        q = r["quiet"]
        out.append(
            f"| {r['fault']} | {r['what']} | {q['lost']}/{q['twice']} | {r['runs']} | "
            f"{r['lost']} | {r['twice']} | {r.get('interrupted', 0)} | "
            f"{r.get('again_after_kill', 0)} | {r['late_s']:.1f} s |"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--fault", choices=(*FAULTS, "all"), default="kill")
    p.add_argument("--entries", type=int, default=1000)
    p.add_argument("--every", type=float, default=10.0)
    p.add_argument("--after", type=int, default=100)
    p.add_argument("--beats", type=int, default=3)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--out", type=Path)
    p.add_argument("--keep", type=Path, help="keep each run's logs in a folder under this one")
    args = p.parse_args(argv)
    kinds = [f for f in FAULTS if f != "none"] if args.fault == "all" else [args.fault]
    rows = []
    for kind in kinds:  # a fresh cluster per fault: a stopped beat leaves nothing behind
        with tempfile.TemporaryDirectory() as scratch:
            tmp = Path(tempfile.mkdtemp(dir=args.keep)) if args.keep else Path(scratch)
            settings = Settings(args.entries, args.every, args.after, args.beats, args.workers)
            run = Run(tmp, settings)
            try:
                run.start()
                rows.append(run.one(kind))
            finally:
                run.close()
    table = render(rows, args.entries)
    print(table)
    if args.out:
        args.out.write_text(table + "\n")
    return 0 if all(r["lost"] == 0 and r["twice"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
