"""backend_from_url and the SQLBackend constructor: which URLs work, and how the rest fail."""

from __future__ import annotations

import importlib
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.exc import DBAPIError

from celery_election.backends import MemoryBackend, SQLBackend, backend_from_url
from celery_election.backends import connection as connection_module
from celery_election.backends.postgres import PostgresBackend
from celery_election.core.lease import Bid
from celery_election.errors import (
    BackendUnavailableError,
    ConfigurationError,
    ElectionError,
    SchemaMissingError,
)

SCHEMES = (
    "sqlite:///PATH, postgresql://... (postgresql+psycopg / +psycopg2), "
    "mysql://... (mysql+pymysql / +mysqldb), memory://"
)


@pytest.fixture
def closing() -> Iterator[list[Any]]:
    """Backends appended here are closed after the test, pass or fail."""
    backends: list[Any] = []
    yield backends
    for backend in backends:
        backend.close()


def build(closing: list[Any], url: str, **options: Any) -> Any:
    backend = backend_from_url(url, **options)
    closing.append(backend)
    return backend


# -- supported URLs -------------------------------------------------------------------------


def test_sqlite_file_url(tmp_path: Path, closing: list[Any]) -> None:
    path = tmp_path / "election.db"
    backend = build(closing, f"sqlite:///{path}")
    assert type(backend) is SQLBackend
    assert backend.dialect == "sqlite"
    assert backend.engine.url.drivername == "sqlite"
    assert backend.engine.url.database == str(path)


def test_sqlite_relative_path_is_made_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, closing: list[Any]
) -> None:
    monkeypatch.chdir(tmp_path)
    backend = build(closing, "sqlite:///election.db")
    assert backend.engine.url.database == str(tmp_path / "election.db")


def test_sqlite_file_url_works_end_to_end(tmp_path: Path, closing: list[Any]) -> None:
    backend = build(closing, f"sqlite:///{tmp_path}/election.db")
    backend.install()
    result = backend.elect(Bid("default", uuid.uuid4().hex, "me", 10.0))
    assert result.won
    assert result.lease is not None and result.lease.leader_id == "me"


def test_memory_url() -> None:
    backend = backend_from_url("memory://")
    assert isinstance(backend, MemoryBackend)
    backend.close()


@pytest.mark.parametrize("prefix", ["db+", "sqla+"])
def test_celery_style_prefixes_are_accepted(
    prefix: str, tmp_path: Path, closing: list[Any]
) -> None:
    path = tmp_path / "election.db"
    backend = build(closing, f"{prefix}sqlite:///{path}")
    assert type(backend) is SQLBackend
    assert backend.engine.url.drivername == "sqlite"
    assert backend.engine.url.database == str(path)


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://app:pw@db.example/app",
        "postgres://app:pw@db.example/app",
        "postgresql+psycopg://app:pw@db.example/app",
        "db+postgresql://app:pw@db.example/app",
        "POSTGRESQL://app:pw@db.example/app",
    ],
)
def test_postgres_urls_mean_psycopg3(url: str, closing: list[Any]) -> None:
    # Building the backend does not connect, so no server is needed.
    backend = build(closing, url)
    assert isinstance(backend, PostgresBackend)
    assert backend.dialect == "postgresql"
    assert backend.engine.url.drivername == "postgresql+psycopg"
    assert backend.engine.url.host == "db.example"
    assert backend.engine.url.database == "app"
    assert "pw" not in backend.description
    assert "pw" not in repr(backend)


@pytest.mark.parametrize(
    "url",
    [
        "mysql://app:pw@db.example/app",
        "mariadb://app:pw@db.example/app",
        "mysql+pymysql://app:pw@db.example/app",
        "mariadb+pymysql://app:pw@db.example/app",
        "db+mysql://app:pw@db.example/app",
    ],
)
def test_mysql_urls_mean_pymysql(url: str, closing: list[Any]) -> None:
    backend = build(closing, url)
    assert type(backend) is SQLBackend
    assert backend.engine.url.drivername == "mysql+pymysql"
    assert backend.engine.url.host == "db.example"
    assert "pw" not in backend.description


# -- refused URLs ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "scheme", "hint"),
    [
        ("redis://localhost:6379/0", "redis", None),
        ("oracle://x", "oracle", None),
        ("sqlite+aiosqlite:///x.db", "sqlite+aiosqlite", None),
        (
            "postgresql+asyncpg://u@h/db",
            "postgresql+asyncpg",
            "(celery_election talks to PostgreSQL through psycopg 3 or psycopg2)",
        ),
        (
            "mariadb+mariadbconnector://u@h/db",
            "mariadb+mariadbconnector",
            "(celery_election talks to MySQL/MariaDB through PyMySQL or mysqlclient)",
        ),
    ],
)
def test_unsupported_schemes_are_refused(url: str, scheme: str, hint: str | None) -> None:
    with pytest.raises(ConfigurationError) as info:
        backend_from_url(url)
    message = str(info.value)
    assert message.startswith(f"unsupported election database URL scheme {scheme!r}")
    assert message.endswith(f"; use one of: {SCHEMES}")
    if hint is None:
        assert "celery_election talks to" not in message
    else:
        assert hint in message


@pytest.mark.parametrize(
    "url", ["not a url", "", "localhost:5432", "/var/lib/election.db", 42, None, b"sqlite://"]
)
def test_non_urls_are_refused(url: Any) -> None:
    with pytest.raises(ConfigurationError) as info:
        backend_from_url(url)
    assert str(info.value) == (f"election_url must be a database URL like {SCHEMES}: got {url!r}")


@pytest.mark.parametrize(
    "url",
    [
        "sqlite://",
        "sqlite:///:memory:",
        "SQLITE:///:memory:",
        "db+sqlite://",
        "sqlite:///file::memory:?cache=shared&uri=true",
        "sqlite:///file:election?mode=memory&uri=true",
    ],
)
def test_in_memory_sqlite_is_refused(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # nothing may land in the working directory
    try:
        backend = backend_from_url(url)
    except ConfigurationError as exc:
        message = str(exc)
    else:
        backend.close()
        pytest.fail(f"{url} was accepted as {backend!r}")
    assert "an in-memory SQLite database cannot be shared between processes" in message
    assert "MemoryBackend" in message
    assert "sqlite:////abs/path/election.db" in message
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("url", "modules", "extras"),
    [
        ("postgresql://u@h/db", ["psycopg", "psycopg2"], ["postgres", "psycopg2"]),
        ("postgres://u@h/db", ["psycopg", "psycopg2"], ["postgres", "psycopg2"]),
        ("postgresql+psycopg://u@h/db", ["psycopg"], ["postgres"]),
        ("postgresql+psycopg2://u@h/db", ["psycopg2"], ["psycopg2"]),
        ("mysql://u@h/db", ["pymysql", "MySQLdb"], ["mysql", "mysqlclient"]),
        ("mariadb://u@h/db", ["pymysql", "MySQLdb"], ["mysql", "mysqlclient"]),
        ("mysql+mysqldb://u@h/db", ["MySQLdb"], ["mysqlclient"]),
    ],
)
def test_missing_driver_names_the_extra(
    url: str, modules: list[str], extras: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for module in modules:
        monkeypatch.setitem(sys.modules, module, None)  # importing it now raises ImportError
    with pytest.raises(ConfigurationError) as info:
        backend_from_url(url)
    message = str(info.value)
    for module, extra in zip(modules, extras, strict=True):
        assert f"{module} (pip install 'celery-election[{extra}]')" in message


@pytest.mark.parametrize(
    ("url", "hidden", "driver"),
    [
        ("postgresql://app:pw@db.example/app", "psycopg", "postgresql+psycopg2"),
        ("postgres://app:pw@db.example/app", "psycopg", "postgresql+psycopg2"),
        # a Celery result backend's URL, as election_url borrows it by default
        ("db+postgresql://app:pw@db.example/app", "psycopg", "postgresql+psycopg2"),
        ("postgresql+psycopg2://app:pw@db.example/app", None, "postgresql+psycopg2"),
        ("mysql://app:pw@db.example/app", "pymysql", "mysql+mysqldb"),
        ("mariadb://app:pw@db.example/app", "pymysql", "mysql+mysqldb"),
        ("db+mysql://app:pw@db.example/app", "pymysql", "mysql+mysqldb"),
        ("mysql+mysqldb://app:pw@db.example/app", None, "mysql+mysqldb"),
    ],
)
def test_a_bare_scheme_falls_back_to_the_other_driver(
    url: str, hidden: str | None, driver: str, monkeypatch: pytest.MonkeyPatch, closing: list[Any]
) -> None:
    """Only psycopg2 or only mysqlclient installed (Django's and SQLAlchemy 2.0's defaults)."""
    if hidden is not None:
        monkeypatch.setitem(sys.modules, hidden, None)
    backend = build(closing, url)
    assert backend.engine.url.drivername == driver
    assert isinstance(backend, PostgresBackend) == driver.startswith("postgresql")


@pytest.mark.parametrize("prefix", ["1abc", "a-b", "x;drop", "x y", "", "_x", "a.b", 5, None])
def test_bad_table_prefix_is_refused(prefix: Any, tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError) as info:
        backend_from_url(f"sqlite:///{tmp_path}/election.db", table_prefix=prefix)
    assert str(info.value) == (
        "table_prefix (election_table_prefix) must be 1-40 ASCII letters, digits and "
        f"underscores, starting with a letter: got {prefix!r}"
    )
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("prefix", ["x", "abc_", "App2_election_"])
def test_good_table_prefix_names_the_tables(
    prefix: str, tmp_path: Path, closing: list[Any]
) -> None:
    backend = build(closing, f"sqlite:///{tmp_path}/election.db", table_prefix=prefix)
    backend.install()
    assert set(sa.inspect(backend.engine).get_table_names()) == {
        f"{prefix}meta",
        f"{prefix}lease",
        f"{prefix}candidate",
        f"{prefix}beat_run",
        *(f"{prefix}schedule_{t}" for t in ("entry", "rev", "audit", "term")),
        f"{prefix}key",
        f"{prefix}task_start",
    }


def test_sqlite_on_a_network_filesystem_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, closing: list[Any]
) -> None:
    monkeypatch.setattr(connection_module, "filesystem_type", lambda path: "nfs4")
    url = f"sqlite:///{tmp_path}/election.db"
    with pytest.raises(ConfigurationError) as info:
        backend_from_url(url)
    message = str(info.value)
    assert f"SQLite election file {tmp_path / 'election.db'} is on a network filesystem" in message
    assert "(nfs4)" in message
    assert "allow_network_filesystem=True" in message
    backend = build(closing, url, allow_network_filesystem=True)
    assert type(backend) is SQLBackend


def test_sqlbackend_refuses_a_non_url() -> None:
    with pytest.raises(ConfigurationError, match=r"^not a database URL: 'nonsense'"):
        SQLBackend("nonsense")


# -- errors at run time ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "driver_module"),
    [
        ("postgresql+psycopg://postgres:secret@127.0.0.1:1/test", "psycopg"),
        ("postgresql://postgres:secret@127.0.0.1:1/test", "psycopg"),
        ("mysql+pymysql://root:secret@127.0.0.1:1/test", "pymysql"),
    ],
)
def test_install_on_an_unreachable_server(url: str, driver_module: str, closing: list[Any]) -> None:
    driver = importlib.import_module(driver_module)
    backend = build(closing, url, connect_timeout=1)
    with pytest.raises(BackendUnavailableError) as info:
        backend.install()
    err = info.value
    assert isinstance(err, ElectionError)
    message = str(err)
    assert message.startswith("cannot reach election database ")
    assert "***@127.0.0.1:1/test" in message
    assert "secret" not in message
    # The driver's own error must be reachable: as the cause, or as the cause's .orig
    # (SQLAlchemy's wrapper, whose own __cause__ is the driver error).
    cause = err.__cause__
    assert cause is not None
    driver_exc = cause.orig if isinstance(cause, DBAPIError) else cause
    assert isinstance(driver_exc, driver.OperationalError)


def test_current_on_an_unreachable_server(closing: list[Any]) -> None:
    backend = build(closing, "postgresql://postgres:secret@127.0.0.1:1/test", connect_timeout=1)
    with pytest.raises(BackendUnavailableError) as info:
        backend.current("default")
    assert "secret" not in str(info.value)
    assert "postgres:***@127.0.0.1:1/test" in str(info.value)
    assert info.value.__cause__ is not None


def test_current_without_install_says_how_to_install(tmp_path: Path, closing: list[Any]) -> None:
    backend = build(closing, f"sqlite:///{tmp_path}/election.db")
    with pytest.raises(SchemaMissingError) as info:
        backend.current("default")
    message = str(info.value)
    assert "`celery -A proj election install`" in message
    assert "'celery_election_lease'" in message
    assert str(tmp_path / "election.db") in message
    assert info.value.table == "celery_election_lease"
    assert isinstance(info.value, ElectionError)


@pytest.mark.parametrize("step", ["elect", "candidates"])
def test_other_steps_without_install_say_how_to_install(
    step: str, tmp_path: Path, closing: list[Any]
) -> None:
    backend = build(closing, f"sqlite:///{tmp_path}/election.db", table_prefix="app_")
    with pytest.raises(SchemaMissingError, match="`celery -A proj election install`"):
        if step == "elect":
            backend.elect(Bid("default", uuid.uuid4().hex, "me", 10.0))
        else:
            backend.candidates("default")


# -- an existing Engine ---------------------------------------------------------------------


def test_sqlbackend_from_an_engine_builds_its_own(tmp_path: Path) -> None:
    app_engine = sa.create_engine(f"sqlite:///{tmp_path}/app.db")
    backend = SQLBackend(app_engine)
    try:
        assert backend.engine is not app_engine
        assert backend.engine.url.database == str(tmp_path / "app.db")
        backend.install()
        result = backend.elect(Bid("default", uuid.uuid4().hex, "me", 10.0))
        assert result.won
        lease = backend.current("default")
        assert lease is not None and lease.leader_id == "me"
        # The tables are in the application's database, visible through its own engine.
        assert "celery_election_lease" in sa.inspect(app_engine).get_table_names()
        backend.close()
        # Closing the backend leaves the application's engine usable.
        with app_engine.connect() as conn:
            assert conn.execute(sa.text("SELECT 1")).scalar() == 1
    finally:
        backend.close()
        app_engine.dispose()


def test_sqlbackend_from_an_in_memory_engine_is_refused() -> None:
    app_engine = sa.create_engine("sqlite://")
    try:
        with pytest.raises(ConfigurationError, match="MemoryBackend"):
            SQLBackend(app_engine)
    finally:
        app_engine.dispose()


def test_sqlite_uri_filename_is_honoured_or_refused(tmp_path: Path, closing: list[Any]) -> None:
    # SQLite URI filenames (uri=true) are valid SQLAlchemy URLs. Resolving "file:/x" as a
    # relative path mangles them; they must either work as given or be refused up front.
    path = tmp_path / "election.db"
    try:
        backend = build(closing, f"sqlite:///file:{path}?uri=true")
    except ConfigurationError as exc:
        assert "uri" in str(exc)
        return
    backend.install()
    assert backend.current("default") is None
    assert path.exists()
