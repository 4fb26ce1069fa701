"""The three-elector example runs and reports no overlap; the history checker agrees.

The verdict on overlap is harness/checker.py's, on the history the example's electors
record (``--history``); the example's own summary is checked as printed.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from harness.checker import check, load

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_three_electors_demo_hands_over_without_overlap(tmp_path: Path) -> None:
    history = tmp_path / "history.jsonl"
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "three_electors.py"),
            "--ttl",
            "2",
            "--url",
            f"sqlite:///{tmp_path}/demo.db",
            "--history",
            str(history),
        ],
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "overlapping leaders  0" in proc.stdout
    assert "terms strictly increasing: True" in proc.stdout
    assert proc.stdout.rstrip().endswith("OK")
    # The verdict: no two trusted leaders, terms only going up, one candidate per term.
    records = load([history])
    report = check(records)
    assert report.ok, report.violations[:10]
    assert report.terms >= 3, report.summary()
    # Not vacuous: the first leader trusting its term again when the second is elected
    # (a stale leader) is split brain.
    first = next(r for r in records if r["k"] == "trust" and r["term"] is not None)
    second = next(
        r for r in records if r["k"] == "trust" and r["term"] not in (None, first["term"])
    )
    stale = {**first, "mono": second["mono"], "until": second["mono"] + 1.0}
    assert any("split brain" in v for v in check([*records, stale]).violations)
