"""PostgreSQL: the SQL backend plus LISTEN/NOTIFY, so followers sleep until something happens.

Sending. Every step that changes the lease row sends ``pg_notify`` *in the same statement*
(a data-modifying CTE), so a notification exists exactly when the change committed:
``elected`` for a new term, ``renewed`` for an extension, ``resigned`` for a vacated
lease. The payload is JSON ``{"ns": namespace, "ev": event, "term": term}`` on one
fixed, short, lowercase channel per table prefix (``<prefix>ev``): LISTEN lower-cases and
truncates channel names but pg_notify does not, and two applications with different
prefixes on one database must not wake each other. A losing take reads the current row in
the same statement (UNION ALL), so a follower's attempt costs one statement.

Listening. One dedicated psycopg (3 or 2) connection per backend (never the application's pool,
never the lease engine's) LISTENs and hands each valid payload to the electors of its
namespace. A payload is only a hint; malformed, oversized or unknown ones are dropped
at debug level. After every (re)connect, and every ``probe_interval``, the listener sends
itself a NOTIFY carrying a random nonce: behind PgBouncer in transaction mode LISTEN is
accepted but nothing is delivered, and the probe is how we notice (``healthy`` turns
False, one warning, the electors poll). A dropped connection is retried with back-off
while the electors poll.
"""

from __future__ import annotations

import contextlib
import json
import logging
import random
import select
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import URL, Engine, make_url

from ..core.config import MAX_NAMESPACE_LENGTH
from ..errors import ConfigurationError
from .base import Wakeup, WakeupHandle
from .connection import interrupt as _interrupt
from .connection import one_line
from .dialect_base import StepStyle
from .dialect_postgresql import PostgreSQL
from .locks import PROBE_EVERY, pg_connector, sessions_pinned
from .schema import DEFAULT_TABLE_PREFIX, db_now_us
from .sql import SQLBackend

__all__ = ["MAX_PAYLOAD", "PostgresBackend", "parse_payload"]

log = logging.getLogger(__name__)

#: Ours are under 100 bytes (PostgreSQL allows up to 7999): anything longer is not ours.
MAX_PAYLOAD = 512
_ROW_EVENTS = ("elected", "renewed", "resigned")


def parse_payload(payload: str) -> tuple[str, Wakeup] | None:
    """(namespace, wakeup) from a NOTIFY payload, or None if it is not one of ours."""
    if len(payload) > MAX_PAYLOAD:
        return None
    try:
        data = json.loads(payload)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    ns, event, term = data.get("ns"), data.get("ev"), data.get("term")
    if not isinstance(ns, str) or not ns or len(ns) > MAX_NAMESPACE_LENGTH:
        return None
    if event not in _ROW_EVENTS:
        return None
    if not isinstance(term, int) or isinstance(term, bool) or term < 0:
        return None
    return ns, Wakeup(event, term)


class _Registration:
    def __init__(
        self, listener: _Listener, namespace: str, callback: Callable[[Wakeup], None]
    ) -> None:
        self.listener, self.namespace, self.callback = listener, namespace, callback

    @property
    def healthy(self) -> bool:
        return self.listener.healthy

    def close(self) -> None:
        self.listener.remove(self)


class _Listener:
    """The LISTEN connection's thread: deliver, probe, reconnect."""

    def __init__(
        self,
        connect: Callable[[], Any],
        description: str,
        channel: str,
        *,
        connect_timeout: float,
        probe_interval: float,
        probe_timeout: float,
    ) -> None:
        self.connect = connect
        self.description = description
        self.channel = channel
        self.connect_timeout = connect_timeout
        self.probe_interval = probe_interval
        self.probe_timeout = probe_timeout
        self.healthy = False
        #: Statements sent on the LISTEN connection (LISTEN and probes), for benchmarks.
        self.statements = 0
        self.connects = 0
        #: Payloads dropped as not ours (malformed, oversized, unknown), for tests.
        self.ignored = 0
        #: Payloads of ours delivered.
        self.delivered = 0
        self._lock = threading.Lock()
        self._registrations: list[_Registration] = []
        self._stop = threading.Event()
        self._warned = False
        self._thread: threading.Thread | None = None
        self._conn: Any = None

    # -- registrations ----------------------------------------------------------------------

    def add(self, namespace: str, callback: Callable[[Wakeup], None]) -> _Registration:
        reg = _Registration(self, namespace, callback)
        with self._lock:
            self._registrations.append(reg)
            if self._thread is None or not self._thread.is_alive():
                self._stop.clear()
                self._thread = threading.Thread(
                    target=self._run, name=f"celery-election-listen-{self.channel}", daemon=True
                )
                self._thread.start()
        return reg

    def remove(self, reg: _Registration) -> None:
        with self._lock:
            if reg in self._registrations:
                self._registrations.remove(reg)
            last = not self._registrations
        if last:
            self.stop()

    def _deliver(self, namespace: str | None, wakeup: Wakeup) -> None:
        with self._lock:
            targets = [
                r for r in self._registrations if namespace is None or r.namespace == namespace
            ]
        for reg in targets:
            try:
                reg.callback(wakeup)
            except Exception:  # pragma: no cover - the elector's callback does not raise
                log.exception("wakeup callback failed")

    # -- the thread -------------------------------------------------------------------------

    def stop(self) -> None:
        self._stop.set()
        conn = self._conn
        if conn is not None:  # cut the wait for notifications short
            with contextlib.suppress(Exception):
                _interrupt(conn)
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=self.connect_timeout + 2)
        self._thread = None

    def _run(self) -> None:
        delay = 0.1
        failures = 0
        while not self._stop.is_set():
            pooled = False
            try:
                # closing(): psycopg2's ``with conn`` ends a transaction, not the connection
                with contextlib.closing(self.connect()) as conn:
                    conn.autocommit = True
                    self._conn = conn
                    self.connects += 1
                    failures = 0
                    # through a transaction pooler: closed now, looked at again after
                    # PROBE_EVERY (below), while followers poll
                    pooled = not self._pinned(conn)
                    if not pooled:
                        _execute(conn, 'LISTEN "{}"'.format(self.channel.replace('"', '""')))
                        self.statements += 1
                        delay = 0.1
                        self._serve(conn)
            except Exception as exc:
                if self._stop.is_set():
                    break
                failures += 1
                was_healthy, self.healthy = self.healthy, False
                if was_healthy:
                    log.warning("LISTEN connection lost (%s); polling until it is back", exc)
                    self._deliver(None, Wakeup("lost"))
                elif failures == 1:  # once at WARNING, then quietly with back-off
                    log.warning(
                        "LISTEN connection to %s failed (%s); followers poll until it connects",
                        self.description,
                        one_line(exc),
                    )
                else:
                    log.debug("LISTEN connection failed: %s", exc)
                self._stop.wait(delay * (0.5 + random.random()))
                delay = min(delay * 2, 5.0)
            finally:
                self._conn = None
            if pooled:
                self._stop.wait(PROBE_EVERY)
        self.healthy = False

    def _pinned(self, conn: Any) -> bool:
        """A LISTEN through a transaction pooler hears nothing: check before listening."""
        if sessions_pinned(conn, self.connect, self.description):
            return True
        self.healthy = False
        if not self._warned:
            log.warning(
                "LISTEN is off: %s leads to a transaction pooler (PgBouncer "
                "pool_mode=transaction?), where a LISTEN hears nothing. Followers poll; set "
                "election_direct_url to a URL that reaches PostgreSQL directly for wakeups",
                self.description,
            )
            self._warned = True
        return False

    def _serve(self, conn: Any) -> None:
        """Probe, then deliver notifications until stopped or the connection fails.

        After a (re)connect the probe always runs. After that, a delivered notification
        of ours proves delivery as well as a probe would (a live leader renews every few
        seconds), so the periodic probe only runs after ``probe_interval`` without one.
        """
        reconnected = self.connects > 1
        probe = True
        while not self._stop.is_set():
            ok = self._probe(conn) if probe else True
            if ok and not self.healthy:
                self.healthy = True
                if self._warned:
                    log.warning("LISTEN/NOTIFY delivers again; followers wake on events")
                    self._warned = False
                if reconnected:
                    self._deliver(None, Wakeup("reconnected"))
                    reconnected = False
            elif not ok:
                if self.healthy or not self._warned:
                    log.warning(
                        "LISTEN on channel %r accepted, but a NOTIFY probe was not delivered "
                        "within %ss (PgBouncer in transaction mode?). Followers will poll; "
                        "use listen=False, or listen_url= pointing at the server directly",
                        self.channel,
                        self.probe_timeout,
                    )
                    self._warned = True
                if self.healthy:
                    self.healthy = False
                    self._deliver(None, Wakeup("lost"))
            before = self.delivered
            self._listen_for(conn, self.probe_interval * (0.9 + 0.2 * random.random()))
            probe = self.delivered == before

    def _probe(self, conn: Any) -> bool:
        nonce = uuid.uuid4().hex
        _execute(conn, "SELECT pg_notify(%s, %s)", (self.channel, json.dumps({"probe": nonce})))
        self.statements += 1
        return self._listen_for(conn, self.probe_timeout, nonce=nonce)

    def _listen_for(self, conn: Any, seconds: float, nonce: str | None = None) -> bool:
        """Deliver notifications for ``seconds``; with ``nonce``, return once it is seen."""
        import time

        deadline = time.monotonic() + seconds
        while not self._stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            for payload in _notifications(conn, min(left, 0.5)):
                if (
                    nonce is not None
                    and nonce in payload
                    and payload == json.dumps({"probe": nonce})
                ):
                    return True
                parsed = parse_payload(payload)
                if parsed is None:
                    if not payload.startswith('{"probe": '):
                        self.ignored += 1
                        log.debug("ignored a payload on %r: %.200r", self.channel, payload)
                    continue
                self.delivered += 1
                self._deliver(*parsed)
        return False


def _execute(conn: Any, sql: str, params: tuple[Any, ...] = ()) -> None:
    """One statement on the LISTEN connection, as psycopg 3 and psycopg2 both spell it."""
    with conn.cursor() as cur:
        cur.execute(sql, params or None)


def _notifications(conn: Any, timeout: float) -> Iterator[str]:
    """The payloads that arrive on ``conn`` within ``timeout``, as they come.

    psycopg 3 has ``notifies()``, a generator that waits; psycopg2 queues them on the
    ``notifies`` list when ``poll()`` reads the socket, which select() waits on (one wait:
    the caller loops). An interrupt (the socket shut down) makes either raise: the
    listener reconnects.
    """
    if callable(conn.notifies):  # psycopg 3
        yield from (note.payload for note in conn.notifies(timeout=timeout))
        return
    if not conn.notifies:
        readable, _, _ = select.select([conn], [], [], timeout)
        if readable:
            conn.poll()
    while conn.notifies:
        yield conn.notifies.pop(0).payload


@dataclass(frozen=True)
class NotifyStyle(StepStyle):
    """PostgreSQL: one statement per step that also reads a losing row and sends NOTIFY."""

    channel: str = ""
    lease: sa.Table | None = None
    returning: bool = True
    reads_in_step: bool = True

    def statement(
        self, update: sa.Update, columns: Sequence[sa.ColumnElement[Any]], event: str
    ) -> sa.Executable:
        returning = update.returning(*columns)
        # WITH changed AS (UPDATE ... RETURNING ...)
        # SELECT changed.*, true AS won, pg_notify(...)::text FROM changed
        # UNION ALL
        # SELECT lease.*, false, NULL FROM lease WHERE namespace = :ns
        #     AND NOT EXISTS (SELECT 1 FROM changed)
        changed = returning.cte("changed")
        payload = sa.func.json_build_object(
            sa.literal_column("'ns'"),
            changed.c.namespace,
            sa.literal_column("'ev'"),
            sa.literal_column(f"'{event}'"),
            sa.literal_column("'term'"),
            changed.c.term,
        )
        notify = sa.func.pg_notify(self.channel, sa.cast(payload, sa.Text))
        names = [c.name for c in returning.exported_columns]
        first = sa.select(
            *[changed.c[n] for n in names],
            sa.true().label("won"),
            sa.cast(notify, sa.Text).label("notified"),
        )
        t = self.lease
        assert t is not None, "NotifyStyle needs the lease table"
        current = {
            "db_now": db_now_us().label("db_now"),
            **{c.name: c for c in t.c},
        }
        second = sa.select(
            *[current[n] for n in names],
            sa.false().label("won"),
            sa.cast(sa.null(), sa.Text).label("notified"),
        ).where(
            t.c.namespace == sa.bindparam("p_ns"),
            ~sa.exists(sa.select(sa.literal(1)).select_from(changed)),
        )
        return sa.union_all(first, second)


class PostgresBackend(SQLBackend):
    """SQLBackend on PostgreSQL through psycopg 3 or psycopg2, with NOTIFY wakeups.

    ``listen=False`` polls only (for PgBouncer in transaction mode, where LISTEN delivers
    nothing); ``listen_url`` LISTENs through another URL (straight to the server) than the
    lease queries use. NOTIFY is sent either way.
    """

    def __init__(
        self,
        url_or_engine: str | URL | Engine,
        *,
        table_prefix: str = DEFAULT_TABLE_PREFIX,
        listen: bool = True,
        listen_url: str | URL | None = None,
        probe_interval: float = 60.0,
        probe_timeout: float = 2.0,
        **options: Any,
    ) -> None:
        super().__init__(url_or_engine, table_prefix=table_prefix, **options)
        if not isinstance(self.db, PostgreSQL):
            raise ConfigurationError(
                f"PostgresBackend needs a postgresql+psycopg:// or postgresql+psycopg2:// URL: "
                f"got {self.description}"
            )
        self.channel = f"{table_prefix}ev".lower()
        self.style = NotifyStyle(channel=self.channel, lease=self.lease)
        self.listen = listen
        lurl = make_url(listen_url) if listen_url is not None else self.direct_url
        self._listener = _Listener(
            pg_connector(self.engine, lurl, self._connect_timeout, "celery-election-listen"),
            lurl.render_as_string(hide_password=True),
            self.channel,
            connect_timeout=options.get("connect_timeout", 5.0),
            probe_interval=probe_interval,
            probe_timeout=probe_timeout,
        )

    def topology_warnings(self, *, lock_on: bool) -> list[str]:
        """What the server's replication means for an elector (read once, at its start).

        An asynchronous standby can be promoted without the last commits: a renewal the
        old primary acknowledged is lost, and with the lease alone its leader believes on
        it while another wins on the new primary (until that lease's trust ends). The
        liveness lock bounds it (the old leader's trust ended with its pings to the dead
        primary): with ``lock_on``, nothing to say. Unreadable statistics (a role without
        pg_monitor) say nothing.
        """
        if lock_on:
            return []
        query = sa.text("SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'async'")
        try:
            count = self.call(
                lambda conn: conn.execute(query).scalar(),
                table=self.lease,
                write=False,
                timeout=self._connect_timeout,
                connection=None,
            )
        except Exception:
            return []
        if not count:
            return []
        return [
            f"{self.description} streams to {count} asynchronous standby(s): a failover to "
            f"one can lose the last renewal, and with election_liveness off two processes "
            f"may then lead for up to a lease. Keep the liveness lock on, or replicate "
            f"synchronously (docs: Deployment, Deployment topologies)"
        ]

    @property
    def listener_healthy(self) -> bool:
        """Whether NOTIFY wakeups are being delivered now."""
        return self._listener.healthy

    @property
    def listener_statements(self) -> int:
        """Statements sent on the LISTEN connection so far (LISTEN and probes)."""
        return self._listener.statements

    def subscribe_wakeups(
        self, namespace: str, callback: Callable[[Wakeup], None]
    ) -> WakeupHandle | None:
        """Deliver this namespace's lease events to ``callback`` (None in poll-only mode)."""
        if not self.listen:
            return None
        return self._listener.add(namespace, callback)

    def close(self) -> None:
        self._listener.stop()
        super().close()
