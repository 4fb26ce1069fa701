"""Leader election for Celery, held in the SQL database the application already has.

The core (Elector, backends, config) never imports Celery; the Celery-side names
(``init_app``, ``leader_task``, ``LeaderTask``) load it on first use.
"""

from __future__ import annotations

from typing import Any

from .backends import MemoryBackend, SQLBackend, backend_from_url
from .config import ElectionConfig
from .elector import Elector, RevokeReason, State, Transition
from .errors import (
    BackendUnavailableError,
    ConfigurationError,
    ElectionError,
    NotLeaderError,
    SchemaMissingError,
)
from .term import Lease

__version__ = "0.1.0"

__all__ = [
    "BackendUnavailableError",
    "ConfigurationError",
    "ElectionConfig",
    "ElectionError",
    "Elector",
    "LeaderTask",
    "Lease",
    "MemoryBackend",
    "NotLeaderError",
    "RevokeReason",
    "SQLBackend",
    "SchemaMissingError",
    "State",
    "Transition",
    "__version__",
    "backend_from_url",
    "init_app",
    "leader_task",
]

_CELERY_SIDE = {"init_app": ".app", "leader_task": ".tasks", "LeaderTask": ".tasks"}
# ``from celery_election import *`` therefore imports Celery: these names need it.


def __getattr__(name: str) -> Any:
    if name in _CELERY_SIDE:
        import importlib

        return getattr(importlib.import_module(_CELERY_SIDE[name], __name__), name)
    raise AttributeError(f"module 'celery_election' has no attribute {name!r}")
