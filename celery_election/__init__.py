"""Leader election for Celery, held in the SQL database the application already has.

The wings, bottom to top (imports point down; ``tests/unit/test_layers.py`` holds the
order, docs/design.md draws it; each wing's ``__init__`` names its parts)::

    core/         values and pure rules: the lease, config, decisions, a run's row
    backends/     the Backend protocols; SQL (a Dialect per database) and memory
    election/     the Elector (its docstring is the protocol), its threads, key holds
    metrics/      Prometheus and the health probes
    settings.py   every election_* setting, parsed and validated once per app
    process.py    one process's election parts, from its settings
    runs/         a beat run on the workers          -- Celery from here up (once.py)
    schedule/     the operable schedule and its page
    beat/         LeaderScheduler
    keys/         singleton tasks
    integration/  init_app, the worker bootstep, leader tasks, remote control
    ops/          the command line

Outside the package: ``harness/`` runs processes for the e2e tests, the chaos matrix and
the benchmarks (not installed).

To add a backend: implement ``backends.base.Backend`` (its ``beat`` property returns a
``BeatStore``, its ``keys`` a ``KeyStore``), run it through
``tests/integration/test_hold_suite.py``, ``test_backend_suite.py`` and
``test_key_suite.py`` and the ``backend`` fixture in ``tests/conftest.py``, and name its
URL scheme in ``backends/__init__.py``. A new SQL dialect: see ``backends/dialects.py``.

The core (Elector, backends, config, settings) never imports Celery; the Celery-side names
(``init_app``, ``leader_task``, ``LeaderTask``, ``singleton_task``, ``SingletonTask``) load
it on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .backends import MemoryBackend, backend_from_url
from .core.config import ElectionConfig
from .core.lease import Lease
from .election.elector import Elector, RevokeReason, State, Transition
from .errors import (
    BackendUnavailableError,
    ConfigurationError,
    ElectionError,
    NotLeaderError,
    SchemaMissingError,
)
from .release import RELEASE as __version__

__all__ = [
    "AsyncElector",
    "BackendUnavailableError",
    "ConfigurationError",
    "ElectionConfig",
    "ElectionError",
    "Elector",
    "LeaderTask",
    "Lease",
    "MemoryBackend",
    "NotLeaderError",
    "OnceTask",
    "RevokeReason",
    "SQLBackend",
    "SchemaMissingError",
    "SingletonTask",
    "State",
    "Transition",
    "__version__",
    "backend_from_url",
    "init_app",
    "leader_task",
    "once_task",
    "singleton_task",
]

_CELERY_SIDE = {
    "init_app": ".integration.app",
    "leader_task": ".integration.tasks",
    "LeaderTask": ".integration.tasks",
    "singleton_task": ".keys.singleton",
    "SingletonTask": ".keys.singleton",
    "OnceTask": ".runs.once",
    "once_task": ".runs.once",
}
# ``from celery_election import *`` therefore imports Celery: these names need it.
# SQLBackend loads SQLAlchemy on first use (the pytest plugin imports this package in
# every test run of a project that has it installed).
_LAZY = {**_CELERY_SIDE, "SQLBackend": ".backends.sql", "AsyncElector": ".election.aio"}

if TYPE_CHECKING:
    from .backends.sql import SQLBackend
    from .election.aio import AsyncElector
    from .integration.app import init_app
    from .integration.tasks import LeaderTask, leader_task
    from .keys.singleton import SingletonTask, singleton_task
    from .runs.once import OnceTask, once_task


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module 'celery_election' has no attribute {name!r}")
