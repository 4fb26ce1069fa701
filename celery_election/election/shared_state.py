"""The worker's leadership, shared with its pool children and its embedded beat.

The elector runs in the worker's main process; tasks run in pool children (prefork) or in
threads of the main process. So the main process publishes a 56-byte record in shared
memory and every task reads it: no database query and no message on the task path.

    offset  0  head   u64   write sequence number, written first
            8  flag   u64   1 = leader
           16  term   i64   the fencing token
           24  until  f64   trusted until, on the boot-time clock (CLOCK_BOOTTIME)
           32  token  16 B  the elector's instance token (embedded beat claims ticks
                            with it; it never leaves the worker's own processes)
           48  tail   u64   the same sequence number, written last

A seqlock: the single writer stores ``head``, the payload, then ``tail``; a reader reads
``tail``, the payload, then ``head``, and retries unless both are equal and non-zero, so
it never acts on a torn record (``struct.pack_into`` zeroes bytes before writing them:
readers saw transient zeros thousands of times per million reads; slice assignment of
packed bytes does not). This relies on x86-64 keeping stores in order; on weaker memory
models the trust deadline's margin absorbs a stale read, never a torn one.

A reader is a leader only while ``boottime() < until``: a writer that froze cannot extend
anyone's trust. The record is a file in /dev/shm mapped MAP_SHARED: forked children
inherit the mapping (it has no file descriptor for embedded beat's fd sweep to close);
spawned children attach by the path in ``CELERY_ELECTION_SHM``.
"""

from __future__ import annotations

import os
import struct
import time
from typing import NamedTuple

from ..core import shm
from ..core.clock import boottime

__all__ = ["ENV_VAR", "SharedLeadership", "TrustRecord", "current", "in_use", "use"]

ENV_VAR = "CELERY_ELECTION_SHM"
_PREFIX = "celery-election-"
_SIZE = 56
_SEQ = struct.Struct("=Q")
_PAYLOAD = struct.Struct("=Qqd16s")
_TAIL = slice(48, 56)
_ZERO = b"\0" * 8
_BOOT = getattr(time, "CLOCK_BOOTTIME", None)
_clock_gettime = time.clock_gettime


class TrustRecord(NamedTuple):
    """One consistent reading of the record."""

    leader: bool
    term: int | None
    trusted_until: float
    token: str | None = None

    def trusted(self, now: float | None = None) -> bool:
        """True if this reading says "leader" and its trust window has not ended."""
        return self.leader and (boottime() if now is None else now) < self.trusted_until


class SharedLeadership:
    """The shared record; one writer (the worker's main process), any number of readers."""

    def __init__(self, path: str, *, create: bool) -> None:
        self.path = path
        self._map = shm.map_file(path, _SIZE, create=create)
        # Word views for the per-task check: an aligned 8-byte element is one load.
        self._words = memoryview(self._map).cast("q")
        self._floats = memoryview(self._map).cast("d")
        self._seq = 0
        self.owner = create

    @classmethod
    def create(cls, *, published: bool = True) -> SharedLeadership:
        """A new record in /dev/shm (or the temp dir), published in the environment.

        ``published=False``: for forked children alone (a beat's publishers), not the
        process's record (``current()``) nor that of spawned children.
        """
        base = shm.directory()
        sweep(base)
        path = os.path.join(base, f"{_PREFIX}{os.getpid()}-{os.urandom(6).hex()}")
        record = cls(path, create=True)
        record.write(None, None)
        if published:
            os.environ[ENV_VAR] = path
        return record

    def write(
        self, term: int | None, trusted_until: float | None, token: str | None = None
    ) -> None:
        """Publish leadership (``term``, ``trusted_until``), or its end with (None, None)."""
        self._seq += 1
        seq = _SEQ.pack(self._seq)
        if term is None or trusted_until is None:
            payload = _PAYLOAD.pack(0, 0, 0.0, b"")
        else:
            raw = bytes.fromhex(token) if token else b""
            payload = _PAYLOAD.pack(1, term, trusted_until, raw)
        m = self._map
        m[0:8] = seq
        m[8:48] = payload
        m[_TAIL] = seq

    def read(self) -> TrustRecord:
        """A consistent reading (retries while a write is in progress)."""
        m = self._map
        if m.closed:  # the worker has shut down
            return TrustRecord(False, None, 0.0)
        while True:
            tail = m[_TAIL]
            payload = m[8:48]
            if m[0:8] == tail and tail != _ZERO:
                flag, term, until, raw = _PAYLOAD.unpack(payload)
                if not flag:
                    return TrustRecord(False, None, until)
                return TrustRecord(True, term, until, raw.hex() if raw.strip(b"\0") else None)

    def leader_term(self) -> int | None:
        """The term, if this process's worker leads and trusts it right now.

        The per-task check: the seqlock read of ``read()`` done word by word (tail, flag,
        term, until, head: each an aligned 8-byte load), without building a reading or
        decoding the token.
        """
        w = self._words
        try:
            while True:
                tail = w[6]
                flag = w[1]
                term = w[2]
                until = self._floats[3]
                if w[0] == tail and tail:
                    break
        except ValueError:  # released by close(): the worker has shut down
            return None
        now = _clock_gettime(_BOOT) if _BOOT is not None else boottime()
        return term if flag and now < until else None

    def close(self) -> None:
        """Unmap; the creating process also removes the file."""
        self._words.release()
        self._floats.release()
        shm.unmap(self._map, self.path, owner=self.owner, env_var=ENV_VAR)


def sweep(base: str) -> int:
    """Remove records left by workers that died without cleaning up (SIGKILL, OOM)."""
    return shm.sweep(base, _PREFIX)


_current: SharedLeadership | None = None


def use(record: SharedLeadership | None) -> None:
    """Make ``record`` this process's (and its future children's) record."""
    global _current
    _current = record


def in_use() -> SharedLeadership | None:
    """The record in use in this process, without attaching one from the environment."""
    return _current


def current() -> SharedLeadership | None:
    """Return the process's record: inherited across fork, or attached by path after spawn."""
    global _current
    if _current is None:
        path = os.environ.get(ENV_VAR)
        if path:
            try:
                _current = SharedLeadership(path, create=False)
            except OSError:
                return None
    return _current
