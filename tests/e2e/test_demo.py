"""`celery-election demo` runs as the README says, and Ctrl-C leaves nothing behind.

The verdict on overlap and duplicate ticks is the history checker's (harness/checker.py),
on the history the demo's workers and beats record (``--history``); the demo's own summary
is checked as printed.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.checker import check, load

pytestmark = pytest.mark.slow
DEMO = [sys.executable, "-c", "from celery_election.ops.cli import main; main()", "demo"]


def test_the_demo_reports_no_duplicate(tmp_path: Path) -> None:
    history = tmp_path / "history.jsonl"
    proc = subprocess.run(
        [*DEMO, "--history", str(history)],
        cwd=tmp_path, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert re.search(r"duplicates\s+0\n", out)
    assert "OK: every tick was sent at most once" in out
    assert "crash failover" in out and "clean handoff" in out
    ran = int(re.search(r"ticks run\s+(\d+)", out).group(1))  # type: ignore[union-attr]
    assert ran >= 12
    # The verdict: no two trusted leaders, terms only going up, no send outside its term's
    # trust window, no beat run sent twice.
    records = load([history])
    report = check(records)
    assert report.ok, report.violations[:10]
    assert report.terms >= 3 and report.sends >= 12, report.summary()
    # Not vacuous: the same history with one beat run sent twice fails.
    send = next(r for r in records if r["k"] == "send")
    assert check([*records, dict(send)]).duplicate_ticks == 1


def _processes_mentioning(text: str) -> list[int]:
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if text.encode() in cmdline:
            found.append(int(pid))
    return found


def _start_demo(tmp_path: Path) -> tuple[subprocess.Popen[str], str | None]:
    """Start the demo and read its output until the first tick ran (workers are up)."""
    proc = subprocess.Popen(DEMO, cwd=tmp_path, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    tmpdir = None
    for line in proc.stdout:
        found = re.search(r"(/\S*celery-election-demo-[^/\s]+)/", line)
        if found:
            tmpdir = "/" + found.group(1).lstrip("/")  # from sqlite:////tmp/...
        if "tick after" in line:  # three workers, pools and embedded beats are running
            break
    return proc, tmpdir


def _kill_leftovers(proc: subprocess.Popen[str], tmpdir: str | None) -> None:
    """Never leave anything behind, whatever the test saw."""
    if proc.poll() is None:
        proc.kill()
    for pid in _processes_mentioning(tmpdir) if tmpdir else []:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def test_ctrl_c_in_the_middle_stops_every_process(tmp_path: Path) -> None:
    proc, tmpdir = _start_demo(tmp_path)
    try:
        assert tmpdir is not None and _processes_mentioning(tmpdir), "the demo never ran"
        proc.send_signal(signal.SIGINT)  # what Ctrl-C sends to the demo
        rest = proc.communicate(timeout=60)[0]
        assert proc.returncode == 130, rest
        assert "interrupted: stopping every worker" in rest
        assert _processes_mentioning(tmpdir) == []
        assert not Path(tmpdir).exists()
    finally:
        _kill_leftovers(proc, tmpdir)


def test_killing_the_demo_takes_its_workers_with_it(tmp_path: Path) -> None:
    proc, tmpdir = _start_demo(tmp_path)
    try:
        assert tmpdir is not None and _processes_mentioning(tmpdir), "the demo never ran"
        proc.kill()  # no chance to clean up: the workers must notice on their own
        proc.wait()
        deadline = time.monotonic() + 60
        while _processes_mentioning(tmpdir) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _processes_mentioning(tmpdir) == []
    finally:
        _kill_leftovers(proc, tmpdir)
        if tmpdir:
            shutil.rmtree(tmpdir, ignore_errors=True)
