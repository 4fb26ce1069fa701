"""The elector processes of peers.py: one per child, each reporting its belief.

Each runs one elector library the way its users run it (celery-election, a hand-written
advisory-lock elector, tooz's PostgreSQL lock, notifelect) and reports "I lead" / "I do
not" as JSON lines to the parent (harness.events); celery-election also reports its trust
deadline, so that a stopped process's belief ends there.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import hashlib
import threading
import time
from typing import Any

import _root  # noqa: F401  (the repository root on sys.path: harness)
import psycopg

from celery_election import Elector, backend_from_url
from celery_election.backends.base import Backend
from celery_election.core.clock import boottime
from harness import events as _events
from harness.events import emit


def advisory_key(prefix: str) -> int:
    """A signed 64-bit advisory lock key of this run, so runs never share a lock."""
    digest = hashlib.blake2b(prefix.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


class Reporter:
    """Reports changes of this process's belief ("I lead" / "I do not") to the parent."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.lock = threading.Lock()
        self.leading = False
        self.stopping = False
        self.term = 0

    def elected(self, at: float, term: int | None = None) -> None:
        with self.lock:
            if self.leading or self.stopping:
                return
            self.leading = True
            self.term = term if term is not None else self.term + 1
            emit({"event": "elected", "cand": self.name, "term": self.term, "at": at})

    def revoked(self, at: float, reason: str) -> None:
        with self.lock:
            if not self.leading:
                return
            self.leading = False
            emit({"event": "revoked", "cand": self.name, "reason": reason, "at": at})

    def stop(self, at: float) -> None:
        """The process was asked to stop: its belief ends now, whatever the library does."""
        self.revoked(at, "stopped")
        with self.lock:
            self.stopping = True


def run_celery_election(
    args: argparse.Namespace,
    stop: threading.Event,
    rep: Reporter,
    shared: Backend | None = None,
) -> None:
    """One Elector; on its own backend, or on ``shared`` (the process's, left open)."""
    backend = shared or backend_from_url(args.url, table_prefix=args.prefix, listen=True)
    elector = Elector(backend, args.ns, args.child, ttl=args.ttl)
    sub = elector.subscribe()

    def trust(term: int | None, until: float | None) -> None:
        # Its belief ends at this deadline even if the process is stopped before it can
        # say so (boot-time clock, as every report): the parent cuts its span there.
        if until is not None:
            emit({"event": "trust", "cand": args.child, "until": until})

    elector.watch_trust(trust)

    def read() -> None:
        for tr in sub:
            if tr.kind == "elected":
                rep.elected(tr.at, tr.term)
            else:
                rep.revoked(tr.at, tr.reason.value if tr.reason else "?")

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        elector.start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not stop.is_set():
            if elector.last_lease is not None or elector.is_leader:
                break
            stop.wait(0.02)
        emit({"event": "ready", "at": boottime()})
        stop.wait()
        # Elector.stop() drops the belief (the revoke the reader reports), then resigns.
        elector.stop()
        reader.join(5)
        rep.stop(boottime())
    finally:
        if shared is None:
            backend.close()


def run_advisory(args: argparse.Namespace, stop: threading.Event, rep: Reporter) -> None:
    key = advisory_key(args.prefix)
    conn: psycopg.Connection[Any] | None = None
    ready = False
    while not stop.is_set():
        try:
            if conn is None:
                conn = psycopg.connect(args.url, autocommit=True, connect_timeout=5)
            if not rep.leading:
                row = conn.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone()
                if row is not None and row[0]:
                    rep.elected(boottime())
            else:
                conn.execute("SELECT 1")  # a leader that lost its session must step down
        except psycopg.Error as exc:
            rep.revoked(boottime(), f"connection lost: {type(exc).__name__}")
            if conn is not None:
                with contextlib.suppress(Exception):
                    conn.close()
            conn = None
        if not ready:
            ready = True
            emit({"event": "ready", "at": boottime()})
        stop.wait(args.poll)
    rep.stop(boottime())
    if conn is not None:
        with contextlib.suppress(psycopg.Error):
            conn.execute("SELECT pg_advisory_unlock(%s)", (key,))
        conn.close()


def run_tooz(args: argparse.Namespace, stop: threading.Event, rep: Reporter) -> None:
    """tooz's PostgreSQL driver as its users run it: block on the lock, lead while held.

    Its lock is a session advisory lock on a psycopg2 connection of its own; tooz offers
    no way to learn that the session ended, so a leader leads until it stops.
    """
    import warnings

    from tooz import coordination

    warnings.simplefilter("ignore", DeprecationWarning)  # "PostgreSQL driver is deprecated"
    url = args.url.replace("postgresql+psycopg://", "postgresql://")
    coord = coordination.get_coordinator(url, args.child.encode())
    coord.start()
    lock = coord.get_lock(f"{args.prefix}leader".encode())

    def hold() -> None:
        try:
            if lock.acquire(blocking=True):
                rep.elected(boottime())
        except Exception as exc:  # the connection died while waiting: tooz raises
            rep.revoked(boottime(), f"lock wait failed: {type(exc).__name__}")

    threading.Thread(target=hold, daemon=True).start()
    emit({"event": "ready", "at": boottime()})
    while not stop.wait(args.poll):
        coord.heartbeat()  # what a tooz user calls periodically (a no-op on PostgreSQL)
    rep.stop(boottime())
    with contextlib.suppress(Exception):
        lock.release()
    coord.stop()


def run_notifelect(args: argparse.Namespace, stop: threading.Event, rep: Reporter) -> None:
    import asyncpg  # type: ignore[import-untyped]
    from notifelect.election_manager import Coordinator, Outcome

    ready = threading.Event()

    class ReportingOutcome(Outcome):
        """notifelect's Outcome, reporting each assignment of ``winner`` as it happens."""

        def __setattr__(self, name: str, value: Any) -> None:
            super().__setattr__(name, value)
            if name == "winner" and getattr(self, "watch", False):
                if value:
                    rep.elected(boottime())
                else:
                    rep.revoked(boottime(), "outranked")
                if not ready.is_set():
                    ready.set()
                    emit({"event": "ready", "at": boottime()})

    async def main() -> None:
        conn = await asyncpg.connect(args.url)

        # notifelect does not reconnect: a session the server ends leaves this process
        # deaf for good. Say so, so that the parent can tell it from a slow election.
        def lost(*_: Any) -> None:
            if not rep.stopping:  # also called when we close it ourselves
                emit({"event": "conn_lost", "at": boottime(), "cand": args.child})

        conn.add_termination_listener(lost)
        try:
            coordinator = Coordinator(
                conn,
                namespace=args.ns,
                election_interval=datetime.timedelta(seconds=args.ne_interval),
                election_timeout=datetime.timedelta(seconds=args.ne_timeout),
            )
            outcome = ReportingOutcome()
            object.__setattr__(outcome, "watch", True)
            coordinator.outcome = outcome
            async with coordinator:
                await asyncio.to_thread(stop.wait)
                rep.stop(boottime())
            # __aexit__ waits for the current election round to end before returning.
        finally:
            await conn.close()

    asyncio.run(main())


#: The elector each ``--kind`` runs.
RUNNERS = {
    "celery-election": run_celery_election,
    "advisory": run_advisory,
    "tooz": run_tooz,
    "notifelect": run_notifelect,
}


def child_main(args: argparse.Namespace) -> int:
    stop = _events.start_child(args.child)
    _events.read_commands(stop)
    rep = Reporter(args.child)
    run = RUNNERS[args.kind]
    run(args, stop, rep)
    emit({"event": "stopped", "at": boottime()})
    return 0


def scale_child_main(args: argparse.Namespace) -> int:
    """``--threads`` candidates of ``--kind`` in this process, one thread each (scale mode).

    Thread i is candidate ``<child>-t<i>`` and connects to ``--urls``[i] (one proxy port per
    candidate), or to ``--url``. Threads start ``--stagger`` seconds apart. celery-election
    with ``--shared-backend`` runs every Elector of the process on one backend.
    """
    stop = _events.start_child(args.child)
    _events.read_commands(stop)
    urls = args.urls.split(",") if args.urls else [args.url] * args.threads
    run = RUNNERS[args.kind]
    shared: Backend | None = None
    if args.kind == "celery-election" and args.shared_backend:
        shared = backend_from_url(urls[0], table_prefix=args.prefix, listen=True)

    def one(i: int) -> None:
        mine = argparse.Namespace(**vars(args))
        mine.child = f"{args.child}-t{i}"
        mine.url = urls[i]
        rep = Reporter(mine.child)
        try:
            if shared is not None:
                run_celery_election(mine, stop, rep, shared)
            else:
                run(mine, stop, rep)
        except Exception as exc:  # one candidate failing must not hide the others
            emit({"event": "thread_error", "cand": mine.child, "error": repr(exc)})

    threads = []
    for i in range(args.threads):
        if stop.is_set():
            break
        t = threading.Thread(target=one, args=(i,), name=f"cand-{i}", daemon=True)
        t.start()
        threads.append(t)
        stop.wait(args.stagger)
    stop.wait()
    for t in threads:
        t.join(30)
    if shared is not None:
        shared.close()
    emit({"event": "stopped", "at": boottime()})
    return 0
