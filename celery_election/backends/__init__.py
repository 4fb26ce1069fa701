"""Backends: where the lease lives. ``backend_from_url`` picks one from a URL."""

from __future__ import annotations

import importlib
import logging
from typing import TYPE_CHECKING, Any

from ..config import without_celery_prefix
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

_SCHEMES = "sqlite:///PATH, postgresql+psycopg://..., mysql+pymysql://..., memory://"
# scheme -> (normalised SQLAlchemy driver name, driver module, extra that installs it)
_DRIVERS: dict[str, tuple[str, str | None, str | None]] = {
    "sqlite": ("sqlite", None, None),
    "sqlite+pysqlite": ("sqlite", None, None),
    "postgresql": ("postgresql+psycopg", "psycopg", "postgres"),
    "postgres": ("postgresql+psycopg", "psycopg", "postgres"),
    "postgresql+psycopg": ("postgresql+psycopg", "psycopg", "postgres"),
    "mysql": ("mysql+pymysql", "pymysql", "mysql"),
    "mysql+pymysql": ("mysql+pymysql", "pymysql", "mysql"),
    "mariadb": ("mysql+pymysql", "pymysql", "mysql"),
    "mariadb+pymysql": ("mysql+pymysql", "pymysql", "mysql"),
}


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
    ``postgresql://`` means psycopg 3 and ``mysql://`` PyMySQL.
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
            hint = " (celery_election talks to PostgreSQL through psycopg 3: postgresql+psycopg)"
        elif scheme.startswith(("mysql", "mariadb")):
            hint = " (celery_election talks to MySQL/MariaDB through PyMySQL: mysql+pymysql)"
        raise ConfigurationError(
            f"unsupported election database URL scheme {scheme!r}{hint}; use one of: {_SCHEMES}"
        )
    driver, module, extra = _DRIVERS[scheme]
    if module is not None:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise ConfigurationError(
                f"{scheme}:// needs the {module} package: pip install 'celery-election[{extra}]'"
            ) from exc
    normalised = f"{driver}://{rest}"
    if driver == "postgresql+psycopg":
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
