"""Where the election database is: the default URL, and why a default would split hosts.

Read by ``settings`` (which validates the rest) and by the CLI and banners; never imports
Celery.
"""

from __future__ import annotations

import ipaddress
import os
from typing import Any
from urllib.parse import urlsplit

from .config import without_celery_prefix

__all__ = [
    "DEFAULT_SQLITE_FILE",
    "default_election_url",
    "hide_password",
    "is_postgres",
    "split_reason",
]

DEFAULT_SQLITE_FILE = "celery-election.sqlite3"


def is_postgres(url: str) -> bool:
    """Whether ``url`` (Celery prefixes allowed) names PostgreSQL: the only LISTEN backend."""
    return without_celery_prefix(url).startswith("postgres")


def default_election_url(app_or_conf: Any) -> tuple[str, str]:
    """(url, why): the database the app already has, or a SQLite file of its own."""
    conf = getattr(app_or_conf, "conf", app_or_conf)
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


#: Brokers and result backends that live on this host only (or ride on the broker: rpc).
_LOCAL_SCHEMES = {"memory", "filesystem", "file", "sqlite", "rpc", "disabled", "cache+memory"}


def split_reason(conf: Any, url: str, name: str) -> str | None:
    """Why the default SQLite ``url`` would split the election across hosts, or None.

    ``name``: ``election_url`` as this app spells it (its config namespace).
    """
    for setting in ("broker_url", "result_backend"):
        value = getattr(conf, setting, None)
        for part in value.split(";") if isinstance(value, str) else ():
            if _shared_across_hosts(part.strip()):
                path = url[len("sqlite:///") :]
                return (
                    f"{name} is not set and the {setting} ({hide_password(part.strip())}) is "
                    f"shared by other hosts, so each host would elect its own leader in "
                    f"{path}: set {name} to a PostgreSQL or MySQL URL every host reaches, or "
                    f"to sqlite:///{path} if this app runs on one host only"
                )
    return None


def _shared_across_hosts(url: str) -> bool:
    """Whether a broker or result backend URL names a server that other hosts can use."""
    if "://" not in url:
        return False
    scheme = without_celery_prefix(url).split("://", 1)[0].lower()
    if scheme in _LOCAL_SCHEMES or scheme.startswith("sqlite"):
        return False
    try:
        host = urlsplit(url).hostname
    except ValueError:
        return True
    if not host or host == "localhost":
        return False
    try:
        return not ipaddress.ip_address(host).is_loopback
    except ValueError:
        return True  # a host name


def hide_password(url: str) -> str:
    """``scheme://user:***@host/...``: a URL fit for a log line or a banner."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return url.rsplit("@", 1)[-1]
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return parts._replace(netloc=netloc).geturl()
