"""The elector processes of failover.py.

K electors per child; their calls and statements are counted and charged to the elector
that sent them, and their transitions reported as JSON lines (harness.events).
"""

from __future__ import annotations

import argparse
import collections
import json
import threading
import time
from collections.abc import Callable
from typing import Any

import _root  # noqa: F401  (the repository root on sys.path: harness)
import sqlalchemy as sa

from celery_election import Elector, backend_from_url
from celery_election.core.clock import boottime
from harness import events as _events
from harness.events import emit

_current = threading.local()


class Counts:
    """What one elector (or nobody, for the process's unattributed bucket) sent."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.verbs: collections.Counter[str] = collections.Counter()
        self.calls: collections.Counter[str] = collections.Counter()
        self.tx = 0
        self.elected = 0
        self.revoked = 0

    def view(self) -> dict[str, Any]:
        with self.lock:
            return {
                **_events.verb_view(dict(self.verbs)),
                "tx": self.tx,
                "calls": dict(self.calls),
                "elected": self.elected,
                "revoked": self.revoked,
            }


class CountingBackend:
    """A per-elector view of a (possibly shared) backend that counts what it is asked.

    While a call runs, the calling thread is marked as this elector's, so the engine's
    statement listener charges the statements to it.
    """

    def __init__(self, inner: Any, counts: Counts) -> None:
        self._inner = inner
        self._counts = counts
        # An instance attribute: runtime_checkable protocols look attributes up statically.
        self.description = inner.description

    def _call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        with self._counts.lock:
            self._counts.calls[name] += 1
        previous = getattr(_current, "counts", None)
        _current.counts = self._counts
        start = boottime()
        try:
            result = getattr(self._inner, name)(*args, **kwargs)
        finally:
            _current.counts = previous
        # Handoff breakdown: when the resign ran, and when the winning elect was sent.
        won = getattr(result, "won", False)
        if name == "resign" or (name in ("elect", "take_over") and won):
            emit({"event": "call", "name": name, "start": start, "end": boottime()})
        return result

    def install(self) -> None:
        self._inner.install()

    def uninstall(self) -> None:
        self._inner.uninstall()

    def elect(self, *args: Any, **kwargs: Any) -> Any:
        return self._call("elect", *args, **kwargs)

    def renew(self, *args: Any, **kwargs: Any) -> Any:
        return self._call("renew", *args, **kwargs)

    def resign(self, *args: Any, **kwargs: Any) -> Any:
        return self._call("resign", *args, **kwargs)

    def take_over(self, *args: Any, **kwargs: Any) -> Any:
        return self._call("take_over", *args, **kwargs)

    def current(self, *args: Any, **kwargs: Any) -> Any:
        return self._call("current", *args, **kwargs)

    def register(self, *args: Any, **kwargs: Any) -> Any:
        return self._call("register", *args, **kwargs)

    def unregister(self, *args: Any, **kwargs: Any) -> Any:
        return self._call("unregister", *args, **kwargs)

    def candidates(self, *args: Any, **kwargs: Any) -> Any:
        return self._call("candidates", *args, **kwargs)

    def prune(self, *args: Any, **kwargs: Any) -> Any:
        return self._call("prune", *args, **kwargs)

    def subscribe_wakeups(self, namespace: str, callback: Callable[[], None]) -> Any:
        return self._inner.subscribe_wakeups(namespace, callback)

    def close(self) -> None:
        """The shared backend is closed by the child's main, not per elector."""

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def count_statements(engine: sa.Engine, unattributed: Counts) -> None:
    def before_cursor_execute(conn, cursor, statement, parameters, context, executemany):
        counts = getattr(_current, "counts", None) or unattributed
        verb = statement.lstrip().split(None, 1)[0].upper() if statement.strip() else "?"
        with counts.lock:
            counts.verbs[verb] += 1

    def on_tx_end(conn: Any) -> None:
        counts = getattr(_current, "counts", None) or unattributed
        with counts.lock:
            counts.tx += 1

    sa.event.listen(engine, "before_cursor_execute", before_cursor_execute)
    sa.event.listen(engine, "commit", on_tx_end)
    sa.event.listen(engine, "rollback", on_tx_end)


def child_main(args: argparse.Namespace) -> int:
    name = args.child
    stop = _events.start_child(name)

    options: dict[str, Any] = json.loads(args.backend_options)
    timings: dict[str, Any] = {"ttl": args.ttl}
    if "liveness" in options:  # an Elector setting, carried with the backend's options
        timings["liveness"] = options.pop("liveness")
    k = args.electors
    if k > 1:
        options["engine_options"] = {"pool_size": 2, "max_overflow": 2}
    backend = backend_from_url(args.url, table_prefix=args.prefix, **options)
    unattributed = Counts()
    count_statements(backend.engine, unattributed)

    electors: list[Elector] = []
    counts: list[Counts] = []
    readers: list[threading.Thread] = []
    for i in range(k):
        cid = name if k == 1 else f"{name}.{i}"
        c = Counts()
        elector = Elector(CountingBackend(backend, c), args.ns, cid, **timings)
        sub = elector.subscribe()

        def read(sub: Any = sub, i: int = i, cid: str = cid, c: Counts = c) -> None:
            for tr in sub:
                with c.lock:
                    if tr.kind == "elected":
                        c.elected += 1
                    else:
                        c.revoked += 1
                emit(
                    {
                        "event": tr.kind,
                        "idx": i,
                        "cand": cid,
                        "term": tr.term,
                        "reason": tr.reason.value if tr.reason else None,
                        "at": tr.at,
                    }
                )

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        electors.append(elector)
        counts.append(c)
        readers.append(reader)

    def snapshot(req: str) -> None:
        emit(
            {
                "event": "snap",
                "req": req,
                "at": boottime(),
                "cpu": time.process_time(),
                "listener": getattr(backend, "listener_statements", None),
                "listener_healthy": getattr(backend, "listener_healthy", None),
                "unattributed": unattributed.view(),
                "electors": [
                    {"idx": i, "cand": e.candidate_id, "leader": e.is_leader, **c.view()}
                    for i, (e, c) in enumerate(zip(electors, counts, strict=True))
                ],
            }
        )

    go = threading.Event()

    def command(cmd: str, rest: str) -> None:
        if cmd == "snap":
            snapshot(rest)
        elif cmd == "go":
            go.set()

    _events.read_commands(stop, command)
    try:
        if getattr(args, "hold", False):
            # The matrix's "after an election": every process is built (imports done,
            # backend made) before any elector starts, then all start on one "go".
            emit({"event": "held", "at": boottime()})
            while not go.wait(0.05) and not stop.is_set():
                pass
        for elector in electors:
            elector.start()
        # Ready once every elector has made its first election step.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not stop.is_set():
            if all(e.last_lease is not None or e.is_leader for e in electors):
                break
            time.sleep(0.02)
        emit(
            {
                "event": "ready",
                "at": boottime(),
                "cands": [e.candidate_id for e in electors],
                "ok": all(e.last_lease is not None for e in electors),
                # diagnostics only: did subscribe_wakeups give this elector a handle?
                "wakeups": [getattr(e, "_wakeup", None) is not None for e in electors],
            }
        )
        while not stop.wait(1.0):
            pass
        stoppers = [threading.Thread(target=e.stop) for e in electors]
        for t in stoppers:
            t.start()
        for t in stoppers:
            t.join()
        emit({"event": "stopped", "at": boottime()})
        for reader in readers:
            reader.join(5)
    finally:
        backend.close()
    return 0
