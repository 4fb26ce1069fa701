"""Leader election for Celery, held in the SQL database the application already has.

Where things are (imports point down; ``tests/unit/test_layers.py`` checks the graph)::

    Celery side  app.py (init_app), bootstep.py (worker step), shared_state.py (record
                 shared with pool children), beat/ (LeaderScheduler), tasks.py
                 (leader_task), singleton.py (singleton_task: one run per key, held
                 by key_holder.py), control.py, signals.py, cli.py   -- import celery;
                 schedule/ the operable schedule and its page (API, store, spec, CLI,
                 web), a room the core never imports
    settings.py  every election_* setting, parsed and validated once per app
    elector.py   the Elector; its docstring is the protocol (start there). It only
                 composes: belief.py the one owner of belief; election_loop.py the
                 election thread, the one writer of the protocol's fields; decisions.py
                 what that thread does, as pure functions (the liveness rules among
                 them); lock_thread.py the lock thread; announce.py the dispatcher;
                 transitions.py what an elector reports; aio.py wraps it for asyncio;
                 process.py builds a worker's or beat's election parts in one place
    backends/    base.py (the Backend, BeatStore and KeyStore protocols), memory.py
                 (memory_keys.py its key holds), and SQL in
                 dialects.py (what differs between the databases), schema.py (tables,
                 database clock), connection.py (engines, deadlines), sql_calls.py
                 (each call's transaction and errors), sql_lease.py (the lease steps),
                 sql.py (lease, candidates), sql_host.py (what the stores use of
                 it), sql_install.py (tables), sql_beat.py (beat runs), sql_keys.py
                 (key holds), locks.py
                 (the lock sessions and standby slots), postgres.py (NOTIFY + LISTEN)
    core values  config.py (ElectionConfig), lease.py, keys.py (key holds), clock.py,
                 errors.py, history.py;
                 shm.py (the /dev/shm file a worker shares with its pool children)

Outside the package: ``harness/`` runs processes for the e2e tests, the chaos matrix and
the benchmarks (not installed).

To add a backend: implement ``backends.base.Backend`` (its ``beat`` property returns a
``BeatStore``, its ``keys`` a ``KeyStore``), run it through
``tests/integration/test_backend_suite.py`` and ``test_key_suite.py`` and the
``backend`` fixture in ``tests/conftest.py``, and name its URL scheme in
``backends/__init__.py``. A new SQL dialect: see ``backends/dialects.py``.

The core (Elector, backends, config, settings) never imports Celery; the Celery-side names
(``init_app``, ``leader_task``, ``LeaderTask``, ``singleton_task``, ``SingletonTask``) load
it on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .backends import MemoryBackend, backend_from_url
from .config import ElectionConfig
from .elector import Elector, RevokeReason, State, Transition
from .errors import (
    BackendUnavailableError,
    ConfigurationError,
    ElectionError,
    NotLeaderError,
    SchemaMissingError,
)
from .lease import Lease
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
    "init_app": ".app",
    "leader_task": ".tasks",
    "LeaderTask": ".tasks",
    "singleton_task": ".singleton",
    "SingletonTask": ".singleton",
    "OnceTask": ".once",
    "once_task": ".once",
}
# ``from celery_election import *`` therefore imports Celery: these names need it.
# SQLBackend loads SQLAlchemy on first use (the pytest plugin imports this package in
# every test run of a project that has it installed).
_LAZY = {**_CELERY_SIDE, "SQLBackend": ".backends.sql", "AsyncElector": ".aio"}

if TYPE_CHECKING:
    from .aio import AsyncElector
    from .app import init_app
    from .backends.sql import SQLBackend
    from .once import OnceTask, once_task
    from .singleton import SingletonTask, singleton_task
    from .tasks import LeaderTask, leader_task


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module 'celery_election' has no attribute {name!r}")
