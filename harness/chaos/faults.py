"""Fault injectors for the chaos runs, each usable on its own from a test.

Processes are started in their own session, so a signal reaches a worker's pool children
and an embedded beat too. Database sessions are found by the client port the server sees,
which is the proxy's upstream socket: killing "the leader's connections" kills exactly
those, on PostgreSQL and on MariaDB alike.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

import sqlalchemy as sa

ROOT = Path(__file__).resolve().parents[2]
FAKETIME_LIB = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")


def kill_pooled(pooler_url: str, server_url: str) -> int:
    """Terminate every PostgreSQL session behind a PgBouncer (its admin console's
    ``SHOW SERVERS`` gives their pids): pg_terminate_backend under the pooler."""
    import psycopg
    from psycopg.rows import dict_row

    admin = sa.engine.make_url(pooler_url).set(drivername="postgresql", database="pgbouncer")
    # the admin console answers SHOW only (SQLAlchemy's first-connect queries fail there)
    conninfo = admin.render_as_string(hide_password=False)
    with psycopg.connect(conninfo, autocommit=True, row_factory=dict_row) as conn:
        rows = conn.execute("SHOW SERVERS").fetchall()
    pids = [int(r["remote_pid"]) for r in rows if r.get("remote_pid")]
    if not pids:
        return 0
    engine = sa.create_engine(server_url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            return len(
                conn.execute(
                    sa.text("SELECT pg_terminate_backend(pid) FROM unnest(:p) AS pid"),
                    {"p": pids},
                ).all()
            )
    finally:
        engine.dispose()


def kill_sessions(url: str, client_ports: Iterable[int]) -> int:
    """Terminate the server sessions whose client port is one of ``client_ports``.

    PostgreSQL: pg_terminate_backend. MariaDB: KILL CONNECTION. Returns how many.
    """
    ports = sorted(set(client_ports))
    if not ports:
        return 0
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            if engine.dialect.name == "postgresql":
                rows = conn.execute(
                    sa.text(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE client_port = ANY(:ports) AND pid <> pg_backend_pid()"
                    ),
                    {"ports": ports},
                ).all()
                return len(rows)
            hosts = [f"127.0.0.1:{p}" for p in ports]
            ids = conn.execute(
                sa.text(
                    "SELECT id FROM information_schema.processlist "
                    "WHERE host IN :hosts AND id <> CONNECTION_ID()"
                ).bindparams(sa.bindparam("hosts", expanding=True)),
                {"hosts": hosts},
            ).scalars()
            n = 0
            for session_id in list(ids):
                with contextlib.suppress(sa.exc.DBAPIError):
                    conn.execute(sa.text(f"KILL CONNECTION {int(session_id)}"))
                    n += 1
            return n
    finally:
        engine.dispose()


def wait_reachable(url: str, timeout: float = 60.0) -> None:
    """Until the server answers a query (after a restart)."""
    deadline = time.monotonic() + timeout
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        while True:
            try:
                with engine.connect() as conn:
                    conn.execute(sa.text("SELECT 1"))
                return
            except sa.exc.DBAPIError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
    finally:
        engine.dispose()


def restart_database(url: str) -> None:
    """Restart the server behind ``url`` (the loopback PostgreSQL or MariaDB, as root).

    PostgreSQL stops in fast mode (sessions are terminated, nothing waits for clients);
    MariaDB is shut down and started again the way scripts/services-up starts it.
    """
    # Runs side by side on one machine share the server: one restart at a time (a second
    # pg_ctlcluster while one is restarting fails).
    with open(_RESTART_LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _restart(url)
    wait_reachable(url)


_RESTART_LOCK = os.path.join(tempfile.gettempdir(), "celery-election-chaos-restart.lock")


def restart_unsupported(url: str) -> str | None:
    """Why :func:`restart_database` cannot restart the server behind ``url``; None if it can.

    It restarts a loopback server the way scripts/services-up runs it: a PostgreSQL
    cluster of Debian's (pg_ctlcluster) found by its port, MariaDB as root with
    mariadb-admin and start-stop-daemon (on 3306 the default instance; on another port the
    instance whose option file under /etc/mysql names that port, e.g. a second instance
    kept for chaos runs beside the test servers). Any other server (a throwaway cluster in
    a temp dir, one in a container, one on another host) would be left running, or the
    wrong one hit.
    """
    u = sa.engine.make_url(url)
    dialect = u.get_backend_name()
    if u.host not in (None, "", "localhost", "127.0.0.1", "::1"):
        return f"the server is on {u.host}, not this host"
    if dialect == "postgresql":
        if shutil.which("pg_ctlcluster") is None:
            return "pg_ctlcluster is not installed"
        if _pg_cluster(u.port or 5432) is None:
            return f"no cluster of pg_lsclusters listens on port {u.port or 5432}"
        return None
    if dialect in ("mysql", "mariadb"):
        if os.geteuid() != 0:
            return "MariaDB is restarted as root, and this is not root"
        if not (shutil.which("mariadb-admin") or shutil.which("mysqladmin")):
            return "neither mariadb-admin nor mysqladmin is installed"
        if shutil.which("start-stop-daemon") is None or not os.path.exists("/usr/sbin/mariadbd"):
            return "no start-stop-daemon and /usr/sbin/mariadbd to start MariaDB again"
        port = u.port or 3306
        if port != 3306 and _mariadb_options(port) is None:
            return f"no option file under /etc/mysql names port {port}"
        return None
    return f"no way to restart a {dialect} server"


def _pg_cluster(port: int) -> tuple[str, str] | None:
    """(version, name) of the pg_lsclusters cluster on ``port``."""
    try:
        out = subprocess.run(["pg_lsclusters", "-h"], capture_output=True, text=True).stdout
    except OSError:
        return None
    for line in out.splitlines():
        fields = line.split()
        if len(fields) >= 3 and fields[2] == str(port):
            return fields[0], fields[1]
    return None


def _mariadb_options(port: int) -> Path | None:
    """The option file under /etc/mysql of the MariaDB instance on ``port``."""
    for conf in sorted(Path("/etc/mysql").glob("*.cnf")):
        with contextlib.suppress(OSError):
            if re.search(rf"(?m)^\s*port\s*=\s*{port}\s*$", conf.read_text()):
                return conf
    return None


def _restart(url: str) -> None:
    wait_reachable(url)  # a restart by someone else may still be finishing
    u = sa.engine.make_url(url)
    dialect = u.get_backend_name()
    if dialect == "postgresql":
        found = _pg_cluster(u.port or 5432)
        if found is None:
            raise ValueError(f"no PostgreSQL cluster on port {u.port or 5432}")
        subprocess.run(
            ["pg_ctlcluster", "--skip-systemctl-redirect", *found, "restart", "-m", "fast"],
            check=True,
            capture_output=True,
        )
    elif dialect in ("mysql", "mariadb"):
        port = u.port or 3306
        admin = shutil.which("mariadb-admin") or shutil.which("mysqladmin") or "mariadb-admin"
        subprocess.run(
            [admin, "-uroot", "-h127.0.0.1", f"-P{port}", "shutdown"],
            check=True,
            capture_output=True,
        )
        if port == 3306:  # the default instance, as scripts/services-up starts it
            pidfile, args = "/run/mysqld/mysqld.pid", []
        else:
            options = _mariadb_options(port)
            assert options is not None
            text = options.read_text()
            found_pid = re.search(r"(?m)^\s*pid-file\s*=\s*(\S+)", text)
            pidfile = found_pid.group(1) if found_pid else f"/run/mysqld/{port}.pid"
            args = ["--", f"--defaults-file={options}"]
        # until the server's process is gone: start-stop-daemon does nothing while it lives
        deadline = time.monotonic() + 60
        while (_listening(port) or os.path.exists(pidfile)) and time.monotonic() < deadline:
            time.sleep(0.1)
        subprocess.run(
            ["start-stop-daemon", "--start", "--oknodo", "--background", "--pidfile",
             pidfile, "--exec", "/usr/sbin/mariadbd", *args],
            check=True,
            capture_output=True,
        )  # fmt: skip
    else:
        raise ValueError(f"cannot restart the server of {url!r}")


def _listening(port: int) -> bool:
    """Whether something accepts connections on the loopback ``port``."""
    import socket

    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
        return True
    return False


def skew_env(seconds: float) -> dict[str, str]:
    """Environment that shifts the wall clock of one process by ``seconds`` (libfaketime).

    Only the wall clock moves: CLOCK_MONOTONIC/BOOTTIME stay true, as they do when a
    host's clock is set wrong. Needs Debian's faketime package (scripts/services-up).
    """
    if not FAKETIME_LIB.exists():
        raise RuntimeError(f"{FAKETIME_LIB} is missing: apt-get install faketime")
    return {
        "LD_PRELOAD": str(FAKETIME_LIB),
        "FAKETIME": f"{seconds:+.0f}s",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        # libfaketime breaks time.sleep() in this mode; skew/sitecustomize.py mends it.
        "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent / "skew"), str(ROOT)]),
    }
