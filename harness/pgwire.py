"""A PostgreSQL wire-protocol proxy that counts, per child, what the server is asked.

One listening port per child; each statement of a simple Query message and each Execute
of the extended protocol is counted (by its first word), with the connections opened and
the notifications delivered, so electors that talk to PostgreSQL in different ways are
measured the same way, on the wire.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import struct
import threading
from typing import Any

from harness.events import verb_view

__all__ = ["Proxy", "WireCount", "WireParser", "verbs_of"]


def verbs_of(sql: str) -> list[str]:
    """The first word of each statement in ``sql`` (a simple Query may hold several)."""
    out = []
    for part in sql.split(";"):
        lines = [ln for ln in part.strip().splitlines() if not ln.strip().startswith("--")]
        text = " ".join(lines).strip()
        if text:
            out.append(text.split(None, 1)[0].upper())
    return out


class WireCount:
    """What one child's connections asked the server to execute, and what it was sent."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.verbs: collections.Counter[str] = collections.Counter()
        self.notifications = 0
        self.connections = 0
        self.opaque = 0  # connections that switched to TLS/GSS: not parsed

    def add(self, verb: str) -> None:
        with self.lock:
            self.verbs[verb] += 1

    def view(self) -> dict[str, Any]:
        with self.lock:
            return {
                **verb_view(dict(self.verbs)),
                "notifications": self.notifications,
                "connections": self.connections,
                "opaque": self.opaque,
            }


class WireParser:
    """Frames one direction of a PostgreSQL connection and counts the messages of note."""

    SSL_LIKE = (80877103, 80877104)  # SSLRequest, GSSENCRequest: a one-byte answer

    def __init__(self, count: WireCount, client: bool, peer: WireParser | None = None) -> None:
        self.count = count
        self.client = client
        self.peer = peer
        self.buf = bytearray()
        self.startup = client  # the client's first message(s) have no type byte
        self.raw_bytes = 0  # server: unframed answer bytes to an SSL/GSS request
        self.dead = False
        self.statements: dict[str, str] = {}  # prepared statement name -> verb
        self.portals: dict[str, str] = {}  # portal name -> verb

    def feed(self, data: bytes) -> None:
        if self.dead:
            return
        self.buf += data
        while not self.dead:
            if self.raw_bytes:
                if not self.buf:
                    return
                answer = self.buf[0]
                del self.buf[0]
                self.raw_bytes -= 1
                if answer in b"SG":  # encrypted from here on
                    self.dead = True
                    if self.peer is not None:
                        self.peer.dead = True
                    with self.count.lock:
                        self.count.opaque += 1
                continue
            if self.startup:
                if len(self.buf) < 8:
                    return
                (length, code) = struct.unpack("!ii", self.buf[:8])
                if len(self.buf) < length:
                    return
                del self.buf[:length]
                if code in self.SSL_LIKE and self.peer is not None:
                    self.peer.raw_bytes += 1
                else:
                    self.startup = False
                continue
            if len(self.buf) < 5:
                return
            kind = chr(self.buf[0])
            (length,) = struct.unpack("!i", self.buf[1:5])
            if len(self.buf) < 1 + length:
                return
            body = bytes(self.buf[5 : 1 + length])
            del self.buf[: 1 + length]
            if self.client:
                self.client_message(kind, body)
            elif kind == "A":
                with self.count.lock:
                    self.count.notifications += 1

    def client_message(self, kind: str, body: bytes) -> None:
        if kind == "Q":
            for verb in verbs_of(body.split(b"\0", 1)[0].decode(errors="replace")):
                self.count.add(verb)
        elif kind == "P":
            name, query = body.split(b"\0", 2)[:2]
            verbs = verbs_of(query.decode(errors="replace"))
            self.statements[name.decode()] = verbs[0] if verbs else "?"
        elif kind == "B":
            portal_name, stmt_name = body.split(b"\0", 2)[:2]
            self.portals[portal_name.decode()] = self.statements.get(stmt_name.decode(), "?")
        elif kind == "E":
            portal = body.split(b"\0", 1)[0].decode()
            self.count.add(self.portals.get(portal, "?"))


class Proxy:
    """One listening port per child, forwarding to the real server and counting."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.counts: dict[str, WireCount] = {}
        self.loop = asyncio.new_event_loop()
        self.servers: list[asyncio.Server] = []
        self.writers: set[asyncio.StreamWriter] = set()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def add(self, name: str) -> int:
        count = self.counts[name] = WireCount()
        fut = asyncio.run_coroutine_threadsafe(self._listen(count), self.loop)
        return fut.result(10)

    async def _listen(self, count: WireCount) -> int:
        async def handle(cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
            await self._connection(count, cr, cw)

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        self.servers.append(server)
        port: int = server.sockets[0].getsockname()[1]
        return port

    async def _connection(
        self, count: WireCount, cr: asyncio.StreamReader, cw: asyncio.StreamWriter
    ) -> None:
        with count.lock:
            count.connections += 1
        try:
            sr, sw = await asyncio.open_connection(self.host, self.port)
        except OSError:
            cw.close()
            return
        self.writers |= {cw, sw}
        server_side = WireParser(count, client=False)
        client_side = WireParser(count, client=True, peer=server_side)
        server_side.peer = client_side

        async def pump(
            r: asyncio.StreamReader, w: asyncio.StreamWriter, parser: WireParser
        ) -> None:
            try:
                while data := await r.read(65536):
                    parser.feed(data)
                    w.write(data)
                    await w.drain()
            except (OSError, asyncio.CancelledError):
                pass
            finally:
                w.close()  # one side gone: close the other at once (a killed client's
                # server session must end as it would without the proxy)

        await asyncio.gather(pump(cr, sw, client_side), pump(sr, cw, server_side))
        self.writers -= {cw, sw}

    def snapshot(self) -> dict[str, dict[str, Any]]:
        return {name: c.view() for name, c in self.counts.items()}

    def close(self) -> None:
        async def shut() -> None:
            for s in self.servers:
                s.close()
            for w in list(self.writers):
                w.close()

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(shut(), self.loop).result(5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
