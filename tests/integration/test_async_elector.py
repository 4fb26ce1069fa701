"""AsyncElector: the backend suite's leadership scenarios through the async API, and a
loop that is never blocked by the election, even while the database stalls."""

from __future__ import annotations

import asyncio
import functools
import threading
import uuid
from typing import Any

import pytest

from celery_election.backends import backend_from_url
from celery_election.election.aio import AsyncElector
from celery_election.election.elector import RevokeReason
from harness.proxy import Proxy

from ..conftest import server_url, unique_prefix

pytestmark = pytest.mark.timeout(120)
FAST = dict(ttl=2.0, renew_interval=0.5, poll_interval=0.1, jitter=0)
#: Where no lease runs out: a 0.5 s call deadline on a loaded MariaDB ended the leader's
#: term in the middle of a transfer (refused: "the term was resigned").
STEADY = dict(FAST, ttl=10.0, renew_interval=2.0)
WAIT = 15.0  # seconds an expected change may take, at most


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 60))


def test_one_of_three_leads_and_hands_over(backend: Any) -> None:
    ns = f"aio-{uuid.uuid4().hex[:6]}"
    loop_thread: list[int] = []
    elected: list[int] = []
    revoked: list[tuple[int, RevokeReason]] = []

    async def on_elected(term: int) -> None:  # a coroutine callback: runs on the loop
        loop_thread.append(threading.get_ident())
        elected.append(term)

    def on_revoked(term: int, reason: RevokeReason) -> None:
        revoked.append((term, reason))

    async def scenario() -> None:
        a = AsyncElector(backend, ns, "a", on_elected=on_elected, on_revoked=on_revoked, **FAST)
        async with a:
            assert await a.wait_for_leadership(WAIT)
            b = AsyncElector(backend, ns, "b", **FAST)
            c = AsyncElector(backend, ns, "c", **FAST)
            async with b, c:
                # a leads; the others wait in vain (a timeout is False, not an error)
                assert not await b.wait_for_leadership(0.3)
                assert [e.is_leader for e in (a, b, c)] == [True, False, False]
                first = a.term
                assert first is not None
                stream = b.transitions()
                # a resigns: one of the others takes a greater term
                assert await a.resign()
                done, _ = await asyncio.wait(
                    [asyncio.ensure_future(e.wait_for_leadership(WAIT)) for e in (b, c)],
                    return_when=asyncio.FIRST_COMPLETED,
                )
                assert any(t.result() for t in done)
                leader = b if b.is_leader else c
                assert not (b.is_leader and c.is_leader)
                assert leader.term is not None and leader.term > first
                if leader is b:
                    nxt = await asyncio.wait_for(stream.__anext__(), WAIT)
                    assert (nxt.kind, nxt.term) == ("elected", b.term)
                await stream.aclose()
                # the leader stops: the last one takes over
                second = leader.term
                await leader.stop()
                other = c if leader is b else b
                assert await other.wait_for_leadership(WAIT)
                assert other.term is not None and other.term > second
        assert elected and elected[0] == first
        assert loop_thread and set(loop_thread) == {threading.get_ident()}
        assert revoked and revoked[0][0] == first

    run(scenario())


def test_transitions_come_in_order(backend: Any) -> None:
    ns = f"aio-{uuid.uuid4().hex[:6]}"

    async def scenario() -> list[tuple[str, int]]:
        seen: list[tuple[str, int]] = []
        a = AsyncElector(backend, ns, "a", **FAST)
        stream = a.transitions()  # from now on: before start, so the first election is in
        await a.start()
        try:
            first = await asyncio.wait_for(stream.__anext__(), WAIT)
            seen.append((first.kind, first.term))
            await a.resign()
            second = await asyncio.wait_for(stream.__anext__(), WAIT)
            seen.append((second.kind, second.term))
        finally:
            await stream.aclose()
            await a.stop()
        return seen

    seen = run(scenario())
    assert [k for k, _ in seen] == ["elected", "revoked"]
    assert seen[0][1] == seen[1][1]


def test_the_loop_is_never_blocked_while_the_database_stalls(tmp_path: Any) -> None:
    """The loop keeps running while calls hang on a stalled link: through a stall of every
    call, the loss of trust, a resign and the exit of ``async with`` during the stall.

    Observed, not timed: each backend call, and the blocking Elector methods that
    ``resign()`` and ``stop()`` run in the executor, mark themselves in flight while they
    run, and a ticker on the loop notes what is in flight each time it runs. A loop
    blocked by a call could never see that call in flight. (Made to call
    ``Elector.resign`` or ``Elector.stop`` on the loop, AsyncElector fails here.)
    """
    pg = server_url("postgresql")
    proxy, url = Proxy.for_url(pg)
    prefix = unique_prefix()
    direct = backend_from_url(pg, table_prefix=prefix, listen=False)
    direct.install()
    backend = backend_from_url(url, table_prefix=prefix, listen=False)
    lock = threading.Lock()
    in_flight: dict[str, int] = {}  # call -> how many are running now
    seen_hanging: set[str] = set()  # calls the ticker saw in flight after the stall
    stalled = threading.Event()

    def watch(obj: Any, name: str, label: str) -> None:
        real = getattr(obj, name)

        @functools.wraps(real)
        def call(*args: Any, **kwargs: Any) -> Any:
            with lock:
                in_flight[label] = in_flight.get(label, 0) + 1
            try:
                return real(*args, **kwargs)
            finally:
                with lock:
                    in_flight[label] -= 1

        setattr(obj, name, call)

    for name in ("elect", "renew", "resign", "register", "unregister"):
        watch(backend, name, name)

    async def ticker(stop: asyncio.Event) -> None:
        while not stop.is_set():
            await asyncio.sleep(0.01)
            if stalled.is_set():
                with lock:
                    seen_hanging.update(n for n, running in in_flight.items() if running)

    async def scenario() -> None:
        stop = asyncio.Event()
        revoked = asyncio.Event()
        ticks = asyncio.ensure_future(ticker(stop))
        # Lease-bound trust (no liveness lock): with the lock, a stall ends trust at the
        # next missed ping, before any renewal is due, and no renewal would hang here.
        elector = AsyncElector(
            backend, "stall", "a", on_revoked=lambda *_: revoked.set(), liveness=False, **FAST
        )
        # what resign() and the exit of async with wait for, in the executor: each waits
        # on the election thread, which is stuck in a stalled call
        watch(elector.elector, "resign", "Elector.resign")
        watch(elector.elector, "stop", "Elector.stop")
        async with elector:
            assert await elector.wait_for_leadership(WAIT)
            proxy.stall()  # every call now hangs until its deadline cuts it
            stalled.set()
            # the renewals hang until trust runs out; the revocation reaches the loop
            await asyncio.wait_for(revoked.wait(), WAIT)
            assert not await elector.wait_for_leadership(0.1) or elector.is_leader
            await elector.resign()  # its statement hangs: in the executor, not here
        stop.set()
        await ticks

    try:
        run(scenario())
    finally:
        proxy.resume()
        proxy.close()
        backend.close()
        direct.uninstall()
        direct.close()
    # the loop ran while a renewal and the resign hung on the stalled link, and while
    # resign() and the exit of async with waited for the election thread
    assert {"renew", "resign", "Elector.resign", "Elector.stop"} <= seen_hanging, seen_hanging


def test_an_asgi_lifespan_leads_and_shuts_down(tmp_path: Any, monkeypatch: Any) -> None:
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "examples" / "asgi_lifespan.py"
    spec = importlib.util.spec_from_file_location("asgi_lifespan", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setenv("ELECTION_URL", f"sqlite:///{tmp_path}/election.db")
    spec.loader.exec_module(module)

    async def scenario() -> list[dict[str, Any]]:
        inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        outbox: list[dict[str, Any]] = []
        await inbox.put({"type": "lifespan.startup"})

        async def send(message: dict[str, Any]) -> None:
            outbox.append(message)
            if message["type"] == "lifespan.startup.complete":
                assert await module.state["elector"].wait_for_leadership(WAIT)
                for _ in range(200):  # the leader-only loop does its work at least once
                    if module.state["runs"]:
                        break
                    await asyncio.sleep(0.02)
                await inbox.put({"type": "lifespan.shutdown"})

        app = module.app
        await app({"type": "lifespan"}, inbox.get, send)
        return outbox

    outbox = run(scenario())
    assert [m["type"] for m in outbox] == [
        "lifespan.startup.complete",
        "lifespan.shutdown.complete",
    ]
    assert module.state["runs"] > 0


def test_transfer_through_the_async_api(backend: Any) -> None:
    ns = f"aio-{uuid.uuid4().hex[:6]}"

    async def scenario() -> None:
        async with AsyncElector(backend, ns, "a@h:1:aa", **STEADY) as a:
            assert await a.wait_for_leadership(WAIT)
            async with AsyncElector(backend, ns, "b@h:2:bb", **STEADY) as b:
                while len(await asyncio.to_thread(backend.candidates, ns)) < 2:
                    await asyncio.sleep(0.02)
                moved = await a.transfer("b@h")
                assert moved.leader_id == "b@h:2:bb"
                assert await b.wait_for_leadership(WAIT) and not a.is_leader

    run(scenario())
