"""Prometheus metrics and health probes for electors, beats and leader tasks.

One module per job; every name is importable from here:

- ``ElectorStats`` (an elector's own counters, kept in the core: ``celery_election.core.stats``)
  and ``electors`` (the started electors of this process: ``celery_election.election.elector``).
- ``counters``: the store everything else counts into: ``LocalCounters`` in one process,
  ``SharedCounters`` shared by a worker's processes; ``use_counters``, ``store``, ``count``,
  ``set_gauge``, ``key``.
- ``health``: the probes (``BeatProbe``, ``elector_problem``, ``health``) and a beat's
  tick announcements (``mark_tick``, ``allow_start``).
- ``exporter``: the Prometheus collector and the HTTP server (``collector``, ``render``,
  ``MetricsServer``, ``bind``, ``serve``), the only user of ``prometheus_client``, which
  it imports lazily: counting works without the ``metrics`` extra. Each beat entry's
  overdue seconds come from a source the Celery side adds (``add_overdue_source``).

Part of the core: it never imports Celery.
"""

from __future__ import annotations

from ..core.stats import BUCKETS, ElectorStats
from ..election.elector import electors
from ..errors import ConfigurationError
from .counters import (
    BEAT,
    ENV_VAR,
    KEY,
    TASK,
    TICK,
    LocalCounters,
    SharedCounters,
    Store,
    count,
    key,
    set_gauge,
    store,
    use_counters,
)
from .exporter import (
    INSTALL_HINT,
    PREFIX,
    MetricsServer,
    add_overdue_source,
    bind,
    collector,
    render,
    require_client,
    serve,
)
from .health import BeatProbe, allow_start, elector_problem, health, mark_tick, tick_late

__all__ = [
    "BEAT",
    "BUCKETS",
    "ENV_VAR",
    "INSTALL_HINT",
    "KEY",
    "PREFIX",
    "TASK",
    "TICK",
    "BeatProbe",
    "ConfigurationError",
    "ElectorStats",
    "LocalCounters",
    "MetricsServer",
    "SharedCounters",
    "Store",
    "add_overdue_source",
    "allow_start",
    "bind",
    "collector",
    "count",
    "elector_problem",
    "electors",
    "health",
    "key",
    "mark_tick",
    "render",
    "require_client",
    "serve",
    "set_gauge",
    "store",
    "tick_late",
    "use_counters",
]
