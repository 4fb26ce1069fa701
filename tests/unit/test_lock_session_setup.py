"""The PostgreSQL lock session's set-up on a server that cannot check for closed clients.

``client_connection_check_interval`` needs POLLRDHUP (Linux); elsewhere the server refuses
a non-zero value. The session then sets up without it (its other limits unchanged), warns
once per URL, and does not ask again.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest

from celery_election.backends import locks
from celery_election.backends.locks import PostgresSession

URL = "postgresql://db.example/app"


class Refused(Exception):
    sqlstate = "22023"  # invalid_parameter_value: "must be set to 0 on this platform"


class Conn:
    """A DBAPI connection whose server cannot check for closed clients."""

    def __init__(self) -> None:
        self.sent: list[str] = []

    def cursor(self) -> Conn:
        return self

    def __enter__(self) -> Conn:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def execute(self, sql: str, params: tuple[Any, ...]) -> None:
        if "client_connection_check_interval" in sql:
            raise Refused("client_connection_check_interval must be set to 0 on this platform")
        self.sent.append(sql)

    def fetchone(self) -> tuple[Any, ...]:
        return ("",)


@pytest.fixture(autouse=True)
def fresh() -> Iterator[None]:
    locks._NO_CONNECTION_CHECK.discard(URL)
    yield
    locks._NO_CONNECTION_CHECK.discard(URL)


def test_without_the_check_the_session_sets_its_other_limits_and_warns_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    session = PostgresSession(lambda: None, 1.0, URL, b"k" * 20)
    conn = Conn()
    with caplog.at_level(logging.WARNING, logger=locks.__name__):
        session._set_timeouts(conn)
        session._set_timeouts(conn)  # the next connection: not asked again
    assert len(conn.sent) == 2
    assert all("idle_session_timeout" in sql and "statement_timeout" in sql for sql in conn.sent)
    warned = [r for r in caplog.records if "closed clients" in r.getMessage()]
    assert len(warned) == 1


def test_another_error_is_not_taken_for_a_missing_check() -> None:
    class Down(Exception):
        sqlstate = "08006"

    class Lost(Conn):
        def execute(self, sql: str, params: tuple[Any, ...]) -> None:
            raise Down("connection failure")

    with pytest.raises(Down):
        PostgresSession(lambda: None, 1.0, URL, b"k" * 20)._set_timeouts(Lost())
    assert URL not in locks._NO_CONNECTION_CHECK
