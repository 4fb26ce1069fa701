"""A TCP proxy between the code under test and a real server, to cut or stall the link."""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading
import time
from urllib.parse import urlsplit


class Proxy:
    """Forwards 127.0.0.1:<port> to a target.

    ``stall()`` stops forwarding, ``cut()`` resets, ``slow(s)`` delays every chunk by ``s``.
    """

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self._stalled = threading.Event()
        self._refuse = threading.Event()
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._lock = threading.Lock()
        self._closed = False
        self._delay = 0.0
        threading.Thread(target=self._accept, daemon=True).start()

    @classmethod
    def for_url(cls, url: str) -> tuple[Proxy, str]:
        """A proxy to the server of ``url`` and the same URL pointing through it."""
        parts = urlsplit(url)
        assert parts.hostname and parts.port
        proxy = cls(parts.hostname, parts.port)
        netloc = parts.netloc.replace(f"{parts.hostname}:{parts.port}", f"127.0.0.1:{proxy.port}")
        return proxy, parts._replace(netloc=netloc).geturl()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if self._refuse.is_set():
                client.close()
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._pairs.append((client, upstream))
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()

    def _pump(self, a: socket.socket, b: socket.socket) -> None:
        sel = selectors.DefaultSelector()
        sel.register(a, selectors.EVENT_READ, b)
        sel.register(b, selectors.EVENT_READ, a)
        try:
            while not self._closed:
                for key, _ in sel.select(timeout=0.1):
                    if self._stalled.is_set():
                        continue  # accept bytes into the kernel buffer, answer nothing
                    data = key.fileobj.recv(65536)  # type: ignore[union-attr]
                    if not data:
                        return
                    if self._delay:
                        time.sleep(self._delay)  # a slow link: each chunk arrives late
                    key.data.sendall(data)
                if self._stalled.is_set():
                    self._stalled.wait(0.05)
        except OSError:
            return
        finally:
            sel.close()
            with self._lock:
                if (a, b) in self._pairs:
                    self._pairs.remove((a, b))
            for s in (a, b):
                with contextlib.suppress(OSError):
                    s.close()

    def stall(self) -> None:
        """Keep connections open but forward nothing (a half-open or frozen link)."""
        self._stalled.set()

    def slow(self, delay: float) -> None:
        """Delay every chunk, both ways, by ``delay`` seconds (0 restores the link)."""
        self._delay = delay

    def resume(self) -> None:
        self._stalled.clear()
        self._refuse.clear()
        self._delay = 0.0

    def upstream_ports(self) -> list[int]:
        """Local ports of the open server-side sockets: how the server names our sessions."""
        with self._lock:
            pairs = list(self._pairs)
        ports = []
        for _, upstream in pairs:
            with contextlib.suppress(OSError):
                ports.append(upstream.getsockname()[1])
        return ports

    def cut(self, refuse_new: bool = False) -> None:
        """Reset every open connection; with ``refuse_new``, also refuse new ones."""
        if refuse_new:
            self._refuse.set()
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for pair in pairs:
            for s in pair:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._closed = True
        self.cut()
        self.listener.close()
