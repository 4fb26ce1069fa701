"""``election schedule ...``: every subcommand, its table and JSON output, its one-line errors.

With ``--url`` (no app: no static entries, no task names to check) through click's runner,
and as a user types it, ``celery -A proj election schedule ...`` in a process of its own,
where the app's ``beat_schedule`` and task names are known.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from celery_election.core.lease import Bid
from celery_election.core.runstate import run_task_id
from celery_election.ops.cli import election

from ..conftest import by_entry, claim_run, unique_prefix
from ..support.celery_cli import REPO


def cli(url: str, prefix: str, *args: str) -> Any:
    return CliRunner().invoke(
        election, ["--url", url, "--table-prefix", prefix, "schedule", "--as", "tester", *args]
    )


def test_every_subcommand_with_a_url(tmp_path: Path) -> None:
    url, prefix = f"sqlite:///{tmp_path}/e.db", unique_prefix()
    assert (
        CliRunner().invoke(election, ["--url", url, "--table-prefix", prefix, "install"]).exit_code
        == 0
    )
    ok = cli(url, prefix, "add", "r", "proj.report", "every 10s", "--kwargs", '{"a": 1}',
             "--overlap", "skip", "--catch-up", "all", "--catch-up-max", "3")  # fmt: skip
    assert ok.exit_code == 0, ok.output
    assert ok.output.strip() == "added r: proj.report every 10s"
    listed = cli(url, prefix, "list")
    assert listed.exit_code == 0
    header, row = listed.output.splitlines()
    assert header.split() == ["NAME", "TASK", "SCHEDULE", "STATE", "LAST", "RUN", "(UTC)",
                              "RUNS", "KIND", "POLICIES"]  # fmt: skip
    assert row.split()[:4] == ["r", "proj.report", "every", "10s"]
    assert "catch_up=all catch_up_max=3 overlap=skip" in row
    assert cli(url, prefix, "edit", "r", "--schedule", "*/5 * * * *", "--tz", "UTC").exit_code == 0
    shown = json.loads(cli(url, prefix, "show", "r", "--json").output)
    assert shown["spec"] == {"cron": "*/5 * * * *", "tz": "UTC"} and shown["kwargs"] == {"a": 1}
    for args, says in (
        (("pause", "r"), "paused r"),
        (("run", "r"), "run of r requested"),
        (("run", "r"), "a run of r is already pending"),
        (("resume", "r", "--missed", "catch_up"), "resumed r (missed runs: catch_up)"),
        (("disable", "r"), "disabled r"),
        (("enable", "r"), "enabled r"),
        (("remove", "r"), "removed r"),
    ):
        done = cli(url, prefix, *args)
        assert done.exit_code == 0 and done.output.strip() == says, done.output
    assert json.loads(cli(url, prefix, "list", "--json").output) == []
    assert json.loads(cli(url, prefix, "history", "r", "--json").output) == []


def test_bad_input_is_one_line_and_changes_nothing(tmp_path: Path) -> None:
    url, prefix = f"sqlite:///{tmp_path}/e.db", unique_prefix()
    assert (
        CliRunner().invoke(election, ["--url", url, "--table-prefix", prefix, "install"]).exit_code
        == 0
    )
    assert cli(url, prefix, "add", "r", "p.r", "every 10s").exit_code == 0
    for args, says in (
        (("add", "x", "p.x", "*/5 * * 99 *"), "bad crontab '*/5 * * 99 *'"),
        (("add", "x", "p.x", "0 9 * * *", "--tz", "Mars/Base"), "unknown time zone"),
        (("add", "r", "p.r", "every 5s"), "schedule entry 'r' exists"),
        (("add", "x", "p.x", "every 5s", "--kwargs", "{nope"), "not JSON"),
        (("edit", "r", "--grace", "-1"), "grace must be a number >= 0"),
        (("edit", "nobody", "--grace", "1"), "no schedule entry 'nobody'"),
        (("pause", "nobody"), "no schedule entry 'nobody'"),
        (("edit", "r"), "nothing to change"),
    ):
        done = cli(url, prefix, *args)
        assert done.exit_code != 0, done.output
        errors = [line for line in done.output.splitlines() if line.startswith("Error:")]
        assert len(errors) == 1 and says in errors[0], done.output
        assert "Traceback" not in done.output
    shown = json.loads(cli(url, prefix, "show", "r", "--json").output)
    assert shown["spec"] == {"every": 10.0} and shown["policies"]["grace"] is None


def test_with_the_app_static_entries_and_task_names_are_known(tmp_path: Path) -> None:
    prefix = unique_prefix()
    (tmp_path / "proj.py").write_text(
        "from celery import Celery\n"
        "from celery_election import init_app\n"
        "app = Celery('proj', broker='memory://')\n"
        f"app.conf.update(election_url='sqlite:///{tmp_path}/e.db', "
        f"election_table_prefix='{prefix}', "
        "beat_schedule={'nightly': {'task': 'proj.nightly', 'schedule': 3600.0}})\n"
        "init_app(app)\n"
        "@app.task(name='proj.nightly')\n"
        "def nightly(): pass\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])}

    def celery(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "celery", "-A", "proj", "election", *args],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip

    assert celery("install").returncode == 0
    typo = celery("schedule", "add", "n2", "proj.nigthly", "every 1h")
    assert typo.returncode == 1 and "no task 'proj.nigthly' is registered" in typo.stderr
    assert celery("schedule", "add", "n2", "proj.nightly", "every 1h").returncode == 0
    assert celery("schedule", "pause", "nightly").returncode == 0  # a static entry's overlay
    static = celery("schedule", "remove", "nightly")
    assert static.returncode == 1 and "static beat_schedule entry" in static.stderr
    listed = json.loads(celery("schedule", "list", "--json").stdout)
    assert [(e["name"], e["static"], e["paused"]) for e in listed] == [
        ("n2", False, False),
        ("nightly", True, True),
    ]


def test_a_run_claimed_and_not_sent_is_shown_unsent(tmp_path: Path) -> None:
    """The run ledger's pending run (claimed, the broker has not taken it) in list and show."""
    from celery_election.backends import backend_from_url

    url, prefix = f"sqlite:///{tmp_path}/e.db", unique_prefix()
    backend = backend_from_url(url, table_prefix=prefix)
    backend.install()
    assert cli(url, prefix, "add", "r", "proj.report", "every 10s").exit_code == 0
    try:
        ns = "default-beat"  # the beats' namespace of the default settings
        me = uuid.uuid4().hex
        term = backend.elect(Bid(ns, me, "beat", 30.0)).lease.term
        assert claim_run(backend.beat, ns, me, term, "r", None, 1_000, pending=True).won
        row = cli(url, prefix, "list").output.splitlines()[1]
        assert "+unsent since" in row
        shown = json.loads(cli(url, prefix, "show", "r", "--json").output)
        assert shown["pending_since_us"] == by_entry(backend.beat.pending_runs(ns))["r"].claimed_us
        assert backend.runs.confirm(ns, [run_task_id(ns, "r", 1_000)]) == 1
        shown = json.loads(cli(url, prefix, "show", "r", "--json").output)
        assert shown["pending_since_us"] is None
        assert "+unsent" not in cli(url, prefix, "list").output
    finally:
        backend.close()
