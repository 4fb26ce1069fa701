"""The examples run: django-celery-beat behind LeaderSchedulerMixin, on the real package."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_django_celery_beat_sends_only_on_the_leader_each_run_once(tmp_path: Path) -> None:
    """The mixin over DatabaseScheduler keeps django-celery-beat's rules: start_time,
    expires and a clocked one-off task (sent exactly once, not every second).

    The two schedulers run in two processes and two working directories (two hosts) and
    find the election through Django's ``CELERY_ELECTION_URL``: if that setting were
    dropped, each would elect itself in a default file of its own directory.
    """
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples/django_celery_beat/run_two_schedulers.py"), "5"],
        env={
            "PATH": "/usr/bin:/bin",
            "EXAMPLE_DB": str(tmp_path / "django.db"),
            "EXAMPLE_ELECTION_URL": f"sqlite:///{tmp_path}/election.db",
        },
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    for host in report["hosts"]:  # the configured URL, not a default file per host
        assert not list(Path(host).glob("*.sqlite3")), os.listdir(host)
        shutil.rmtree(host)
    assert sorted(report["leaders"]) == [False, True]
    leader = report["leaders"].index(True)
    sent = report["sent"]
    assert sent[1 - leader] == []  # the follower sent nothing
    by_task: dict[str, list[tuple[int, float]]] = {}
    for task, run, at in sent[leader]:
        by_task.setdefault(task, []).append((run, at))
    jobs = [run for run, _ in by_task["remote.job"]]
    assert len(jobs) >= 3 and len(set(jobs)) == len(jobs)  # each run once
    assert all(a < b for a, b in itertools.pairwise(jobs))
    assert "remote.expired" not in by_task  # expires in the past: never sent
    assert len(by_task.get("remote.once", [])) == 1, by_task.get("remote.once")  # one-off
    assert by_task["remote.once"][0][1] >= report["clocked"]
    later = by_task.get("remote.later", [])
    assert later and min(at for _, at in later) >= report["starts"]  # not before start_time
