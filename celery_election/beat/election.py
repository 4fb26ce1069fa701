"""The leadership a beat scheduler acts on: its own Elector, or its worker's record.

A standalone ``celery beat`` runs an Elector of its own in the beats' namespace
(``election_beat_namespace``), with its own /metrics and probes; the beat embedded in
``celery worker -B --election`` shares the worker's leadership through the worker's
shared record and only claims runs (no second candidate, no LISTEN).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from typing import Any, NamedTuple

from .. import metrics
from ..backends.base import Backend, BeatStore
from ..core.clock import boottime
from ..core.config import without_celery_prefix
from ..core.identity import new_candidate_id
from ..election import shared_state
from ..election.elector import Elector
from ..election.shared_state import SharedLeadership
from ..errors import ElectionError
from ..history import Recorder
from ..process import ProcessElection
from ..schedule.overdue import OverdueWatch
from ..settings import ElectionSettings, hide_password

__all__ = ["BeatElection", "BeatTerm", "backend_description", "banner_line"]

log = logging.getLogger("celery_election.beat")


class BeatTerm(NamedTuple):
    """The term this process leads in and its instance token (a claim's proof)."""

    term: int
    token: str


class BeatElection:
    """The leadership a scheduler acts on: its own Elector, or the worker's record."""

    def __init__(self, app: Any, publishers_record: SharedLeadership | None = None) -> None:
        """The app's election; ``publishers_record``: where else its trust goes.

        A standalone beat's elector writes its trust there too, for the beat's publisher
        processes (``beat.publish``).
        """
        self.record = shared_state.current()
        self.settings = ElectionSettings.from_app(app)
        self.settings.refuse_split()
        # Embedded (`celery worker -B --election`): the worker's leadership and namespace.
        embedded = self.record is not None
        if embedded:
            end_with_parent(os.getppid())
        self.namespace = self.settings.namespace if embedded else self.settings.beat_namespace
        self.parts = ProcessElection(self.settings, "beat", log)
        # Embedded, this process only claims runs (the worker runs the election): no LISTEN.
        self.backend: Backend = self.parts.connect(listen=False if embedded else None)
        self.store: BeatStore = self.backend.beat
        self.elector: Elector | None = None
        self.overdue: OverdueWatch | None = None
        if embedded:
            return
        candidate = new_candidate_id(role="beat")
        elector = self.elector = self.parts.elect(self.namespace, candidate)
        if self.settings.metrics_port is not None:
            # a standalone beat serves its own /metrics and probes (embedded: the worker)
            if metrics.store() is None:
                metrics.use_counters(metrics.LocalCounters())
            beats = [metrics.BeatProbe(self.namespace, grace=self.settings.config.ttl)]
            metrics.allow_start(self.namespace, 60.0)
            self.parts.serve(lambda: metrics.health([elector], beats))
            self.overdue = OverdueWatch(app).start()  # each entry's, judged by followers too
        if publishers_record is not None:
            record = publishers_record
            elector.watch_trust(lambda term, until: record.write(term, until, elector.token))
        self.parts.start()

    @property
    def recorder(self) -> Recorder | None:
        """The history recorder (``election_history_file``), if any."""
        return self.parts.recorder

    def leadership(self) -> BeatTerm | None:
        """The term and token while this process may act as leader, else None. No I/O."""
        if self.record is not None:
            reading = self.record.read()
            if reading.trusted() and reading.term is not None and reading.token:
                return BeatTerm(reading.term, reading.token)
            return None
        assert self.elector is not None
        term = self.elector.term
        return None if term is None else BeatTerm(term, self.elector.token)

    def wait_for_leadership(self, timeout: float) -> bool:
        """Block until this process leads (True) or ``timeout`` seconds pass (False)."""
        if self.elector is not None:
            return self.elector.wait_for_leadership(timeout)
        deadline = boottime() + timeout
        while self.leadership() is None:  # the worker's record has no waiter: poll it
            if boottime() >= deadline:
                return False
            time.sleep(0.01)
        return True

    def describe(self) -> str:
        mode = "embedded: the worker's leadership" if self.record is not None else "candidate"
        return f"{self.backend.description} namespace={self.namespace!r} ({mode})"

    def close(self) -> None:
        if self.overdue is not None:
            self.overdue.close()
            self.overdue = None
        self.parts.close()
        self.elector = None


def end_with_parent(parent: int, every: float = 0.2) -> None:
    """Stop this process soon after ``parent`` dies, however it died.

    An embedded beat is a process of its own: a SIGKILL of its worker's main process left
    it running, re-parented, with its broker and database sockets open (it stopped
    sending when its trust ended, but a process manager that does not kill the whole
    group kept it forever). Its parent's death shows as a new parent pid.
    """

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(every)
        log.warning("beat: its worker (pid %d) is gone; this embedded beat stops", parent)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5.0)  # SIGTERM caught and ignored: leave anyway
        os._exit(1)

    threading.Thread(target=watch, name="election-parent-watch", daemon=True).start()


def banner_line(app: Any) -> str:
    """The election's line in beat's banner: where it is held, and for which namespace."""
    try:
        s = ElectionSettings.from_app(app)
        ns = s.namespace if shared_state.current() is not None else s.beat_namespace
        where = backend_description(s.url)
        return f"    . election -> {where} namespace={ns!r}, ttl={s.config.ttl}s"
    except ElectionError as exc:
        return f"    . election -> misconfigured: {exc}"


def backend_description(url: str) -> str:
    """A database URL (``db+``/``sqla+`` prefixes dropped) with its password hidden."""
    return hide_password(without_celery_prefix(url))
