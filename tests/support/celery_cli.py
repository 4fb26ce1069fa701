"""A Celery app's CLI run as a user runs it: ``celery -A app worker|beat ...``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

__all__ = ["BEAT", "REPO", "one_error_line", "run_celery", "run_worker"]

REPO = Path(__file__).resolve().parents[2]
BEAT = ("beat", "-S", "celery_election.beat:LeaderScheduler", "--max-interval", "1")


def run_worker(tmp_path: Path, conf: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``celery worker --election -P solo`` of an app configured with ``conf``."""
    return run_celery(tmp_path, conf, "worker", "--election", "-P", "solo", *args)


def run_celery(tmp_path: Path, conf: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``celery -A badapp <args>`` of an app configured with ``conf``."""
    (tmp_path / "badapp.py").write_text(
        "from celery import Celery\n"
        "from celery_election import init_app\n"
        "app = Celery('badapp', broker='memory://')\n"
        f"app.conf.update({conf})\n"
        "init_app(app)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])}
    return subprocess.run(
        [sys.executable, "-m", "celery", "-A", "badapp", *args],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def one_error_line(done: subprocess.CompletedProcess[str]) -> str:
    """The run ended with exit 1 and one ``Error:`` line, its last, and no traceback."""
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    # (as root, Celery's own SecurityWarning about running as root comes first)
    lines = [line for line in done.stderr.splitlines() if line.startswith("Error:")]
    assert len(lines) == 1 and done.stderr.rstrip().endswith(lines[0]), done.stderr
    assert lines[0].startswith("Error: celery-election: ")
    return lines[0]
