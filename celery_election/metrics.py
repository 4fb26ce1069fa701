"""Prometheus metrics and health probes for electors, beats and leader tasks.

Counting never needs ``prometheus_client``: electors keep plain counters (``ElectorStats``)
and everything else goes to a *store*. Only the exporter (``collector()``, ``serve()``)
imports ``prometheus_client``, lazily, so the package works without the ``metrics`` extra.

Leader tasks run in prefork pool children and the embedded beat in a process of its own,
while one HTTP endpoint serves the worker's main process. So a worker with a metrics port
installs a ``SharedCounters`` table before anything forks: an anonymous-file mapping in
/dev/shm with one row of counters per process. A process claims a free row (or the row of
a dead process, keeping its counts) the first time it counts, then is the only writer of
that row: no lock on the hot path, and the exporter sums the rows, so children replaced by
``--max-tasks-per-child`` still add up. (prometheus_client's multiprocess mode was the
alternative; it picks its value class when first imported, so an app that imported it
before the worker set PROMETHEUS_MULTIPROC_DIR silently counts in each child's memory, and
it leaves one file per child pid to read at every scrape.)

This module is part of the core: it never imports Celery.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import json
import logging
import os
import struct
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from . import shm
from .clock import boottime
from .errors import ConfigurationError

if TYPE_CHECKING:
    from .elector import Elector

__all__ = [
    "INSTALL_HINT",
    "BeatProbe",
    "ElectorStats",
    "LocalCounters",
    "MetricsServer",
    "SharedCounters",
    "collector",
    "count",
    "health",
    "install",
    "require_client",
    "serve",
    "store",
]

log = logging.getLogger("celery_election.metrics")

INSTALL_HINT = "pip install 'celery-election[metrics]'"
ENV_VAR = "CELERY_ELECTION_METRICS_SHM"

#: Histogram buckets of one database call (seconds): calls have a deadline (call_timeout).
BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

# Store keys: a metric name and its label values joined by _SEP. Keys starting with "g:"
# are gauges (the exporter takes the largest value over processes); others are counters.
_SEP = "\x1f"
TASK = "task"  # (TASK, task name, outcome): outcome run / skipped / requeued / raised
BEAT = "beat"  # (BEAT, namespace, entry, what): claimed / sent / refused / publish_failed
TICK = "g:tick"  # (TICK, namespace, "last" | "due"): boot-time clock, microseconds


def require_client() -> None:
    """ConfigurationError (one line with the install command) without prometheus_client."""
    if importlib.util.find_spec("prometheus_client") is None:
        raise ConfigurationError(f"election_metrics_port needs prometheus_client: {INSTALL_HINT}")


def key(*parts: str) -> str:
    """A store key from a metric's parts."""
    return _SEP.join(parts)


# -- stores -----------------------------------------------------------------------------


class LocalCounters:
    """Counts in this process's memory (standalone beat, solo workers, tests)."""

    def __init__(self) -> None:
        self._values: dict[str, int] = {}
        self._lock = threading.Lock()

    def add(self, k: str, n: int = 1) -> None:
        """Add ``n`` to counter ``k``."""
        with self._lock:
            self._values[k] = self._values.get(k, 0) + n

    def set(self, k: str, value: int) -> None:
        """Set gauge ``k``."""
        self._values[k] = value

    def snapshot(self) -> dict[str, int]:
        """Every key's value."""
        with self._lock:
            return dict(self._values)

    def close(self) -> None:
        """Nothing to release."""


_FILE_PREFIX = "celery-election-metrics-"
_HEADER = struct.Struct("=QII")  # magic, keys, rows
_MAGIC = 0x43454C4D45545231  # "CELMETR1"
_KEY_SIZE = 120  # one length byte, then UTF-8
_KEYS = 512
_ROWS = 64


class SharedCounters:
    """Counters shared by a worker's processes (see the module docstring).

    Layout: a 16-byte header, ``_KEYS`` key slots of ``_KEY_SIZE`` bytes, then ``_ROWS``
    rows of (owner pid, one u64 per key). A key slot's length byte is written after its
    text, so a reader never sees half a name. Registering a key and claiming a row take
    ``flock`` on the file (rare: once per key and once per process).
    """

    def __init__(self, path: str, *, create: bool) -> None:
        self.path = path
        self.owner = create
        self._keys_at = _HEADER.size
        self._rows_at = self._keys_at + _KEYS * _KEY_SIZE
        self._row_size = 8 * (1 + _KEYS)
        size = self._rows_at + _ROWS * self._row_size
        self._map = shm.map_file(path, size, create=create)
        if create:
            _HEADER.pack_into(self._map, 0, _MAGIC, _KEYS, _ROWS)
        self._words = memoryview(self._map).cast("Q")
        self._index: dict[str, int] = {}
        self._row: int | None = None  # word offset of this process's row
        self._slots: dict[str, int] = {}  # key -> word offset of its value in that row
        self._warned = False
        _tables.add(self)

    @classmethod
    def create(cls) -> SharedCounters:
        """A new table in /dev/shm (or the temp dir), its path in the environment."""
        base = shm.directory()
        shm.sweep(base, _FILE_PREFIX)  # tables of workers that were SIGKILLed
        path = os.path.join(base, f"{_FILE_PREFIX}{os.getpid()}-{os.urandom(6).hex()}")
        table = cls(path, create=True)
        os.environ[ENV_VAR] = path
        return table

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        fd = os.open(self.path, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    def _key_at(self, i: int) -> str | None:
        at = self._keys_at + i * _KEY_SIZE
        n = self._map[at]
        return self._map[at + 1 : at + 1 + n].decode() if n else None

    def _register(self, k: str) -> int | None:
        raw = k.encode()[: _KEY_SIZE - 1]
        with self._locked():
            for i in range(_KEYS):
                found = self._key_at(i)
                if found is None:
                    at = self._keys_at + i * _KEY_SIZE
                    self._map[at + 1 : at + 1 + len(raw)] = raw
                    self._map[at] = len(raw)  # last: readers see whole names only
                    found = raw.decode(errors="ignore")
                if found == raw.decode(errors="ignore"):
                    self._index[k] = i
                    return i
        self._warn("all %d metric keys are taken; %r is not counted", _KEYS, k)
        return None

    def _claim(self) -> int | None:
        """Claim a row for this process: a free one or a dead process's (its counts carry on)."""
        pid = os.getpid()
        with self._locked():
            for r in range(_ROWS):
                at = (self._rows_at + r * self._row_size) // 8
                owner = self._words[at]
                if owner not in (0, pid) and shm.alive(owner):
                    continue
                self._words[at] = pid
                self._row = at + 1
                return self._row
        self._warn("all %d metric rows are taken by live processes; not counted", _ROWS)
        return None

    def _warn(self, msg: str, *args: Any) -> None:
        if not self._warned:
            self._warned = True
            log.warning("metrics: " + msg, *args)

    def add(self, k: str, n: int = 1) -> None:
        """Add ``n`` to counter ``k`` in this process's row (the only writer of it)."""
        at = self._slots.get(k)  # emptied in a forked child (_forget_rows)
        if at is None:
            self._slow(k, n, add=True)
            return
        self._words[at] += n

    def set(self, k: str, value: int) -> None:
        """Set gauge ``k`` (a ``g:`` key) in this process's row."""
        self._slow(k, max(0, value), add=False)

    def _slow(self, k: str, n: int, *, add: bool) -> None:
        row = self._row
        if row is None:
            row = self._claim()
            if row is None:
                return
        i = self._index.get(k)
        if i is None:
            i = self._register(k)
            if i is None:
                return
        self._slots[k] = row + i
        if add:
            self._words[row + i] += n
        else:
            self._words[row + i] = n

    def snapshot(self) -> dict[str, int]:
        """Counters summed over rows, gauges the largest over rows."""
        if self._map.closed:
            return {}
        names = [self._key_at(i) for i in range(_KEYS)]
        out: dict[str, int] = {}
        for r in range(_ROWS):
            at = (self._rows_at + r * self._row_size) // 8
            if self._words[at] == 0:
                continue
            for i, name in enumerate(names):
                if name is None:
                    continue
                v = self._words[at + 1 + i]
                if name.startswith("g:"):
                    out[name] = max(out.get(name, 0), v)
                else:
                    out[name] = out.get(name, 0) + v
        return out

    def close(self) -> None:
        """Unmap; the creating process also removes the file."""
        self._words.release()
        shm.unmap(self._map, self.path, owner=self.owner, env_var=ENV_VAR)


_tables: weakref.WeakSet[SharedCounters] = weakref.WeakSet()


def _forget_rows() -> None:
    """In a forked child: the parent's rows are not ours; claim one at the first count."""
    for table in list(_tables):
        table._row = None
        table._slots = {}


os.register_at_fork(after_in_child=_forget_rows)


Store = LocalCounters | SharedCounters
_store: Store | None = None


def install(new: Store | None) -> Store | None:
    """Make ``new`` this process's store (None: stop counting); returns the old one."""
    global _store
    old, _store = _store, new
    return old


def store() -> Store | None:
    """The store of this process; a spawned child attaches to its worker's table by path."""
    global _store
    if _store is None and ENV_VAR in os.environ:
        with contextlib.suppress(OSError):
            _store = SharedCounters(os.environ[ENV_VAR], create=False)
    return _store


def count(k: str, n: int = 1) -> None:
    """Add to a counter if metrics are on in this process (else nothing: ~50 ns)."""
    s = _store
    if s is not None:
        s.add(k, n)


def set_gauge(k: str, value: int) -> None:
    """Set a gauge if metrics are on in this process."""
    s = _store
    if s is not None:
        s.set(k, value)


# -- electors ---------------------------------------------------------------------------


class ElectorStats:
    """An elector's own counters, kept whether or not anything exports them (cheap)."""

    def __init__(self) -> None:
        self.transitions: dict[tuple[str, str], int] = {}
        self.failures: dict[str, int] = {}
        #: operation -> (bucket counts, sum of seconds, count)
        self.calls: dict[str, tuple[list[int], float, int]] = {}
        #: boot-time clock: when the election thread went busy (None: waiting or stopped)
        self.busy_since: float | None = None
        self.last_progress = boottime()
        self.calls_ok = 0

    def transition(self, kind: str, reason: str) -> None:
        """Count a change of belief."""
        k = (kind, reason)
        self.transitions[k] = self.transitions.get(k, 0) + 1

    def call(self, op: str, seconds: float, ok: bool) -> None:
        """Record one database call."""
        buckets, total, n = self.calls.get(op) or ([0] * len(BUCKETS), 0.0, 0)
        for i, bound in enumerate(BUCKETS):
            if seconds <= bound:
                buckets[i] += 1
                break
        self.calls[op] = (buckets, total + seconds, n + 1)
        if ok:
            self.calls_ok += 1
        else:
            self.failures[op] = self.failures.get(op, 0) + 1


_electors: weakref.WeakSet[Elector] = weakref.WeakSet()


def track(elector: Elector) -> None:
    """Export ``elector`` from this process (every Elector calls this)."""
    _electors.add(elector)


def electors() -> list[Elector]:
    """The electors of this process that have been started and not stopped."""
    return [e for e in list(_electors) if e._started]


# -- health -----------------------------------------------------------------------------


def tick_late(values: dict[str, int], namespace: str, now: float) -> float | None:
    """Seconds the beat's tick loop is late for the tick it announced (0: on time).

    None when the beat has neither ticked nor been given a start-up allowance. Late, not
    age: a sparse schedule sleeps long between ticks on purpose, and says so.
    """
    due_us = values.get(key(TICK, namespace, "due"))
    if not due_us:
        # never ticked: late once the start-up allowance ("start") has passed
        due_us = values.get(key(TICK, namespace, "start"))
        if not due_us:
            return None
    return max(0.0, now - due_us / 1e6)


class BeatProbe:
    """The tick loop of one beat (embedded: read from the worker's shared table)."""

    def __init__(self, namespace: str, grace: float) -> None:
        self.namespace = namespace
        #: the loop is wedged once this many seconds late for its next tick
        self.grace = grace

    def check(self, values: dict[str, int], now: float) -> str | None:
        """None if the tick loop is on time, else why not."""
        late = tick_late(values, self.namespace, now)
        if late is not None and late > self.grace:
            return f"beat tick loop of {self.namespace!r} is {late:.1f}s late"
        return None


def elector_problem(e: Elector, now: float) -> str | None:
    """None if the election thread makes progress, else why not.

    Wedged: busy (not waiting) in one round for longer than 3 x ttl; every database
    call has a deadline (call_timeout < ttl) and a round makes at most three.
    """
    thread = e._thread
    if thread is None or not thread.is_alive():
        return f"election thread of {e.namespace!r} is not running"
    busy = e.stats.busy_since
    if busy is not None and now - busy > 3 * e.config.ttl:
        return f"election thread of {e.namespace!r} busy for {now - busy:.1f}s"
    return None


def health(
    electors_: list[Elector], beats: list[BeatProbe], values: dict[str, int] | None = None
) -> tuple[bool, bool, list[str]]:
    """(healthy, ready, problems): ready is healthy and each elector reached its database.

    A follower is ready: readiness says "this process takes part in the election", not
    "this process leads".
    """
    now = boottime()
    problems: list[str] = []
    for e in electors_:
        p = elector_problem(e, now)
        if p:
            problems.append(p)
    snap = values if values is not None else _snapshot()
    for b in beats:
        p = b.check(snap, now)
        if p:
            problems.append(p)
    healthy = not problems
    waiting = [e.namespace for e in electors_ if not e.stats.calls_ok or e._failures]
    ready = healthy and not waiting and bool(electors_ or beats)
    if healthy and waiting:
        problems.append(f"not ready: no answer from the election database for {waiting}")
    return healthy, ready, problems


def _snapshot() -> dict[str, int]:
    s = _store
    return s.snapshot() if s is not None else {}


# -- export -----------------------------------------------------------------------------

PREFIX = "celery_election_"


def collector(extra_labels: dict[str, str] | None = None) -> Any:
    """A prometheus_client collector of this process's electors and store."""
    require_client()
    from prometheus_client.core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
    )

    class ElectionCollector:
        def collect(self) -> Iterator[Any]:
            now = boottime()
            lab = ["namespace", "candidate"]
            leading = GaugeMetricFamily(
                PREFIX + "leading", "1 while this elector leads", labels=lab
            )
            term = GaugeMetricFamily(
                PREFIX + "term", "the term this elector leads, or the last term it saw", labels=lab
            )
            trust = GaugeMetricFamily(
                PREFIX + "trust_left_seconds", "seconds before the leader stops trusting its lease",
                labels=lab,
            )  # fmt: skip
            trans = CounterMetricFamily(
                PREFIX + "transitions", "changes of leadership", labels=[*lab, "kind", "reason"]
            )
            fails = CounterMetricFamily(
                PREFIX + "call_failures", "failed database calls", labels=[*lab, "operation"]
            )
            calls = HistogramMetricFamily(
                PREFIX + "call_duration_seconds", "database call duration",
                labels=[*lab, "operation"],
            )  # fmt: skip
            for e in electors():
                ids = [e.namespace, e.candidate_id]
                lead = e._lead
                leading.add_metric(ids, 1.0 if e.is_leader else 0.0)
                seen = e.last_lease
                t = lead.term if lead is not None else (seen.term if seen is not None else 0)
                term.add_metric(ids, float(t))
                trust.add_metric(
                    ids, max(0.0, lead.trusted_until - now) if lead is not None else 0.0
                )
                s = e.stats
                for (kind, reason), n in sorted(s.transitions.items()):
                    trans.add_metric([*ids, kind, reason], float(n))
                for op, n in sorted(s.failures.items()):
                    fails.add_metric([*ids, op], float(n))
                for op, (buckets, total, n) in sorted(s.calls.items()):
                    cumulative, acc = [], 0
                    for bound, c in zip(BUCKETS, buckets, strict=True):
                        acc += c
                        cumulative.append((str(bound), float(acc)))
                    cumulative.append(("+Inf", float(n)))
                    calls.add_metric([*ids, op], cumulative, total)
            yield from (leading, term, trust, trans, fails, calls)
            yield from _store_families(_snapshot(), now)

    def _store_families(values: dict[str, int], now: float) -> Iterator[Any]:
        tasks = CounterMetricFamily(
            PREFIX + "leader_tasks",
            "leader task runs by outcome (run, or on a follower: skipped, requeued, raised)",
            labels=["task", "outcome"],
        )
        beat: dict[str, Any] = {
            what: CounterMetricFamily(
                PREFIX + f"beat_runs_{what}", doc, labels=["namespace", "entry"]
            )
            for what, doc in (
                ("claimed", "runs this beat claimed in the shared state"),
                ("sent", "runs this beat sent"),
                ("refused", "runs not sent: another leader had claimed them"),
                ("publish_failed", "claimed runs whose send raised"),
            )
        }
        age = GaugeMetricFamily(
            PREFIX + "beat_tick_age_seconds",
            "seconds since the beat's tick loop last ran",
            labels=["namespace"],
        )
        late = GaugeMetricFamily(
            PREFIX + "beat_tick_late_seconds",
            "seconds the beat's tick loop is late for the tick it announced (alert on this)",
            labels=["namespace"],
        )
        beats: set[str] = set()
        for k, v in sorted(values.items()):
            parts = k.split(_SEP)
            if parts[0] == TASK and len(parts) == 3:
                tasks.add_metric(parts[1:], float(v))
            elif parts[0] == BEAT and len(parts) == 4 and parts[3] in beat:
                beat[parts[3]].add_metric(parts[1:3], float(v))
            elif parts[0] == TICK and len(parts) == 3:
                beats.add(parts[1])
                if parts[2] == "last" and v:
                    age.add_metric([parts[1]], max(0.0, now - v / 1e6))
        for ns in sorted(beats):
            seconds = tick_late(values, ns, now)
            if seconds is not None:
                late.add_metric([ns], seconds)
        yield tasks
        yield from beat.values()
        yield age
        yield late

    return ElectionCollector()


def render() -> tuple[bytes, str]:
    """(body, content type) of /metrics for this process."""
    require_client()
    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector())
    return generate_latest(registry), CONTENT_TYPE_LATEST


class MetricsServer:
    """/metrics, /healthz and /readyz on one port, served by a daemon thread."""

    def __init__(
        self,
        port: int,
        *,
        host: str = "",
        probe: Callable[[], tuple[bool, bool, list[str]]] | None = None,
    ) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        require_client()
        self.probe = probe or (lambda: health(electors(), []))
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                try:
                    if path == "/metrics":
                        body, ctype = render()
                        self._send(200, body, ctype)
                    elif path in ("/healthz", "/readyz"):
                        healthy, ready, problems = owner.probe()
                        ok = healthy if path == "/healthz" else ready
                        text = json.dumps({"ok": ok, "healthy": healthy, "ready": ready,
                                           "problems": problems})  # fmt: skip
                        self._send(200 if ok else 503, text.encode(), "application/json")
                    else:
                        self._send(404, b"not found: try /metrics, /healthz or /readyz\n")
                except Exception as exc:  # a probe must answer, never hang up
                    log.exception("metrics: %s failed", path)
                    self._send(500, f"{type(exc).__name__}: {exc}\n".encode())

            def _send(self, status: int, body: bytes, ctype: str = "text/plain") -> None:
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # scrapes every few seconds would flood the worker's log

        self.httpd = ThreadingHTTPServer((host, port), Handler)
        self.httpd.daemon_threads = True
        _servers.add(self)
        self.port = self.httpd.server_address[1]
        self._thread = threading.Thread(
            target=self.httpd.serve_forever, name="celery-election-metrics", daemon=True
        )

    def start(self) -> MetricsServer:
        """Serve in the background."""
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving and free the port (also when never started)."""
        if self._thread.is_alive():
            self.httpd.shutdown()  # waits for serve_forever, which must be running
        self.httpd.server_close()


_servers: weakref.WeakSet[MetricsServer] = weakref.WeakSet()


def _close_inherited_servers() -> None:
    """In a forked child (a prefork pool process): close our copy of the listening socket.

    The child never serves; holding the port would keep it taken after the worker that
    bound it died (SIGKILL), until the last child exited.
    """
    for server in list(_servers):
        with contextlib.suppress(OSError):
            server.httpd.socket.close()
    _servers.clear()


os.register_at_fork(after_in_child=_close_inherited_servers)


def bind(port: int, probe: Callable[[], tuple[bool, bool, list[str]]]) -> MetricsServer:
    """Take the port now and serve later (``start()``).

    So a worker or beat whose port is taken ends with one line before it campaigns.
    """
    try:
        return MetricsServer(port, probe=probe)
    except OSError as exc:
        raise ConfigurationError(
            f"cannot serve metrics on port {port}: {exc.strerror or exc}, another process has it?"
        ) from exc


def serve(port: int, *, host: str = "") -> MetricsServer:
    """Serve this process's electors' metrics and probes, e.g. next to a bare Elector."""
    return MetricsServer(port, host=host).start()


def tick_due_key(namespace: str) -> str:
    """The store key of a beat's next expected tick."""
    return key(TICK, namespace, "due")


def mark_tick(namespace: str, next_in: float) -> None:
    """A beat's tick loop went round; it expects to go round again in ``next_in`` s."""
    s = _store
    if s is None:
        return
    now = boottime()
    s.set(key(TICK, namespace, "last"), int(now * 1e6))
    s.set(key(TICK, namespace, "due"), int((now + next_in) * 1e6))


def allow_start(namespace: str, seconds: float) -> None:
    """Give a beat that has not ticked yet ``seconds`` to start before it counts as late."""
    set_gauge(key(TICK, namespace, "start"), int((boottime() + seconds) * 1e6))
