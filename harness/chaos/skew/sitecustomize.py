"""Loaded (via PYTHONPATH) only by processes the chaos runs start with a skewed clock.

libfaketime 0.9.10 makes clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME) fail with EINVAL
when it leaves the monotonic clocks alone, and CPython's time.sleep() calls exactly that:
every sleep raised OSError, which is the harness breaking, not the process under test.
Condition waits are unaffected, so sleep on one of those instead.
"""

import threading
import time


def _sleep(seconds: float) -> None:
    if seconds < 0:
        raise ValueError("sleep length must be non-negative")
    threading.Event().wait(seconds)


time.sleep = _sleep  # type: ignore[assignment]
