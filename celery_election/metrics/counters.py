"""Counters of leader tasks and beats: the store of one process, or shared by a worker's.

Counting never needs ``prometheus_client``: everything but the electors' own counters
(``stats.ElectorStats``) goes to a *store*, and ``count()`` is a no-op until one is in
use (``use_counters``).

Leader tasks run in prefork pool children and the embedded beat in a process of its own,
while one HTTP endpoint serves the worker's main process. So a worker with a metrics port
puts a ``SharedCounters`` table in use before anything forks: an anonymous-file mapping in
/dev/shm with one row of counters per process. A process claims a free row (or the row of
a dead process, keeping its counts) the first time it counts, then is the only writer of
that row: no lock on the hot path, and the exporter sums the rows, so children replaced by
``--max-tasks-per-child`` still add up. (prometheus_client's multiprocess mode was the
alternative; it picks its value class when first imported, so an app that imported it
before the worker set PROMETHEUS_MULTIPROC_DIR silently counts in each child's memory, and
it leaves one file per child pid to read at every scrape.)

Part of the core: it never imports Celery.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import struct
import threading
import weakref
from collections.abc import Iterator
from typing import Any

from ..core import shm

__all__ = [
    "BEAT",
    "ENV_VAR",
    "KEY",
    "TASK",
    "TICK",
    "LocalCounters",
    "SharedCounters",
    "Store",
    "count",
    "in_use",
    "key",
    "set_gauge",
    "store",
    "use_counters",
    "values",
]

log = logging.getLogger("celery_election.metrics")

ENV_VAR = "CELERY_ELECTION_METRICS_SHM"

# Store keys: a metric name and its label values joined by _SEP. Keys starting with "g:"
# are gauges (the exporter takes the largest value over processes); others are counters.
_SEP = "\x1f"
TASK = "task"  # (TASK, task name, outcome): outcome run / skipped / requeued / raised
BEAT = "beat"  # (BEAT, namespace, entry, what): claimed / sent / refused / publish_failed / held,
# and for the operable schedule: missed / skipped_overlap / run_now / late_ms
KEY = "key"  # (KEY, task name, what): a singleton task's run / skipped / requeued / raised,
# ended (run - ended: keys held now), waited and wait_ms (a dead holder's key), hold_ms
TICK = "g:tick"  # (TICK, namespace, "last" | "due" | "start"): boot-time clock, microseconds


def key(*parts: str) -> str:
    """A store key from a metric's parts."""
    return _SEP.join(parts)


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


def use_counters(new: Store | None) -> Store | None:
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


def in_use() -> Store | None:
    """The store in use in this process, without attaching one (None: metrics off)."""
    return _store


def values() -> dict[str, int]:
    """Every key's value in this process's store ({} when metrics are off)."""
    s = _store
    return s.snapshot() if s is not None else {}


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
