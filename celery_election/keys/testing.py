"""Singleton tasks' keys under a test's control: hold a key "elsewhere", see ``on_busy``.

Eagerly (``apply()``, ``task_always_eager``) or in Celery's in-process test worker
(``celery_election.testing.worker``): both run tasks in this process, whose singleton
tasks then hold their keys through this kit's holder, on the kit's database::

    with SingletonKeys() as keys:              # the ``election_keys`` fixture
        keys.hold(report, 7)                   # another worker runs report(7) now
        assert report.apply((7,)).state == "IGNORED"   # on_busy="skip"
        assert keys.busy == [keys.key(report, 7)]      # it found the key held
        keys.release(report, 7)                # that worker is done
        report.apply((7,)).get()               # runs; self.singleton_term grows
        keys.hold(report, 7)
        keys.crash()                           # that worker died: its keys free after delta
        report.apply((7,)).get()               # waits the delta (0.2 s), then runs

The database is a :class:`~celery_election.backends.MemoryBackend` with liveness locks
held until their session closes, as a file lock is (``backend=`` takes a real one, e.g.
``backend_from_url(url)`` after ``install()``). Two
:class:`~celery_election.election.holder.KeyHolder` share it: this process's (every app's
singleton tasks use it while the kit is installed) and "another worker's" (``hold``).
"""

from __future__ import annotations

import threading
import time
from typing import Any

from ..backends.base import Backend
from ..backends.memory import MemoryBackend
from ..core.lease import Lease
from ..election.holder import Held, KeyHolder
from ..errors import ElectionError
from .singleton import set_key_holder

__all__ = ["SingletonKeys"]


class _Recording(KeyHolder):
    """The holder of this process: records what each acquire found (``busy``, ``ran``)."""

    def __init__(self, kit: SingletonKeys, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._kit = kit

    def acquire(self, key: str, *, wait: bool = True) -> Held | None:
        held = super().acquire(key, wait=wait)
        self._kit._saw(key, held)
        return held


class SingletonKeys:
    """Singleton tasks of this process against another worker the test controls.

    ``delta``: the holders' liveness delta, the seconds a crashed holder's keys wait.
    """

    def __init__(
        self,
        backend: Backend | None = None,
        *,
        namespace: str = "default",
        delta: float = 0.2,
        ttl: float = 30.0,
    ) -> None:
        # a holder's lock is lost when its session closes (``crash``), never to a silence:
        # on the real clock a loaded machine left the other worker's pings 0.2 s apart,
        # and the key it held ran here
        self.backend = (
            backend if backend is not None
            else MemoryBackend(liveness=True, silent_holders_lose=False)
        )  # fmt: skip
        self.namespace, self.delta, self.ttl = namespace, delta, ttl
        #: keys a singleton task of this process found held elsewhere (on_busy happened)
        self.busy: list[str] = []
        #: (key, term) of each run of this process that held its key
        self.ran: list[tuple[str, int]] = []
        self._seen = threading.Condition()
        self.mine = _Recording(self, self.backend, namespace, ttl=ttl, liveness=delta,
                               holder_id="this-worker")  # fmt: skip
        self.other = self._other()
        self._holds: dict[str, Held] = {}

    def _other(self) -> KeyHolder:
        return KeyHolder(self.backend, self.namespace, ttl=self.ttl, liveness=self.delta,
                         holder_id="another-worker")  # fmt: skip

    def _saw(self, key: str, held: Held | None) -> None:
        with self._seen:
            if held is None:
                self.busy.append(key)
            else:
                self.ran.append((key, held.term))
            self._seen.notify_all()

    # -- installation -----------------------------------------------------------------------

    def install(self) -> SingletonKeys:
        """Every app's singleton tasks in this process hold keys through this kit."""
        set_key_holder(None, self.mine)
        return self

    def close(self) -> None:
        """Give every app its own holder back; release what the other worker holds."""
        set_key_holder(None, None)  # closes ours
        self.other.close()

    def __enter__(self) -> SingletonKeys:
        return self.install()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the other worker --------------------------------------------------------------------

    @staticmethod
    def key(task: Any, *args: Any, **kwargs: Any) -> str:
        """The key ``task(*args, **kwargs)`` holds (a string key is returned as it is)."""
        if isinstance(task, str):
            return task
        return str(task.key_for(args, kwargs))

    def hold(self, task: Any, *args: Any, **kwargs: Any) -> Held:
        """Another worker holds the key of ``task(*args, **kwargs)`` (or key ``task``) now."""
        key = self.key(task, *args, **kwargs)
        held = self.other.acquire(key, wait=False)
        if held is None:
            raise ElectionError(f"key {key!r} is held already: release it first")
        self._holds[key] = held
        return held

    def release(self, task: Any, *args: Any, **kwargs: Any) -> bool:
        """The other worker's run of that key returns: the key is free at once."""
        held = self._holds.pop(self.key(task, *args, **kwargs), None)
        return held is not None and self.other.release(held)

    def crash(self) -> None:
        """The other worker dies (SIGKILL): its keys free ``delta`` after the next ask."""
        self.other.abandon()
        self._holds.clear()
        self.other = self._other()

    def held(self) -> list[Lease]:
        """Every key held now, as the database says (either worker's)."""
        return self.backend.keys.held(self.namespace)

    # -- waiting on a worker ------------------------------------------------------------------

    def wait_busy(self, task: Any, *args: Any, timeout: float = 10.0, **kwargs: Any) -> None:
        """Wait until a task of this process found that key held (a worker's on_busy)."""
        key = self.key(task, *args, **kwargs)
        self._wait(lambda: key in self.busy, f"a task found {key!r} held", timeout)

    def wait_ran(self, task: Any, *args: Any, timeout: float = 10.0, **kwargs: Any) -> int:
        """Wait until a task of this process held that key; the term it ran with."""
        key = self.key(task, *args, **kwargs)
        self._wait(lambda: any(k == key for k, _ in self.ran), f"a task held {key!r}", timeout)
        return next(t for k, t in reversed(self.ran) if k == key)

    def _wait(self, done: Any, what: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with self._seen:
            while not done():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ElectionError(f"not seen within {timeout} s: {what}")
                self._seen.wait(left)
