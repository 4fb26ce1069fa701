"""Two costs a burst need not pay: Celery's clock read per question, and Python's collector.

**Celery's clock, held for one step.** In a burst Celery reads ``app.now()`` about seven
times per entry sent (the heap's ``_when``, ``is_due`` and the ``remaining_estimate``
under it, ``reserve``'s next entry), each through its time zone code: a sixth of the
leader's CPU in a burst of 10,000 with a publisher (``benchmarks/beat_burst_profile.py``).
Within one step of a burst (the due scan of a batch, the reserves of its runs) the
scheduler holds the clock (:func:`held`): each entry of the step is judged, and its run
stamped, at the instant the step began, which is the instant stock beat reads for the
first entry of its tick. Only the thread that holds the clock sees the held reading; any
other thread reads the real clock, and a clock already replaced on the app (a test's
frozen clock) is left as it is.

**The collector, paused while a burst lasts.** A full collection walks every object the
beat holds (thousands of entries, their heap, the shared state): in a burst of 10,000,
three of them took 0.2 s each, and with the younger generations a seventh of the burst's
CPU, a different share each run. :class:`CollectorPause` turns it off from the first
full batch of a burst to the tick that ends it (or :data:`PAUSE_MAX` seconds at most),
and back on then: what the burst left is collected when no send waits for it. A collector
the application had turned off stays off.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from ..core.clock import boottime

__all__ = ["PAUSE_MAX", "CollectorPause", "held", "real_now"]

#: Seconds a burst may keep the collector off (and the history waiting, history.py): a
#: burst that never ends (a schedule due at every tick) runs with them on after this.
PAUSE_MAX = 10.0


@contextmanager
def held(app: Any) -> Iterator[None]:
    """``app.now()`` answers one reading on this thread until the block ends."""
    if "now" in vars(app):  # held already (nested), or replaced by its owner: as it is
        yield
        return
    real: Callable[[], datetime] = app.now
    reading, thread = real(), threading.get_ident()

    def now() -> datetime:
        return reading if threading.get_ident() == thread else real()

    now.real = real  # type: ignore[attr-defined]  # read by real_now()
    app.now = now
    try:
        yield
    finally:
        if vars(app).get("now") is now:
            del app.now


def real_now(app: Any) -> datetime:
    """Celery's clock as it is now, held or not (the clock offset is measured on it)."""
    now = app.now
    return getattr(now, "real", now)()  # type: ignore[no-any-return]


class CollectorPause:
    """Python's cyclic collector off while a burst goes on (see the module's docstring)."""

    def __init__(self) -> None:
        self._since: float | None = None  # when this pause turned the collector off
        self._spent = False  # this burst had its PAUSE_MAX: on until the burst ends

    def burst(self, going_on: bool) -> None:
        """A tick sent a full batch (``going_on``), or the burst is over."""
        if not going_on:
            self._spent = False
            self.resume()
        elif self._since is None:
            if not self._spent and gc.isenabled():
                gc.disable()
                self._since = boottime()
        elif boottime() - self._since > PAUSE_MAX:
            self._spent = True
            self.resume()

    def resume(self) -> None:
        """The collector on again, if this pause turned it off."""
        if self._since is not None:
            self._since = None
            gc.enable()
