"""Cron's daylight-saving rules (``beat/cron.py``) against a brute-force reference, every zone.

    .venv/bin/python benchmarks/cron_dst.py                      # 2025 and 2026, every zone
    .venv/bin/python benchmarks/cron_dst.py --years 2024 2025 --json out.json

For each zone of ``zoneinfo.available_timezones()`` whose offset changes in the chosen
years, and each crontab of ``harness.cron_reference.CRONTABS``, the runs ``next_run``
gives are compared, in a window of two days on each side of every transition, with those
of the reference, which steps every UTC minute (``harness/cron_reference.py``). Printed:
zones, transitions, windows and runs checked, and the differences (expected: 0). The unit
suite checks a fixed sample of the hard zones (``tests/unit/test_cron_dst.py``); this is
the full sweep (about a minute here).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import zoneinfo
from pathlib import Path

import _root  # noqa: F401  (the repository root on sys.path)

from harness.cron_reference import CRONTABS, sweep


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--years", type=int, nargs=2, default=[2025, 2026])
    parser.add_argument("--json", help="Also write the figures here.")
    args = parser.parse_args()
    started = time.monotonic()
    names = zoneinfo.available_timezones()
    result = sweep(names, args.years)
    took = time.monotonic() - started
    diffs = result.differences or []
    figures = {
        "years": args.years,
        "zones_available": len(names),
        "zones_with_transitions": result.zones,
        "transitions": result.transitions,
        "windows": result.windows,
        "crontabs": len(CRONTABS),
        "runs_compared": result.runs,
        "differences": len(diffs),
        "seconds": round(took, 1),
        "tzdata": _tzdata_version(),
    }
    for key, value in figures.items():
        print(f"{key:24} {value}")
    for line in diffs[:50]:
        print("DIFFERENCE", line)
    if args.json:
        Path(args.json).write_text(json.dumps({**figures, "examples": diffs[:50]}, indent=2) + "\n")
    sys.exit(1 if diffs else 0)


def _tzdata_version() -> str:
    """The zone data zoneinfo reads (the system's first, else the tzdata package)."""
    for base in zoneinfo.TZPATH:
        path = Path(base) / "tzdata.zi"
        if path.exists():
            return path.read_text().split("\n", 1)[0].removeprefix("# version ").strip()
    try:
        import tzdata

        return f"{tzdata.IANA_VERSION} (package)"
    except ImportError:
        return "?"


if __name__ == "__main__":
    main()
