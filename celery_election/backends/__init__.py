"""Backends: where the lease lives. ``backend_from_url`` picks one from a URL."""

from __future__ import annotations

import importlib
import logging
from typing import TYPE_CHECKING, Any

from ..core.config import without_celery_prefix
from ..errors import ConfigurationError, ElectionError
from .base import Backend
from .memory import MemoryBackend

if TYPE_CHECKING:  # loaded on first use: SQLAlchemy costs ~0.4 s to import
    from .postgres import PostgresBackend
    from .sql import SQLBackend

__all__ = [
    "Backend",
    "MemoryBackend",
    "PostgresBackend",
    "SQLBackend",
    "auto_install",
    "backend_from_url",
]

_SCHEMES = (
    "sqlite:///PATH, postgresql://... (postgresql+psycopg / +psycopg2), "
    "mysql://... (mysql+pymysql / +mysqldb), memory://"
)
# SQLAlchemy driver name -> (driver module, extra that installs it)
_MODULES: dict[str, tuple[str | None, str | None]] = {
    "sqlite": (None, None),
    "postgresql+psycopg": ("psycopg", "postgres"),
    "postgresql+psycopg2": ("psycopg2", "psycopg2"),
    "mysql+pymysql": ("pymysql", "mysql"),
    "mysql+mysqldb": ("MySQLdb", "mysqlclient"),
}
# scheme -> the drivers it may mean, the first one installed wins. A bare scheme means
# SQLAlchemy's default driver (psycopg2, mysqlclient) only when ours is missing: an
# install that has both keeps the driver it always used (psycopg 3 also waits
# cooperatively under gevent).
_DRIVERS: dict[str, tuple[str, ...]] = {
    "sqlite": ("sqlite",),
    "sqlite+pysqlite": ("sqlite",),
    "postgresql": ("postgresql+psycopg", "postgresql+psycopg2"),
    "postgres": ("postgresql+psycopg", "postgresql+psycopg2"),
    "postgresql+psycopg": ("postgresql+psycopg",),
    "postgresql+psycopg2": ("postgresql+psycopg2",),
    "mysql": ("mysql+pymysql", "mysql+mysqldb"),
    "mysql+pymysql": ("mysql+pymysql",),
    "mysql+mysqldb": ("mysql+mysqldb",),
    "mariadb": ("mysql+pymysql", "mysql+mysqldb"),
    "mariadb+pymysql": ("mysql+pymysql",),
    "mariadb+mysqldb": ("mysql+mysqldb",),
}
_PG_DRIVERS = ("postgresql+psycopg", "postgresql+psycopg2")


def driver_for(scheme: str) -> str:
    """The SQLAlchemy driver ``scheme`` resolves to here: its first one installed."""
    choices = _DRIVERS[scheme]
    for driver in choices:
        module = _MODULES[driver][0]
        if module is None:
            return driver
        try:  # importable, not just present: a broken build falls through to the next
            importlib.import_module(module)
        except ImportError:
            continue
        return driver
    wanted = " or ".join(
        f"{_MODULES[d][0]} (pip install 'celery-election[{_MODULES[d][1]}]')" for d in choices
    )
    raise ConfigurationError(f"{scheme}:// needs {wanted}")


def __getattr__(name: str) -> Any:
    if name == "PostgresBackend":
        from .postgres import PostgresBackend

        return PostgresBackend
    if name == "SQLBackend":
        from .sql import SQLBackend

        return SQLBackend
    raise AttributeError(name)


def backend_from_url(url: str, **options: Any) -> Backend:
    """Build the backend for ``url``; ``options`` go to the backend's constructor.

    Celery-style prefixes are accepted, so the app's own URLs work as they are:
    ``db+postgresql://...`` (result backend) and ``sqla+sqlite:///...`` (kombu broker).
    ``postgresql://`` means psycopg 3 if installed, else psycopg2; ``mysql://`` PyMySQL
    if installed, else mysqlclient. ``+psycopg2`` / ``+mysqldb`` name one.
    """
    if not isinstance(url, str) or "://" not in url:
        raise ConfigurationError(
            f"election_url must be a database URL like {_SCHEMES}: got {url!r}"
        )
    scheme, rest = without_celery_prefix(url).split("://", 1)
    scheme = scheme.lower()
    if scheme == "memory":
        # In-process only: table and connection options have no meaning there.
        kept = ("clock", "notify", "liveness")
        return MemoryBackend(**{k: v for k, v in options.items() if k in kept})
    if scheme not in _DRIVERS:
        hint = ""
        if scheme.startswith("postgres"):
            hint = " (celery_election talks to PostgreSQL through psycopg 3 or psycopg2)"
        elif scheme.startswith(("mysql", "mariadb")):
            hint = " (celery_election talks to MySQL/MariaDB through PyMySQL or mysqlclient)"
        raise ConfigurationError(
            f"unsupported election database URL scheme {scheme!r}{hint}; use one of: {_SCHEMES}"
        )
    driver = driver_for(scheme)
    normalised = f"{driver}://{rest}"
    if driver in _PG_DRIVERS:
        from .postgres import PostgresBackend

        return PostgresBackend(normalised, **options)
    from .sql import SQLBackend

    return SQLBackend(normalised, **options)


def auto_install(backend: Backend, who: logging.Logger) -> None:
    """``election_auto_install``: create missing tables, and say so (a worker or beat).

    Tables that appear in an unexpected database are how a wrong URL shows: the names
    and the database are logged at WARNING. A database that is down now is logged, not
    raised: the caller retries on its next SchemaMissingError.
    """
    try:
        created = backend.install()
    except ElectionError as exc:
        who.error("could not create the election tables yet (%s); will retry", exc)
        return
    if created:
        who.warning(
            "created tables %s in %s (election_auto_install)",
            ", ".join(created),
            backend.description,
        )
