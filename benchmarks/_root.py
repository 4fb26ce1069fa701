"""Import first (``import _root``): puts the repository root on ``sys.path`` so that a
benchmark run as ``python benchmarks/x.py`` finds the shared ``harness``."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
