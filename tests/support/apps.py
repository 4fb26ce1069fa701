"""A fresh Celery app for each test (in memory, never the default app of another test)."""

from __future__ import annotations

import uuid
from typing import Any

from celery import Celery

__all__ = ["new_app"]


def new_app(**conf: Any) -> Celery:
    """A new app with a unique name and the memory broker, configured with ``conf``."""
    app = Celery(f"t{uuid.uuid4().hex[:8]}", broker="memory://", set_as_current=True)
    app.conf.update(conf)
    return app
