"""The machine a benchmark ran on, recorded with its results."""

from __future__ import annotations

import contextlib
import os
import platform
import sqlite3
import sys
from pathlib import Path
from typing import Any


def machine_info() -> dict[str, Any]:
    """CPU, load, Python and the versions of what the benchmarks exercise."""
    info: dict[str, Any] = {
        "nproc": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "sqlite_library": sqlite3.sqlite_version,
        "loadavg_at_start": os.getloadavg(),
    }
    for mod in ("celery", "kombu", "sqlalchemy", "psycopg", "pymysql"):
        try:
            info[mod] = __import__(mod).__version__
        except Exception:
            info[mod] = None
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
    return info
