"""Find the real servers the tests use, or start a throwaway PostgreSQL.

URLs come from CELERY_ELECTION_TEST_PG_URL / _MYSQL_URL / _AMQP_URL, defaulting to the
loopback servers of the dev/CI machine. A server that cannot be reached is skipped, with
one loud line in the summary, unless CELERY_ELECTION_REQUIRE_SERVICES=1 (CI), where it
fails the run. With no PostgreSQL reachable but its binaries installed, a throwaway
cluster is started for the session.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field

import sqlalchemy as sa

PG_DEFAULT = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
MYSQL_DEFAULT = "mysql+pymysql://root@127.0.0.1:3306/test"
AMQP_DEFAULT = "amqp://guest:guest@127.0.0.1:5672//"
#: a database number of its own: the machine's Redis may serve others
REDIS_DEFAULT = "redis://127.0.0.1:6379/11"
#: PgBouncer in front of the loopback PostgreSQL (scripts/services-up starts both).
PGBOUNCER_DEFAULTS = {
    "pgbouncer-transaction": "postgresql+psycopg://postgres@127.0.0.1:6432/test",
    "pgbouncer-session": "postgresql+psycopg://postgres@127.0.0.1:6433/test",
}

REQUIRE = os.environ.get("CELERY_ELECTION_REQUIRE_SERVICES") == "1"
#: The other drivers of each server: kind -> (server kind, SQLAlchemy driver, module).
#: Their URLs are the server's with the driver swapped (CELERY_ELECTION_TEST_*_URL).
DRIVERS = {
    "postgresql+psycopg2": ("postgresql", "postgresql+psycopg2", "psycopg2"),
    "mysql+mysqldb": ("mysql", "mysql+mysqldb", "MySQLdb"),
}


def with_driver(url: str, driver: str) -> str:
    """``url`` through another SQLAlchemy driver (password kept)."""
    return sa.make_url(url).set(drivername=driver).render_as_string(hide_password=False)


def reachable(url: str) -> str | None:
    """None if the database answers, else why not."""
    engine = sa.create_engine(url, connect_args={"connect_timeout": 3}, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))
        return None
    except Exception as exc:
        return f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
    finally:
        engine.dispose()


def broker_reachable(url: str) -> str | None:
    """None if a broker (AMQP, Redis) accepts a connection at ``url``, else why not."""
    from kombu import Connection

    try:
        with Connection(url, connect_timeout=3) as conn:
            conn.ensure_connection(max_retries=1)
        return None
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"


@dataclass
class Services:
    urls: dict[str, str | None] = field(default_factory=dict)
    missing: dict[str, str] = field(default_factory=dict)
    throwaway: ThrowawayPostgres | None = None

    def close(self) -> None:
        if self.throwaway is not None:
            self.throwaway.stop()


class ThrowawayPostgres:
    """A PostgreSQL cluster in a temp dir, run as the postgres user when we are root."""

    def __init__(self, bindir: str) -> None:
        self.bindir = bindir
        self.dir = tempfile.mkdtemp(prefix="celery-election-pg-")
        self.data = os.path.join(self.dir, "data")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.as_user: list[str] = []
        if os.geteuid() == 0:  # initdb refuses root
            shutil.chown(self.dir, "postgres", "postgres")
            self.as_user = ["runuser", "-u", "postgres", "--"]

    def _run(self, *args: str) -> None:
        subprocess.run(self.as_user + list(args), check=True, capture_output=True, timeout=60)

    def start(self) -> str:
        self._run(f"{self.bindir}/initdb", "-D", self.data, "-U", "postgres", "-A", "trust")
        self._run(
            f"{self.bindir}/pg_ctl",
            "-D",
            self.data,
            "-w",
            "-l",
            f"{self.dir}/log",
            "-o",
            f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1",
            "start",
        )
        url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"
        deadline = time.monotonic() + 20
        while reachable(url) is not None:
            if time.monotonic() > deadline:
                raise RuntimeError(f"throwaway PostgreSQL did not start: see {self.dir}/log")
            time.sleep(0.1)
        return url

    def stop(self) -> None:
        subprocess.run(
            [*self.as_user, f"{self.bindir}/pg_ctl", "-D", self.data, "-m", "immediate", "stop"],
            capture_output=True,
            timeout=60,
        )
        shutil.rmtree(self.dir, ignore_errors=True)


def discover() -> Services:
    services = Services()
    pg = os.environ.get("CELERY_ELECTION_TEST_PG_URL", PG_DEFAULT)
    why = reachable(pg)
    if why is not None and not REQUIRE:
        bins = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
        if bins:
            try:
                services.throwaway = ThrowawayPostgres(os.path.dirname(bins[-1]))
                pg, why = services.throwaway.start(), None
            except Exception as exc:
                why = f"{why}; throwaway PostgreSQL failed too: {exc}"
    services.urls["postgresql"] = pg if why is None else None
    if why is not None:
        services.missing["postgresql"] = f"{pg}: {why}"
    amqp = os.environ.get("CELERY_ELECTION_TEST_AMQP_URL", AMQP_DEFAULT)
    why = broker_reachable(amqp)
    services.urls["amqp"] = amqp if why is None else None
    if why is not None:
        services.missing["amqp"] = f"{amqp}: {why}"
    for name, default in PGBOUNCER_DEFAULTS.items():
        env = "CELERY_ELECTION_TEST_" + name.upper().replace("-", "_") + "_URL"
        url = os.environ.get(env, default)
        why = reachable(url)
        services.urls[name] = url if why is None else None
        if why is not None:
            services.missing[name] = f"{url}: {why} (scripts/services-up starts it)"
    redis = os.environ.get("CELERY_ELECTION_TEST_REDIS_URL", REDIS_DEFAULT)
    why = broker_reachable(redis)
    services.urls["redis"] = redis if why is None else None
    if why is not None:
        services.missing["redis"] = f"{redis}: {why} (scripts/services-up starts it)"
    mysql = os.environ.get("CELERY_ELECTION_TEST_MYSQL_URL", MYSQL_DEFAULT)
    why = reachable(mysql)
    services.urls["mysql"] = mysql if why is None else None
    if why is not None:
        services.missing["mysql"] = f"{mysql}: {why}"
    for kind, (server, driver, module) in DRIVERS.items():
        base = services.urls.get(server)
        if base is None:
            services.urls[kind] = None
            services.missing[kind] = f"{server} is unreachable"
            continue
        url = with_driver(base, driver)
        if importlib.util.find_spec(module) is None:
            why = f"{module} is not installed (a dev dependency: pip install -e '.[dev]')"
        else:
            why = reachable(url)
        services.urls[kind] = url if why is None else None
        if why is not None:
            services.missing[kind] = f"{url}: {why}"
    return services
