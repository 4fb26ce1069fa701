"""One process's election, put together in one place: the composition root.

A worker with ``--election`` (integration/bootstep.py) and a standalone ``celery beat``
(beat/election.py) each need the same parts from their settings: the backend (tables
created if ``election_auto_install``), an Elector, the history recorder
(``election_history_file``) and the /metrics server (``election_metrics_port``), started
in one order and closed in the reverse one. Each caller adds only what is its own (the
worker's shared record and queue, the beat's probe). Part of the core: no Celery here.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from . import metrics
from .backends import MemoryBackend, auto_install, backend_from_url
from .backends.base import Backend
from .core.transitions import RevokeReason
from .election.elector import Elector
from .history import Recorder
from .metrics.exporter import Probe
from .settings import ElectionSettings

__all__ = ["ProcessElection"]


class ProcessElection:
    """The election parts of one process, from its settings; ``close()`` is idempotent.

    ``role`` ("worker" or "beat") names the process in the history file and the logs.
    """

    def __init__(self, settings: ElectionSettings, role: str, log: logging.Logger) -> None:
        self.settings, self.role, self.log = settings, role, log
        self.backend: Backend | None = None
        self.elector: Elector | None = None
        self.recorder: Recorder | None = None
        self.server: metrics.MetricsServer | None = None
        self._install_lock = threading.Lock()

    def serve(self, probe: Probe) -> None:
        """Take the metrics port now, serve once started (a taken port: one line, no run)."""
        port = self.settings.metrics_port
        if port is not None:
            self.server = metrics.bind(port, probe)

    def connect(self, *, listen: bool | None = None) -> Backend:
        """The backend (``listen=False``: no LISTEN connection), tables created if asked.

        The history recorder opens here too: a beat embedded in a worker records its sends
        though it runs no Elector of its own.
        """
        self.backend = backend_from_url(
            self.settings.url, **self.settings.backend_options(listen=listen)
        )
        history = self.settings.history_file
        if history and self.recorder is None:
            self.recorder = Recorder(history, role=self.role)
        if self.settings.auto_install:
            self.install()
        return self.backend

    def install(self) -> None:
        """Create the tables if missing; a database that is down now is retried later."""
        if self.backend is None or not self._install_lock.acquire(blocking=False):
            return
        try:
            auto_install(self.backend, self.log)
        finally:
            self._install_lock.release()

    def elect(
        self,
        namespace: str,
        candidate_id: str,
        *,
        on_elected: Callable[[int], Any] | None = None,
        on_revoked: Callable[[int, RevokeReason], Any] | None = None,
        on_error: Callable[[BaseException], Any] | None = None,
    ) -> Elector:
        """The Elector of this process (not started), its changes recorded if asked."""
        assert self.backend is not None, "connect() first"
        self.elector = Elector(
            self.backend,
            namespace,
            candidate_id,
            config=self.settings.config,
            # The in-process database's clock is the elector's too: a test that hands
            # both a FakeClock moves the lease, the lock thread and the election loop
            # together (a SQL backend's clock is the server's; the elector's is boot time).
            clock=self.backend.clock if isinstance(self.backend, MemoryBackend) else None,
            eligible=self.settings.eligible,
            release=self.settings.release,
            on_elected=on_elected,
            on_revoked=on_revoked,
            on_error=on_error,
        )
        if self.recorder is not None:
            self.recorder.attach(self.elector)
        return self.elector

    def start(self) -> None:
        """Campaign, then serve /metrics and the probes."""
        if self.elector is not None:
            self.elector.start()
        if self.server is not None:
            self.server.start()
            self.log.info(
                "%s election: /metrics, /healthz and /readyz on port %d",
                self.role,
                self.server.port,
            )

    def close(self) -> None:
        """Stop serving, resign and stop the elector, close the history and the backend."""
        if self.server is not None:
            self.server.close()
            self.server = None
        if self.elector is not None:
            self.elector.stop()
            self.elector = None
        if self.recorder is not None:
            self.recorder.close()
            self.recorder = None
        if self.backend is not None:
            self.backend.close()
            self.backend = None
