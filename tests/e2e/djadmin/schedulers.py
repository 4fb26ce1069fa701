"""Stock ``DatabaseScheduler`` and the leader one, each appending what it really sends
(and when it starts ticking, and when its leadership changes) as JSON lines to the file
named by ``DJADMIN_RECORD``."""

from __future__ import annotations

import json
import os
import time
from typing import Any

import django

django.setup()

from django_celery_beat.schedulers import DatabaseScheduler  # noqa: E402

from celery_election.beat import LeaderSchedulerMixin  # noqa: E402


def record(event: str, **fields: Any) -> None:
    line = json.dumps({"event": event, "at": time.time(), "pid": os.getpid(), **fields})
    with open(os.environ["DJADMIN_RECORD"], "a") as f:
        f.write(line + "\n")


class _Recording:
    _was_leading: bool | None = None

    def send_task(self, name: str, *args: Any, **kwargs: Any) -> Any:
        record("send", entry=name.removeprefix("t."))
        return super().send_task(name, *args, **kwargs)  # type: ignore[misc]

    def tick(self, *args: Any, **kwargs: Any) -> Any:
        result = super().tick(*args, **kwargs)  # type: ignore[misc]
        leading_fn = getattr(self, "_take_lead", None)
        leading = True if leading_fn is None else leading_fn() is not None
        if leading != self._was_leading:
            record("leading" if leading else "following")
            self._was_leading = leading
        return result


class StockRecording(_Recording, DatabaseScheduler):
    pass


class LeaderRecording(_Recording, LeaderSchedulerMixin, DatabaseScheduler):
    pass
