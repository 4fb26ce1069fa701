"""The examples run: django-celery-beat behind LeaderSchedulerMixin, on the real package."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_django_celery_beat_sends_only_on_the_leader_each_tick_once(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples/django_celery_beat/run_two_schedulers.py"), "4"],
        env={
            "PATH": "/usr/bin:/bin",
            "EXAMPLE_DB": str(tmp_path / "django.db"),
            "EXAMPLE_ELECTION_URL": f"sqlite:///{tmp_path}/election.db",
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert sorted(report["leaders"]) == [False, True]
    leader = report["leaders"].index(True)
    sent = report["sent"]
    assert sent[1 - leader] == []  # the follower sent nothing
    dues = sent[leader]
    assert len(dues) >= 3 and len(set(dues)) == len(dues)
    assert all(b - a == 1_000_000 for a, b in itertools.pairwise(dues))  # one per nominal second
