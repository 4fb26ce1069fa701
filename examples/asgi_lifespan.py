"""An ASGI app (no framework needed) that joins an election in its lifespan.

Run it with any ASGI server, e.g. ``uvicorn asgi_lifespan:app``, on several hosts: one
instance runs the leader-only loop. With FastAPI, put the same code in its ``lifespan``.

    ELECTION_URL=postgresql+psycopg://app@db/app uvicorn asgi_lifespan:app
"""

import asyncio
import os

from celery_election import backend_from_url
from celery_election.election.aio import AsyncElector

#: What the app shares with its handlers (and with the example's test).
state = {"elector": None, "runs": 0}


async def leader_only_work(elector: AsyncElector) -> None:
    """Each second, while this instance leads: do the work, fenced with the term."""
    while True:
        if elector.is_leader:  # no I/O: a clock comparison
            state["runs"] += 1  # e.g. write(..., term=elector.term)
        await asyncio.sleep(0.05 if state["runs"] == 0 else 1.0)


async def app(scope, receive, send):
    if scope["type"] != "lifespan":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        elector = state["elector"]
        body = f"leader: {elector.is_leader if elector else False}\n".encode()
        await send({"type": "http.response.body", "body": body})
        return
    url = os.environ.get("ELECTION_URL", "sqlite:///election.db")
    backend = backend_from_url(url)
    backend.install()
    elector = AsyncElector(backend, "asgi-example", ttl=10)
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await elector.start()
            state["elector"] = elector
            worker = asyncio.ensure_future(leader_only_work(elector))
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            worker.cancel()
            await elector.stop()  # resigns: another instance takes over at once
            backend.close()
            await send({"type": "lifespan.shutdown.complete"})
            return
