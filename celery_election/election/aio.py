"""``AsyncElector``: the Elector for asyncio services (FastAPI, aiohttp, an ASGI lifespan).

The election still runs on the Elector's own threads: every database call happens there,
so a stalled database can never block the event loop. What crosses into the loop is only
news (``loop.call_soon_threadsafe``): leadership gained or lost, errors, transitions.
Whatever may block (``start``, ``stop`` with its resign, ``resign``) runs in the loop's
default executor.

::

    async with AsyncElector(backend, "reports", ttl=10) as elector:
        if await elector.wait_for_leadership(timeout=30):
            ...
        async for transition in elector.transitions():
            print(transition.kind, transition.term)

``is_leader``, ``term`` and ``leader_id`` read memory only, as on the Elector. Callbacks
(``on_elected(term)``, ``on_revoked(term, reason)``, ``on_error(exc)``) run on the loop;
a coroutine function's coroutine is scheduled as a task.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from ..backends.base import Backend
from ..core.lease import Lease
from .elector import Elector, ElectorOptions, State, Subscription, Transition

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing's own from Python 3.11

__all__ = ["AsyncElector"]

#: How long one blocking ``get`` of a transition waits in the executor before it looks
#: whether the iterator was closed.
_POLL = 0.5


class AsyncElector:
    """An :class:`~celery_election.election.elector.Elector` driven from an event loop."""

    def __init__(
        self,
        backend: Backend,
        namespace: str = "default",
        candidate_id: str | None = None,
        **options: Unpack[ElectorOptions],
    ) -> None:
        """Take the Elector's arguments (its timings, ``config``, the callbacks, ...).

        The callbacks run on the event loop, not on the Elector's threads; a coroutine
        function's coroutine is scheduled as a task.
        """
        self._callbacks = (
            options.get("on_elected"),
            options.get("on_revoked"),
            options.get("on_error"),
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._changed: asyncio.Event | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        forwarded: ElectorOptions = {
            **options,
            "on_elected": lambda term: self._post(0, term),
            "on_revoked": lambda term, reason: self._post(1, term, reason),
            "on_error": lambda exc: self._post(2, exc),
        }
        self.elector = Elector(backend, namespace, candidate_id, **forwarded)

    # -- state (no I/O) ---------------------------------------------------------------------

    @property
    def is_leader(self) -> bool:
        """True while this candidate leads and its trust window has not ended."""
        return self.elector.is_leader

    @property
    def term(self) -> int | None:
        """The term this candidate leads under, or None."""
        return self.elector.term

    @property
    def leader_id(self) -> str | None:
        """The candidate id of the leader as last seen, or None."""
        return self.elector.leader_id

    @property
    def state(self) -> State:
        """Follower, leader or stopped."""
        return self.elector.state

    # -- life cycle -------------------------------------------------------------------------

    async def start(self) -> AsyncElector:
        """Join the election (the Elector's threads start in the executor)."""
        self._loop = asyncio.get_running_loop()
        self._changed = asyncio.Event()
        await self._loop.run_in_executor(None, self.elector.start)
        return self

    async def stop(self) -> None:
        """Step down, resign so another takes over at once, and leave the election."""
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self.elector.stop)
        if self._tasks:  # callbacks already scheduled: let them finish
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def __aenter__(self) -> AsyncElector:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def resign(self) -> bool:
        """Step down and stay out for ``resign_backoff``; True if this candidate led."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, self.elector.resign)

    async def transfer(self, to: str, timeout: float | None = None) -> Lease:
        """Hand leadership to the live, eligible candidate ``to`` (``Elector.transfer``)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, self.elector.transfer, to, timeout)

    async def wait_for_leadership(self, timeout: float | None = None) -> bool:
        """Wait until this candidate leads (True), or ``timeout`` seconds (False)."""
        changed = self._changed
        if changed is None:
            raise RuntimeError("start the AsyncElector first (async with, or await start())")
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            changed.clear()  # before the look: news arriving after it sets it again
            if self.is_leader:
                return True
            left = None if deadline is None else deadline - loop.time()
            if left is not None and left <= 0:
                return False
            try:
                await asyncio.wait_for(changed.wait(), left)
            except asyncio.TimeoutError:
                return self.is_leader

    def transitions(self) -> AsyncIterator[Transition]:
        """``elected`` / ``revoked`` transitions from this call on, in order, until stopped.

        The subscription is taken here, not at the first ``await``: nothing between the
        call and the iteration is missed. Each transition is awaited from the Elector's
        subscription in the executor: the loop never waits on it.
        """
        return self._follow(self.elector.subscribe())

    async def _follow(self, subscription: Subscription) -> AsyncIterator[Transition]:
        loop = asyncio.get_running_loop()
        try:
            while True:
                item = await loop.run_in_executor(None, subscription.get, _POLL)
                if item is not None:
                    yield item
                elif subscription.closed:
                    return
        finally:
            subscription.close()

    # -- from the Elector's threads ---------------------------------------------------------

    def _post(self, which: int, *args: Any) -> None:
        """Hand news to the loop; never block the election thread on it."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(self._deliver, which, args)

    def _deliver(self, which: int, args: tuple[Any, ...]) -> None:
        if self._changed is not None:
            self._changed.set()
        callback = self._callbacks[which]
        if callback is None:
            return
        result = callback(*args)
        if inspect.isawaitable(result):
            task = asyncio.ensure_future(result)
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
