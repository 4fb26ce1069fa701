"""A rolling upgrade: the previous release and this one in one namespace (issue 34).

A deploy replaces processes one at a time, so for minutes two releases share one set of
tables, one lease and one liveness lock. Three standalone ``celery beat`` of the previous
release (0.1.0, the commit ``PREVIOUS``, its ``celery_election`` put first on their path)
elect on tables that release installed; then each is replaced by one of this release, and
in the middle the leading beat is SIGKILLed. The beats' histories are judged by
harness/checker.py: one trusted leader at every instant, every run of the two
every-second entries sent once, none lost while a leader was trusted.
"""

from __future__ import annotations

import io
import signal
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from harness.checker import check, load
from harness.cluster import ROOT, Cluster, wait_until

from ..conftest import REQUIRE, server_url

#: celery-election 0.1.0 (tag v0.1.0), the release before this one
PREVIOUS = "757f953"

pytestmark = [pytest.mark.slow, pytest.mark.tier2, pytest.mark.timeout(300)]


def _previous_release(into: Path) -> Path:
    """``celery_election`` as of ``PREVIOUS``, unpacked under ``into``."""
    try:
        archive = subprocess.run(
            ["git", "archive", PREVIOUS, "celery_election"],
            cwd=ROOT, capture_output=True, check=True, timeout=60,
        ).stdout  # fmt: skip
    except (OSError, subprocess.CalledProcessError) as exc:
        message = f"the previous release ({PREVIOUS}) is not in this checkout's history: {exc}"
        if REQUIRE:
            pytest.fail(message)
        pytest.skip(message)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into


def test_a_rolling_upgrade_with_a_kill_in_the_middle(tmp_path: Path) -> None:
    old = _previous_release(tmp_path / "previous")
    db = server_url("postgresql")
    c = Cluster(tmp_path, server_url("amqp"), db, f"db+{db}", ttl=6.0, beat=True)
    c.backend.uninstall()  # the tables the previous release makes, as it made them
    olden = {"PYTHONPATH": f"{old}:{ROOT}"}
    subprocess.run(
        [sys.executable, "-c", "import sys; from celery_election import backend_from_url as b; "
         "assert 'previous' in sys.modules['celery_election'].__file__; "
         f"b({db!r}, table_prefix={c.prefix!r}).install()"],
        env={**c.env, **olden}, cwd=tmp_path, check=True, timeout=60,
    )  # fmt: skip
    histories = []

    def beat(name: str, previous: bool) -> None:
        history = tmp_path / f"{name}-{'old' if previous else 'new'}.jsonl"
        histories.append(history)
        env = {"E2E_HISTORY": str(history), **(olden if previous else {})}
        c.start_beat(name, env=env)

    try:
        c.start("w", election=False)  # runs the ticks
        for name in ("b1", "b2", "b3"):
            beat(name, previous=True)
        c.wait_beat_leader(60)
        order = ["b1", "b2", "b3"]
        killed = False
        while order:
            leader = c.wait_beat_leader(30)
            if not killed and len(order) == 2:
                # the deploy's middle: the leader dies without a word
                victim, sig, killed = leader, signal.SIGKILL, True
            else:
                victim, sig = order[0], signal.SIGTERM
            c.signal(victim, sig)
            c.wait_exit(victim, timeout=30)
            beat(victim, previous=False)
            if victim in order:
                order.remove(victim)
            sent = len(c.rows(c.ticks))
            wait_until(lambda n=sent: len(c.rows(c.ticks)) >= n + 4, 60, "beat runs after a step")
        assert killed
        sent = len(c.rows(c.ticks))
        wait_until(lambda: len(c.rows(c.ticks)) >= sent + 6, 60, "beat runs on the new release")
    except BaseException:
        print(c.logs())
        raise
    finally:
        c.close()
    report = check(load(histories), tick_every={"every-second-a": 1.0, "every-second-b": 1.0})
    print(f"\nrolling upgrade: {report.summary()}")
    assert report.ok, report.violations
    assert report.duplicate_ticks == 0 and report.lost_ticks == 0
    assert report.overlap_seconds == 0.0
    assert report.terms >= 3  # elected by the old, after the kill, and by the new
