"""Every ``election_*`` setting, defined, parsed and validated in this one place.

``SETTINGS`` is the one definition: the docs' Settings page renders its table from it when
the site is built (docs/hooks/settings_table.py, checked by tests/unit/test_docs.py), and
nothing else in the package reads an ``election_*`` key from ``app.conf``.
``ElectionSettings.from_app(app)`` reads them all once per app (cached on the app, and
read again only when an ``election_*`` value changes, as redbeat's ``ensure_conf``
caches its config) and raises one ConfigurationError that lists every problem. An
``election_*`` key that is not a setting (a typo) is logged once with the nearest names.

This module reads a Celery app's ``conf`` but never imports Celery: the worker, the beat,
the tasks and the CLI all come here.
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .backends.schema import DEFAULT_TABLE_PREFIX, validate_table_prefix
from .core.config import ElectionConfig, _seconds, validate_namespace
from .core.url import default_election_url, hide_password, is_postgres, split_reason
from .errors import ConfigurationError

__all__ = [
    "RETIRED",
    "SETTINGS",
    "ElectionSettings",
    "Setting",
    "default_election_url",
    "hide_password",
    "is_postgres",
    "leader_queue_name",
]

log = logging.getLogger("celery_election.settings")

_PREFIX = "election_"


@dataclass(frozen=True)
class Setting:
    """One ``election_*`` setting as the docs' Settings page documents it."""

    name: str
    default: str
    meaning: str
    #: The Elector argument it maps to (the timings), if any.
    argument: str | None = None


_TIMINGS: dict[str, tuple[str, str]] = {
    "ttl": ("10 s", "lease length; without liveness, crash failover takes about this long"),
    "renew_interval": ("0.4 x ttl", "how often the leader renews"),
    "poll_interval": (
        "min(1 s, renew)",
        "follower retry without wakeups: bounds clean handoff off PostgreSQL",
    ),
    "safety_margin": (
        "max(ttl/5, min(1 s, ttl/4))",
        "the leader stops trusting its lease this long before it ends",
    ),
    "call_timeout": (
        "renew_interval",
        "deadline of one database call; a stalled connection is cut",
    ),
    "resign_backoff": ("ttl", "after `resign()`, stay out this long"),
    "candidate_ttl": (
        "3 x fallback",
        "a candidate is listed this long after its heartbeat (a follower's goes with its look)",
    ),
    "fallback_interval": (
        "max(60 s, ttl)",
        "with NOTIFY, or waiting on a server's lock, a follower still reads the row this often",
    ),
    "jitter": ("0.1", "each wait varies by up to this fraction"),
    "liveness": (
        "min(1 s, (ttl - margin)/4)",
        "liveness session delta (`False`: off): failover about delta after a crash, "
        "2 delta after a pause or cut link",
    ),
    "standbys": (
        "2",
        "with liveness, followers that wait on the lock (one connection each); the "
        "others hold none and try for a slot once per `election_fallback_interval`",
    ),
}

#: Every setting, in the order of the docs' Settings page.
SETTINGS: tuple[Setting, ...] = (
    Setting(
        "election_url",
        "the app's `db+`/`sqla+` PostgreSQL or MySQL URL, else `./celery-election.sqlite3` "
        "(refused where the broker or result backend is shared by other hosts)",
        "the election database (never the broker's SQLite file)",
    ),
    Setting("election_namespace", "`default`", "who competes with whom"),
    Setting("election_enabled", "`False`", "run an elector in every worker without `--election`"),
    Setting(
        "election_eligible",
        "`True`",
        "this process may lead (`False`, `--no-election-eligible`: it takes part and is "
        "listed, but never takes a term)",
    ),
    Setting(
        "election_release",
        "the package's version",
        "the release this process registers; while one of a newer release lives, an older "
        "one leaves a vacant term to it (for up to `election_ttl`)",
    ),
    *(
        Setting(_PREFIX + name, default, meaning, argument=name)
        for name, (default, meaning) in _TIMINGS.items()
    ),
    Setting("election_table_prefix", f"`{DEFAULT_TABLE_PREFIX}`", "table names"),
    Setting("election_auto_install", "`True`", "workers and beats create missing tables"),
    Setting(
        "election_listen",
        "`True`",
        "PostgreSQL LISTEN for wakeups (off behind PgBouncer in transaction mode)",
    ),
    Setting(
        "election_direct_url",
        "-",
        "a URL that reaches the database directly, for the liveness lock and LISTEN when "
        "`election_url` leads through a transaction pooler (PgBouncer)",
    ),
    Setting("election_listen_url", "-", "PostgreSQL: LISTEN through this (direct) URL"),
    Setting("election_leader_queue", "`election-leader.<namespace>`", "the leader-only queue"),
    Setting("election_beat_namespace", "`<namespace>-beat`", "standalone beats' election"),
    Setting(
        "election_beat_publishers",
        "`0`",
        "processes the leading beat forks to publish a burst's sends while it readies the "
        "next batch (`0`: it sends them itself); for thousands of entries due at once",
    ),
    Setting(
        "election_history_file",
        "-",
        "append every trust change, transition and beat send here (JSON lines; "
        "the repository's `harness/checker.py` checks them)",
    ),
    Setting(
        "election_schedule_retention",
        "`30` (days)",
        "keep the beat runs' rows, the schedule's history, this long (`election schedule "
        "history`); the leading beat prunes them",
    ),
    Setting(
        "election_beat_overdue_grace",
        "`300` (s)",
        "a beat entry is overdue once its run is unsent or unfinished this long after it fell due "
        "(or one period of the entry, if shorter): `celery_election_beat_entry_overdue_seconds`",
    ),
    Setting(
        "election_run_once_retention",
        "`86400` (s)",
        "keep each task run's row (run once) this long: a delivery of the run later "
        "than that runs it again; older ones are pruned by the workers, in batches "
        "(a beat run's row: `election_schedule_retention`)",
    ),
    Setting(
        "election_metrics_port",
        "-",
        "serve /metrics, /healthz and /readyz on this port (worker main process, "
        "standalone beat; needs `celery-election[metrics]`)",
    ),
)

#: Settings of earlier versions, with what happens now instead (logged when set).
RETIRED: dict[str, str] = {
    "election_beat_missed": "a run missed during a failover is caught up once, as Celery "
    "does after a restart (beat_cron_starting_deadline applies)",
    "election_beat_resend_unconfirmed": "a run claimed by a leader that died before "
    "sending is not resent (at most once)",
    "election_beat_ledger_retention": "the shared beat state is one row per entry",
}

_NAMES = tuple(s.name for s in SETTINGS)
_KNOWN = set(_NAMES)
_CACHE = "_celery_election_settings"
_WARNED = "_celery_election_warned"
_SPELLINGS: dict[str | None, tuple[str, ...]] = {}


def leader_queue_name(namespace: str) -> str:
    """The default leader-only queue of a namespace."""
    return f"election-leader.{namespace}"


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
    #: Standalone beats elect here (an embedded beat shares its worker's namespace).
    beat_namespace: str = ""
    #: Append every trust change and beat send here (history.Recorder), or None.
    history_file: str | None = None
    #: Serve /metrics, /healthz and /readyz here (celery_election.metrics), or None.
    metrics_port: int | None = None
    #: Days of run history the leading beat keeps (celery_election.schedule).
    schedule_retention: float = 30.0
    #: Publisher processes a leading beat sends a burst through (beat.publish), or 0.
    beat_publishers: int = 0
    #: At most this long after an entry fell due its run is sent and finished (schedule.overdue).
    beat_overdue_grace: float = 300.0
    #: Seconds a run's row is kept (runonce.RunGuard prunes older ones).
    run_once_retention: float = 86400.0
    #: Why this default election would split across hosts (see ``refuse_split``), or None.
    split: str | None = None
    #: Session state (liveness lock, LISTEN) goes here when ``url`` leads to a pooler.
    direct_url: str | None = None
    #: This process may take a term (else it follows only: ``--no-election-eligible``).
    eligible: bool = True
    #: The release it registers (None: the package's version).
    release: str | None = None

    @classmethod
    def from_app(
        cls,
        app: Any,
        *,
        enabled: bool | None = None,
        namespace: str | None = None,
        metrics_port: int | None = None,
        eligible: bool | None = None,
    ) -> ElectionSettings:
        """The app's settings, read once; command-line values win over ``app.conf``.

        Read through Celery's own lookup (``conf.get``), so every layout Celery accepts
        works: ``config_from_object(..., namespace="CELERY")`` reads
        ``CELERY_ELECTION_URL``. The cache is checked against the election values set on
        ``conf`` since (a handful of dict lookups, not a scan of every setting): a
        configuration source is read once, as Celery's loaders read it.
        """
        conf = app.conf
        stamp = _stamp(conf)
        cached = app.__dict__.get(_CACHE)
        if cached is None or cached[0] != stamp:
            values = read_values(conf)
            _warn_unknown(app, conf)
            parsed = cls._parse(conf, values)
            # stamped after reading: the first read may load a pending configuration
            cached = (_stamp(conf), parsed)
            app.__dict__[_CACHE] = cached
        settings: ElectionSettings = cached[1]
        given = {
            "election_enabled": enabled,
            "election_namespace": namespace,
            "election_metrics_port": metrics_port,
            "election_eligible": eligible,
        }
        if all(value is None for value in given.values()):
            return settings
        values = read_values(conf)
        values.update((name, value) for name, value in given.items() if value is not None)
        return cls._parse(conf, values)

    @classmethod
    def _parse(cls, conf: Any, values: Mapping[str, Any]) -> ElectionSettings:
        """Check every setting; one ConfigurationError with every problem."""
        read = _Reader(values)
        url, source, split = _election_url(conf, read)
        # None means "not set"; an empty string is a mistake, not "default"
        chosen = values.get("election_namespace")
        ns = read.check(validate_namespace, "default" if chosen is None else chosen, "default")
        prefix = values.get("election_table_prefix")
        prefix = DEFAULT_TABLE_PREFIX if prefix is None else prefix
        table_prefix = read.check(validate_table_prefix, prefix, DEFAULT_TABLE_PREFIX)
        beat_ns = values.get("election_beat_namespace")
        beat_namespace = read.check(
            validate_namespace, f"{ns}-beat" if beat_ns is None else beat_ns, f"{ns}-beat"
        )
        config = read.check(ElectionConfig.from_settings, values, None)
        auto_install = read.flag("election_auto_install", True)
        listen = read.flag("election_listen", True)
        on = read.flag("election_enabled", False)
        eligible, release = read.flag("election_eligible", True), read.text("election_release")
        listen_url = read.text("election_listen_url")
        direct_url = read.text("election_direct_url")
        leader_queue = read.text("election_leader_queue") or leader_queue_name(ns)
        history_file = read.text("election_history_file")
        metrics_port = read.metrics_port()
        retention = read.retention()
        publishers = read.count("election_beat_publishers", 0, most=16)
        overdue_grace = read.seconds("election_beat_overdue_grace", 300.0)
        run_once_retention = read.seconds("election_run_once_retention", 86400.0)
        if read.problems:  # every problem at once
            raise ConfigurationError(read.problems)
        return cls(
            url=url,
            url_source=source,
            namespace=ns,
            enabled=on,
            table_prefix=table_prefix,
            auto_install=auto_install,
            listen=listen,
            listen_url=listen_url,
            leader_queue=leader_queue,
            config=config,
            beat_namespace=beat_namespace,
            history_file=history_file,
            metrics_port=metrics_port,
            schedule_retention=retention,
            beat_publishers=publishers,
            beat_overdue_grace=overdue_grace,
            run_once_retention=run_once_retention,
            split=split,
            direct_url=direct_url,
            eligible=eligible,
            release=release,
        )

    def refuse_split(self) -> None:
        """Raise ConfigurationError where hosts would each hold an election of their own.

        Workers and beats call it before they campaign: with no ``election_url`` and a
        broker or result backend that other hosts share, the default SQLite file would give
        every host its own leader. The demo and single-host setups (a local broker, or a
        SQLite ``election_url`` the user chose) are not refused.
        """
        if self.split is not None:
            raise ConfigurationError(self.split)

    def backend_options(self, *, listen: bool | None = None) -> dict[str, Any]:
        """Constructor options for backend_from_url; ``listen=False`` for one-shot users."""
        options: dict[str, Any] = {"table_prefix": self.table_prefix}
        if self.direct_url and not self.url.startswith(("memory:", "sqlite:")):
            options["direct_url"] = self.direct_url
        if is_postgres(self.url):
            options["listen"] = self.listen if listen is None else listen
            if self.listen_url:
                options["listen_url"] = self.listen_url
        return options


def _election_url(conf: Any, read: _Reader) -> tuple[str, str, str | None]:
    """The election URL, the setting it came from, and why hosts may split (the default)."""
    url = read.text("election_url")
    if url is not None:
        return url, "election_url", None
    url, source = default_election_url(conf)
    split = None
    if url.startswith("sqlite:///"):  # a file of its own: this host only
        split = split_reason(conf, url, spelling("election_url", _prefix(conf)))
    return url, source, split


class _Reader:
    """Reads the ``election_*`` values and collects every problem, to raise them at once."""

    def __init__(self, values: Mapping[str, Any]) -> None:
        self.values = values
        self.problems: list[str] = []

    def text(self, key: str) -> str | None:
        value = self.values.get(key)
        if value is None:
            return None
        if not isinstance(value, str) or not value:
            self.problems.append(f"{key} must be a non-empty string: got {value!r}")
            return None
        return value

    def flag(self, key: str, default: bool) -> bool:
        value = self.values.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            self.problems.append(f"{key} must be True or False: got {value!r}")
            return default
        return value

    def check(self, fn: Any, value: Any, default: Any) -> Any:
        try:
            return fn(value)
        except ConfigurationError as exc:
            self.problems.extend(exc.problems)
            return default

    def metrics_port(self) -> int | None:
        port = self.values.get("election_metrics_port")
        if port is None:
            return None
        if isinstance(port, bool) or not isinstance(port, int) or not (0 <= port <= 65535):
            self.problems.append(f"election_metrics_port must be a port number: got {port!r}")
            return None
        self.check(_require_metrics_client, None, None)
        return port

    def count(self, name: str, default: int, *, most: int) -> int:
        value = self.values.get(name)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int) or not (0 <= value <= most):
            self.problems.append(f"{name} must be a whole number from 0 to {most}: got {value!r}")
            return default
        return value

    def seconds(self, key: str, default: float) -> float:
        value = self.values.get(key)
        got = None if value is None else _seconds(key[len(_PREFIX) :], value, self.problems)
        return default if got is None else got

    def retention(self) -> float:
        days = self.values.get("election_schedule_retention")
        if days is None:
            return 30.0
        if isinstance(days, bool) or not isinstance(days, (int, float)) or days <= 0:
            self.problems.append(
                f"election_schedule_retention must be a number of days > 0: got {days!r}"
            )
            return 30.0
        return float(days)


def _require_metrics_client(_: object) -> None:
    from .metrics import require_client

    require_client()


def spelling(name: str, prefix: str | None) -> str:
    """How a setting is written under a config namespace (Celery's ``match_case``)."""
    if not prefix:
        return name
    key = prefix + name
    return key.upper() if prefix.isupper() else key


def _prefix(conf: Any) -> str | None:
    prefix = getattr(conf, "prefix", None)
    return prefix if isinstance(prefix, str) and prefix else None


def read_values(conf: Any) -> dict[str, Any]:
    """Every election setting that is set, by its canonical name, as Celery looks it up.

    ``conf.get`` tries the namespaced spelling (``CELERY_ELECTION_URL``) and then the
    plain one, exactly as Celery reads its own settings.
    """
    values = {}
    for name in _NAMES:
        value = conf.get(name)
        if value is not None:
            values[name] = value
    return values


def _stamp(conf: Any) -> tuple[Any, ...]:
    """What invalidates the cache: the config maps, and election values set on conf since.

    ``conf.x = y`` and ``conf.update`` write to ``conf.changes`` under the name given,
    plain or namespaced; ``config_from_object`` swaps the maps.
    """
    changes = conf.changes
    keys = _spellings(_prefix(conf))
    return (*map(id, conf.maps), *map(changes.get, keys))


def _spellings(prefix: str | None) -> tuple[str, ...]:
    cached = _SPELLINGS.get(prefix)
    if cached is None:
        cached = _NAMES + tuple(spelling(n, prefix) for n in _NAMES if prefix)
        _SPELLINGS[prefix] = cached
    return cached


def _warn_unknown(app: Any, conf: Any) -> None:
    """Name every election-looking key Celery will not read for us, once per app.

    A typo (``CELERY_ELECTION_TLL``), a retired setting, or a real name spelt so that
    Celery's lookup misses it (``ELECTION_URL`` under ``namespace="CELERY"``).
    """
    prefix = _prefix(conf)
    read = {spelling(n, prefix): n for n in _NAMES} | {n: n for n in _NAMES}
    warned: set[str] = app.__dict__.setdefault(_WARNED, set())
    for key in sorted(k for k in conf if isinstance(k, str)):
        if key in read or key in warned:
            continue
        bare = key
        if prefix and bare.upper().startswith(prefix.upper()):
            bare = bare[len(prefix) :]
        bare = bare.lower()
        if not bare.startswith(_PREFIX):
            continue
        warned.add(key)
        if bare in RETIRED:
            log.warning("%s is no longer used: %s", key, RETIRED[bare])
        elif bare in _KNOWN:
            log.warning(
                "%s is not read (config namespace %r): write %s; it is ignored",
                key,
                (prefix or "").rstrip("_") or None,
                spelling(bare, prefix),
            )
        else:
            near = difflib.get_close_matches(bare, _NAMES, n=3)
            hint = (
                "did you mean " + " or ".join(spelling(n, prefix) for n in near) + "?"
                if near
                else "see the settings in the docs, docs/settings.md"
            )
            log.warning("%s is not a celery-election setting (%s); it is ignored", key, hint)


def settings_table() -> str:
    """The docs' settings table (docs/settings.md), rendered from ``SETTINGS``."""
    rows = [
        "| setting (`app.conf`) / Elector argument | default | meaning |",
        "| --- | --- | --- |",
    ]
    for s in SETTINGS:
        name = f"`{s.name}` / `{s.argument}`" if s.argument else f"`{s.name}`"
        rows.append(f"| {name} | {s.default} | {s.meaning} |")
    return "\n".join(rows)
