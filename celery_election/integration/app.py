"""``init_app(app)``: the worker options, the bootstep and the remote control commands.

The ``election_*`` settings are defined, read and validated in ``settings.py`` (the
docs' Settings page renders its table from that one definition).
"""

from __future__ import annotations

from typing import Any

import click
from celery import Celery

from ..settings import ElectionSettings, default_election_url, is_postgres, leader_queue_name

__all__ = [
    "ElectionSettings",
    "default_election_url",
    "init_app",
    "is_postgres",
    "leader_queue_name",
]


def init_app(app: Celery) -> Celery:
    """Add leader election to a Celery app (idempotent); returns the app.

    Registers the worker options ``--election/--no-election``, ``--election-namespace``,
    ``--election-eligible/--no-election-eligible`` and ``--election-metrics-port`` (the
    last two also ``celery beat`` options), the worker bootstep,
    the remote control commands (``celery inspect election``, ``celery control
    election_resign``), and the router that sends leader tasks to the leader queue
    however they are sent.
    """
    if getattr(app, "_celery_election_initialized", False):
        return app
    from . import control  # noqa: F401  (registers the remote control commands)
    from .bootstep import ElectionStep

    _add_options(app)
    app.steps["worker"].add(ElectionStep)
    _route_leader_tasks(app)
    _warn_unchecked()
    app._celery_election_initialized = True
    return app


def _add_options(app: Celery) -> None:
    """The ``celery worker`` and ``celery beat`` options of the election."""
    app.user_options["worker"] |= {
        click.Option(
            ["--election/--no-election"],
            default=None,
            help="Run a leader elector in this worker (default: the election_enabled "
            "setting). Not -E: that is --task-events.",
        ),
        click.Option(
            ["--election-namespace"],
            default=None,
            help="Election namespace: workers of one namespace elect one leader "
            "(default: the election_namespace setting, or 'default').",
        ),
        click.Option(
            ["--election-eligible/--no-election-eligible"],
            default=None,
            help="Whether this worker may lead (default: the election_eligible setting, "
            "True). An ineligible worker takes part and is listed, but never leads.",
        ),
        click.Option(
            ["--election-metrics-port"],
            type=int,
            default=None,
            help="Serve /metrics, /healthz and /readyz on this port (default: the "
            "election_metrics_port setting; needs celery-election[metrics]).",
        ),
    }
    # ``celery beat`` hands unknown options to ``app.Beat``, which drops them: the option
    # sets its setting instead (``_set_beat_setting``), which the LeaderScheduler reads.
    app.user_options["beat"] |= {
        click.Option(
            ["--election-metrics-port"],
            type=int,
            default=None,
            expose_value=False,
            callback=_set_beat_setting,
            help="LeaderScheduler: serve /metrics, /healthz and /readyz on this port "
            "(default: the election_metrics_port setting; needs celery-election[metrics]).",
        ),
        click.Option(
            ["--election-eligible/--no-election-eligible"],
            default=None,
            expose_value=False,
            callback=_set_beat_setting,
            help="LeaderScheduler: whether this beat may lead (default: the "
            "election_eligible setting, True).",
        ),
    }


def _warn_unchecked() -> None:
    """A beat run reaching a task no run-once check guards says so (``once.warn_unchecked``).

    The check (``--election``) also ends the run's row: without it the run runs twice if
    sent twice, and the overlap policy and the overdue alarm never see it end.
    """
    from celery.signals import task_prerun

    from ..runs.once import warn_unchecked

    task_prerun.connect(warn_unchecked, weak=False, dispatch_uid="celery_election.unchecked")


def _set_beat_setting(ctx: click.Context, param: click.Parameter, value: Any) -> None:
    """Make a ``celery beat`` option its setting (``param.name``), checked with the others."""
    if value is not None:
        setattr(ctx.find_root().obj.app.conf, str(param.name), value)


def _route_leader_tasks(app: Celery) -> None:
    """Install the LeaderRouter once the app's configuration is loaded.

    Reading ``app.conf`` now would load the configuration before a later
    ``config_from_object`` could, so an app not configured yet gets it on configuration.
    """
    from .tasks import install_router

    if app.configured:
        install_router(app)
    else:
        app.on_after_configure.connect(lambda sender, **kw: install_router(sender), weak=False)
