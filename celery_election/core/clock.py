"""Clocks: the boot-time clock every deadline uses, and a fake one for tests.

Deadlines (the trust window above all) are read on CLOCK_BOOTTIME: it is monotonic, it is
comparable across processes on one host, and unlike CLOCK_MONOTONIC it keeps counting
while the machine is suspended, so a laptop that sleeps through its lease wakes up
knowing it is no longer trusted. The wall clock is never used for a lease decision; only
the in-memory backend reads one, as its stand-in for the database's clock.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from typing import Protocol

__all__ = ["FakeClock", "RealClock", "Sleeper", "boottime"]

_BOOTTIME: int | None = getattr(time, "CLOCK_BOOTTIME", None)  # Linux only


def boottime() -> float:
    """Seconds on the boot-time clock (CLOCK_BOOTTIME where the OS has it)."""
    if _BOOTTIME is None:  # elsewhere monotonic is the best there is
        return time.monotonic()
    return time.clock_gettime(_BOOTTIME)


class Sleeper(Protocol):
    """A wait that another thread can cut short."""

    def wait(self, timeout: float | None) -> bool:
        """Wait up to ``timeout`` seconds; True if woken, and the wake is consumed."""

    def wake(self) -> None:
        """Make the current or next wait return at once."""


class Clock(Protocol):
    """What the elector and the memory backend need from time."""

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back and counts through suspend."""

    def wall_us(self) -> int:
        """Epoch microseconds: the memory backend's database clock."""

    def sleeper(self) -> Sleeper:
        """A new wait object driven by this clock."""


class _EventSleeper:
    def __init__(self) -> None:
        self._event = threading.Event()

    def wait(self, timeout: float | None) -> bool:
        woken = self._event.wait(None if timeout is None else max(0.0, timeout))
        self._event.clear()
        return woken

    def wake(self) -> None:
        self._event.set()


class RealClock:
    """The real clocks: CLOCK_BOOTTIME for deadlines, time.time() for the memory DB."""

    def monotonic(self) -> float:
        return boottime()

    def wall_us(self) -> int:
        return time.time_ns() // 1000

    def sleeper(self) -> Sleeper:
        return _EventSleeper()


class FakeClock:
    """A clock that moves only when a test calls :meth:`advance`.

    Waits on its sleepers end when fake time reaches their deadline or when woken, so a
    test drives an elector step by step without sleeping.
    """

    def __init__(self, start: float = 1000.0, wall_start_us: int = 1_700_000_000_000_000) -> None:
        self._now = start
        self._wall0 = wall_start_us
        self._start = start
        self._cond = threading.Condition()
        self._sleeping: dict[_FakeSleeper, float | None] = {}

    def monotonic(self) -> float:
        with self._cond:
            return self._now

    def wall_us(self) -> int:
        with self._cond:
            return self._wall0 + round((self._now - self._start) * 1_000_000)

    def advance(self, seconds: float) -> None:
        """Move time forward and release every wait whose deadline has passed."""
        if seconds < 0:
            raise ValueError("a clock does not go back")
        with self._cond:
            self._now += seconds
            self._cond.notify_all()

    def settled(self, sleepers: Iterable[Sleeper], timeout: float = 5.0) -> bool:
        """Block (real time) until each of ``sleepers`` waits on a deadline still ahead.

        After ``advance`` this means the threads that wait on them have done what it
        woke them for and gone back to sleep, so the next step of a test sees the
        effects. Tests name the waits they mean (``Elector`` exposes its threads'
        waits), not how many threads the process happens to have.
        """
        wanted = list(sleepers)

        def asleep(sleeper: Sleeper) -> bool:
            assert isinstance(sleeper, _FakeSleeper), "a sleeper of this clock"
            if sleeper not in self._sleeping or sleeper._woken:
                return False
            deadline = self._sleeping[sleeper]
            return deadline is None or deadline > self._now

        with self._cond:
            return self._cond.wait_for(lambda: all(asleep(s) for s in wanted), timeout)

    def sleeper(self) -> Sleeper:
        return _FakeSleeper(self)


class _FakeSleeper:
    def __init__(self, clock: FakeClock) -> None:
        self._clock = clock
        self._woken = False

    def wait(self, timeout: float | None) -> bool:
        c = self._clock
        with c._cond:
            deadline = None if timeout is None else c._now + max(0.0, timeout)
            c._sleeping[self] = deadline
            c._cond.notify_all()
            try:
                while not self._woken and (deadline is None or c._now < deadline):
                    c._cond.wait()
                woken, self._woken = self._woken, False
                return woken
            finally:
                del c._sleeping[self]
                c._cond.notify_all()

    def wake(self) -> None:
        with self._clock._cond:
            self._woken = True
            self._clock._cond.notify_all()
