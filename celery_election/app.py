"""``init_app(app)``: the ``election_*`` settings, the worker options, the bootstep.

Settings (all optional, read from ``app.conf`` when the worker starts):

=========================  ===============================================================
election_url               the election database; default below
election_namespace         who competes with whom (default "default")
election_enabled           run an elector in every worker without ``--election`` (False)
election_table_prefix      table name prefix (default "celery_election_")
election_auto_install      create the tables when missing (default True)
election_listen            PostgreSQL: LISTEN for wakeups (default True)
election_listen_url        PostgreSQL: LISTEN through this URL (e.g. past PgBouncer)
election_leader_queue      the leader-only queue (default "election-leader.<namespace>")
election_ttl ...           timings: see ElectionConfig
=========================  ===============================================================

Default ``election_url``: the app's ``db+`` result backend or ``sqla+`` broker URL when it
is PostgreSQL or MySQL (the database the app already has); otherwise a SQLite file of its
own in the working directory, never the broker's file (a broker write lock stalled
renewals for the whole busy timeout), with a warning that it elects within one host only.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

import click
from celery import Celery

from .backends.sql import DEFAULT_TABLE_PREFIX
from .config import ElectionConfig, validate_namespace
from .errors import ConfigurationError

__all__ = ["ElectionSettings", "default_election_url", "init_app", "leader_queue_name"]

log = logging.getLogger(__name__)

DEFAULT_SQLITE_FILE = "celery-election.sqlite3"


def leader_queue_name(namespace: str) -> str:
    """The default leader-only queue of a namespace."""
    return f"election-leader.{namespace}"


def default_election_url(app: Celery) -> tuple[str, str]:
    """(url, why): the database the app already has, or a SQLite file of its own."""
    conf = app.conf
    taken = set()
    for setting, prefix in (("result_backend", "db+"), ("broker_url", "sqla+")):
        # attributes, not conf.get(): they honour CELERY_RESULT_BACKEND/CELERY_BROKER_URL
        url = getattr(conf, setting, None)
        if isinstance(url, str) and url.startswith(prefix):
            rest = url[len(prefix) :]
            if rest.startswith(("postgresql", "postgres", "mysql", "mariadb")):
                return rest, f"the app's {setting}"
            if rest.startswith("sqlite:///"):
                taken.add(os.path.abspath(rest[len("sqlite:///") :]))
    # never the broker's or result backend's SQLite file (a broker write lock stalled
    # renewals for the whole busy timeout)
    stem, ext = os.path.splitext(DEFAULT_SQLITE_FILE)
    path = os.path.abspath(DEFAULT_SQLITE_FILE)
    n = 1
    while path in taken:
        path = os.path.abspath(f"{stem}-{n}{ext}")
        n += 1
    return f"sqlite:///{path}", "a SQLite file of its own (elects within this host only)"


@dataclass(frozen=True)
class ElectionSettings:
    """The ``election_*`` settings of an app, validated."""

    url: str
    url_source: str
    namespace: str
    enabled: bool
    table_prefix: str
    auto_install: bool
    listen: bool
    listen_url: str | None
    leader_queue: str
    config: ElectionConfig
    #: Append every trust change and beat send here (celery_election.history), or None.
    history_file: str | None = None

    @classmethod
    def from_app(
        cls, app: Celery, *, enabled: bool | None = None, namespace: str | None = None
    ) -> ElectionSettings:
        """Read and check the settings; command-line values win over ``app.conf``."""
        conf = app.conf
        url = conf.get("election_url")
        source = "election_url"
        if not url:
            url, source = default_election_url(app)
        problems: list[str] = []
        ns = "default"
        try:  # None means "not set"; an empty string is a mistake, not "default"
            chosen = namespace if namespace is not None else conf.get("election_namespace")
            ns = validate_namespace("default" if chosen is None else chosen)
        except ConfigurationError as exc:
            problems += exc.problems
        for key in ("election_enabled", "election_auto_install", "election_listen"):
            value = conf.get(key)
            if value is not None and not isinstance(value, bool):
                problems.append(f"{key} must be True or False: got {value!r}")
        try:
            config = ElectionConfig.from_settings(conf)
        except ConfigurationError as exc:
            problems += exc.problems
        if problems:  # every problem at once
            raise ConfigurationError(problems)
        return cls(
            url=url,
            url_source=source,
            namespace=ns,
            enabled=bool(conf.get("election_enabled", False) if enabled is None else enabled),
            table_prefix=conf.get("election_table_prefix") or DEFAULT_TABLE_PREFIX,
            auto_install=conf.get("election_auto_install", True) is not False,
            listen=conf.get("election_listen", True) is not False,
            listen_url=conf.get("election_listen_url"),
            leader_queue=conf.get("election_leader_queue") or leader_queue_name(ns),
            config=config,
            history_file=conf.get("election_history_file") or None,
        )

    def backend_options(self, *, listen: bool | None = None) -> dict[str, Any]:
        """Constructor options for backend_from_url; ``listen=False`` for one-shot users."""
        options: dict[str, Any] = {"table_prefix": self.table_prefix}
        if is_postgres(self.url):
            options["listen"] = self.listen if listen is None else listen
            if self.listen_url:
                options["listen_url"] = self.listen_url
        return options


def is_postgres(url: str) -> bool:
    """Whether ``url`` (Celery prefixes allowed) names PostgreSQL: the only LISTEN backend."""
    scheme = url.split(":", 1)[0]
    for prefix in ("db+", "sqla+"):
        scheme = scheme.removeprefix(prefix)
    return scheme.startswith("postgres")


def init_app(app: Celery) -> Celery:
    """Add leader election to a Celery app (idempotent); returns the app.

    Registers the worker options ``--election/--no-election`` and
    ``--election-namespace``, the worker bootstep, and the remote control commands
    (``celery inspect election``, ``celery control election_resign``).
    """
    if getattr(app, "_celery_election_initialized", False):
        return app
    from . import control  # noqa: F401  (registers the remote control commands)
    from .bootstep import ElectionStep

    app.user_options["worker"].add(
        click.Option(
            ["--election/--no-election"],
            default=None,
            help="Run a leader elector in this worker (default: the election_enabled "
            "setting). Not -E: that is --task-events.",
        )
    )
    app.user_options["worker"].add(
        click.Option(
            ["--election-namespace"],
            default=None,
            help="Election namespace: workers of one namespace elect one leader "
            "(default: the election_namespace setting, or 'default').",
        )
    )
    app.steps["worker"].add(ElectionStep)
    app._celery_election_initialized = True
    return app
