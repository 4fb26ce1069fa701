"""MySQL's and MariaDB's ``Dialect`` (PyMySQL or mysqlclient, MySQLdb)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, ClassVar

import sqlalchemy as sa
from sqlalchemy.dialects import mysql
from sqlalchemy.engine import Engine

from . import connection, green
from .connection import Timeouts
from .dialect_base import Dialect, LockRequest
from .locks import LivenessSession, MySQLSession

__all__ = ["FOUND_ROWS", "MySQL", "without_found_rows"]


class MySQL(Dialect):
    """MySQL and MariaDB through PyMySQL or mysqlclient (MySQLdb)."""

    name = "mysql"
    # UTC_TIMESTAMP ignores the session time zone; (6) keeps the microseconds.
    clock_sql = "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))"
    concat_sql = "GROUP_CONCAT({value} ORDER BY {order} SEPARATOR {separator})"
    contention: ClassVar[frozenset[int]] = frozenset({1213, 1205, 1062, 1969, 3024})
    missing: ClassVar[frozenset[int]] = frozenset({1146})

    def engine_options(
        self, driver: str, timeouts: Timeouts
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        options, connect_args = super().engine_options(driver, timeouts)
        # mysqlclient takes whole seconds (libmariadb's options are unsigned ints)
        secs = timeouts.statement
        io_timeout = secs if driver == "pymysql" else max(1, math.ceil(secs))
        connect_args.update(
            connect_timeout=max(1, round(timeouts.connect)),
            read_timeout=io_timeout,
            write_timeout=io_timeout,
        )
        return options, connect_args

    def set_up_sessions(self, engine: Engine, statement_timeout: float) -> None:
        secs = statement_timeout

        @sa.event.listens_for(engine, "do_connect")
        def _mysql_flags(dialect: Any, record: Any, cargs: Any, cparams: dict[str, Any]) -> None:
            # SQLAlchemy's PyMySQL and mysqlclient dialects both set CLIENT.FOUND_ROWS: an
            # UPDATE then reports the rows it matched, not those it changed, and a step that
            # matched without changing would count as won (docs/design.md, rule 1).
            cparams["client_flag"] = without_found_rows(cparams.get("client_flag", 0))

        @sa.event.listens_for(engine, "connect")
        def _mysql_connect(dbapi_conn: Any, record: Any) -> None:
            connection.remember_socket(dbapi_conn)  # mysqlclient: for the call deadline
            settings = [
                f"innodb_lock_wait_timeout = {max(1, round(secs))}",
                "sql_mode = CONCAT(@@sql_mode, ',STRICT_ALL_TABLES')",
                # GROUP_CONCAT stops at 1 KB on MySQL (1 MB on MariaDB): a timeline row
                # of 4,000 columns is ~100 KB
                "group_concat_max_len = 67108864",
            ]
            if "mariadb" in dbapi_conn.get_server_info().lower():
                settings.append(f"max_statement_time = {secs}")
            cur = dbapi_conn.cursor()
            cur.execute("SET SESSION " + ", ".join(settings))  # one statement per connection
            cur.close()

    def driver_error(self, orig: BaseException | None) -> str | None:
        if not type(orig).__module__.startswith(("pymysql", "MySQLdb")):
            return None
        code = orig.args[0] if orig is not None and orig.args else None
        if code in self.contention:
            return "contention"
        if code in self.missing:
            return "missing"
        return None

    def insert(self, table: sa.Table) -> Any:
        return mysql.insert(table)

    def ignoring(self, ins: Any) -> sa.Insert:
        # INSERT IGNORE reports 0 rows for a duplicate (ON DUPLICATE KEY UPDATE would
        # report a matched row as 1 with the FOUND_ROWS flag: a false claim).
        result: sa.Insert = ins.prefix_with("IGNORE")
        return result

    def insert_if_absent(self, table: sa.Table, values: dict[str, Any], column: str) -> sa.Insert:
        ins = mysql.insert(table).values(values)
        return ins.on_duplicate_key_update({column: table.c[column]})  # a no-op update

    def upsert(
        self,
        table: sa.Table,
        values: dict[str, Any],
        update: Callable[[Any], dict[str, Any]],
    ) -> sa.Insert:
        # The assignments run left to right: none of ours reads another's result.
        mins = mysql.insert(table).values(values)
        return mins.on_duplicate_key_update(update(mins.inserted))

    def delete_at_most(
        self, key: sa.Column[Any], where: sa.ColumnElement[bool], limit: int
    ) -> sa.Delete:
        try:
            return sa.delete(key.table).where(where).with_dialect_options(mysql_limit=limit)
        except sa.exc.ArgumentError:
            # older SQLAlchemy 2.0 (2.0.30) has no DELETE ... LIMIT for MySQL; MySQL refuses LIMIT
            # in an IN subquery, but not in a derived table inside it
            ids = sa.select(key).where(where).limit(limit).subquery()
            return sa.delete(key.table).where(key.in_(sa.select(ids.c[key.name])))

    def liveness_session(self, lock: LockRequest) -> LivenessSession:
        dialect, connect_timeout = lock.engine.dialect, lock.connect_timeout
        cargs, cparams = dialect.create_connect_args(lock.url)
        cparams.update(
            connect_timeout=max(1, round(connect_timeout)),
            # whole seconds: mysqlclient takes no fractions
            read_timeout=math.ceil(lock.max_wait + connect_timeout + 5),
            write_timeout=math.ceil(connect_timeout + 5),
        )
        description = lock.url.render_as_string(hide_password=True)
        raw = green.connector(dialect, *cargs, **cparams)

        def connect() -> Any:
            conn = raw()
            connection.remember_socket(conn)  # mysqlclient: for interrupt()
            return conn

        return MySQLSession(connect, lock.delta, description, lock.key)


#: MySQL's CLIENT_FOUND_ROWS capability flag (the same bit in PyMySQL and mysqlclient).
FOUND_ROWS = 2


def without_found_rows(client_flag: int) -> int:
    """``client_flag`` with FOUND_ROWS off: a conditional UPDATE counts the rows it changed."""
    return client_flag & ~FOUND_ROWS
