"""init_app: the worker and beat options, the bootstep, idempotent and per app."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import click
from celery import Celery

from celery_election import init_app
from celery_election.integration.bootstep import ElectionStep

from ..support.apps import new_app
from ..support.celery_cli import REPO


def election_options(app: Celery) -> list[click.Option]:
    return [
        o
        for o in app.user_options["worker"]
        if isinstance(o, click.Option) and "--election" in o.opts
    ]


def beat_option(app: Celery, name: str) -> click.Option:
    """One of the ``celery beat`` options init_app adds (a set: no order)."""
    [option] = [
        o for o in app.user_options["beat"] if isinstance(o, click.Option) and o.name == name
    ]
    return option


def test_init_app_is_idempotent_and_returns_the_app() -> None:
    app = new_app()
    assert init_app(app) is app
    assert init_app(app) is app
    steps = [s for s in app.steps["worker"] if s is ElectionStep]
    assert len(steps) == 1
    assert len(election_options(app)) == 1
    names = [o.name for o in app.user_options["worker"] if isinstance(o, click.Option)]
    assert sorted(names) == [
        "election",
        "election_eligible",
        "election_metrics_port",
        "election_namespace",
    ]
    beat = [o.name for o in app.user_options["beat"] if isinstance(o, click.Option)]
    assert sorted(beat) == ["election_eligible", "election_metrics_port"]


def test_the_beat_metrics_port_option_sets_the_setting() -> None:
    """``celery beat`` hands its options to ``app.Beat``, which drops unknown ones."""
    app = init_app(new_app())
    option = beat_option(app, "election_metrics_port")
    ctx = click.Context(click.Command("beat"), obj=SimpleNamespace(app=app))
    assert option.callback is not None
    option.callback(ctx, option, None)
    assert app.conf.get("election_metrics_port") is None
    option.callback(ctx, option, 9809)
    assert app.conf.election_metrics_port == 9809


def test_the_beat_eligible_option_sets_the_setting() -> None:
    """``celery beat --no-election-eligible``: the LeaderScheduler reads the setting."""
    app = init_app(new_app())
    option = beat_option(app, "election_eligible")
    assert option.callback is not None
    ctx = click.Context(click.Command("beat"), obj=SimpleNamespace(app=app))
    option.callback(ctx, option, None)
    assert app.conf.get("election_eligible") is None
    option.callback(ctx, option, False)
    assert app.conf.election_eligible is False


def test_init_app_is_per_app() -> None:
    first, second = init_app(new_app()), new_app()
    assert len(election_options(first)) == 1
    assert election_options(second) == []
    assert ElectionStep not in second.steps["worker"]
    init_app(second)
    assert len(election_options(second)) == 1


def test_election_option_is_a_tristate_flag() -> None:
    (option,) = election_options(init_app(new_app()))
    assert option.opts == ["--election"]
    assert option.secondary_opts == ["--no-election"]
    assert option.default is None  # None: the election_enabled setting decides


def _worker_help(tmp_path: Path, module: str, with_election: bool) -> str:
    (tmp_path / f"{module}.py").write_text(
        textwrap.dedent(
            f"""
            from celery import Celery
            from celery_election import init_app

            app = Celery({module!r}, broker="memory://")
            if {with_election!r}:
                init_app(app)
                init_app(app)
            """
        )
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])}
    done = subprocess.run(
        [sys.executable, "-m", "celery", "-A", module, "worker", "--help"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _option_lines(text: str, flag: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip().startswith(flag)]


def test_worker_help_lists_the_options_and_leaves_e_and_b_alone(tmp_path: Path) -> None:
    with_election = _worker_help(tmp_path, "helpapp_on", True)
    without = _worker_help(tmp_path, "helpapp_off", False)
    assert "--election / --no-election" in with_election
    assert "--election-namespace" in with_election
    assert "--election" not in without
    # -E is --task-events and -B the embedded beat, with or without election.
    for flag in ("-E,", "-B,"):
        assert _option_lines(with_election, flag) == _option_lines(without, flag)
        assert len(_option_lines(with_election, flag)) == 1
    assert "--task-events" in _option_lines(with_election, "-E,")[0]
    assert "--beat" in _option_lines(with_election, "-B,")[0]
    # Each option is listed once although init_app ran twice.
    assert with_election.count("--election-namespace") == 1
    assert with_election.count("--election / --no-election") == 1
