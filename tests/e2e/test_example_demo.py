"""The README's first command: the three-elector demo runs and reports no overlap."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_three_electors_demo_hands_over_without_overlap(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "three_electors.py"),
            "--ttl",
            "2",
            "--url",
            f"sqlite:///{tmp_path}/demo.db",
        ],
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "overlapping leaders  0" in proc.stdout
    assert "terms strictly increasing: True" in proc.stdout
    assert proc.stdout.rstrip().endswith("OK")
