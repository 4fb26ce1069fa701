"""The states tasks ended in, from Celery's ``task_postrun`` signal (IGNORED included).

For the in-process worker tests of the test kits (``postrun`` fixture, tests/unit/conftest.py).
"""

from __future__ import annotations

import threading
from typing import Any


class Postrun:
    """Each task id's end state as the worker signalled it; :meth:`wait` for one."""

    def __init__(self) -> None:
        self.states: dict[str, str] = {}
        self.cond = threading.Condition()

    def __call__(self, task_id: str, state: str, **kw: Any) -> None:
        with self.cond:
            self.states[task_id] = state
            self.cond.notify_all()

    def wait(self, task_id: str, timeout: float = 10) -> str | None:
        with self.cond:
            self.cond.wait_for(lambda: task_id in self.states, timeout)
            return self.states.get(task_id)
