"""A child process the way every harness here runs one.

Each child gets a session of its own, so a Ctrl-C reaches only the parent (which cleans
up) and a signal can reach the child's whole group (a Celery worker's pool children, its
embedded beat). Output goes to a log file, or to pipes for children that report events.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

__all__ = ["Proc", "stop_all"]


class Proc:
    """One child: started (and restarted) from the same command, signalled, waited on."""

    def __init__(
        self,
        name: str,
        cmd: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        log: Path | None = None,
        pipes: bool = False,
        die_with_parent: bool = False,
    ) -> None:
        self.name = name
        self.cmd = list(cmd)
        self.env = dict(env) if env is not None else None
        self.cwd = cwd
        self.log = log  # output appended here (None with ``pipes``: the caller reads it)
        self.pipes = pipes
        self.die_with_parent = die_with_parent  # SIGTERM it if this process dies (Linux)
        self.popen: subprocess.Popen[Any] | None = None

    def start(self, env: Mapping[str, str] | None = None) -> Proc:
        """Start (again); ``env`` adds to the environment of this start only."""
        full = {**(self.env if self.env is not None else os.environ), **(env or {})}
        full.setdefault("PYTHONFAULTHANDLER", "1")  # wait(): a hung process's stacks
        out: IO[bytes] | int | None = None
        if self.pipes:
            out = subprocess.PIPE
        elif self.log is not None:
            out = open(self.log, "ab")  # noqa: SIM115 (the child keeps its own copy)
        try:
            self.popen = subprocess.Popen(
                self.cmd,
                env=full,
                cwd=self.cwd,
                stdin=subprocess.PIPE if self.pipes else None,
                stdout=out,
                stderr=None if self.pipes else subprocess.STDOUT,
                text=self.pipes,
                bufsize=1 if self.pipes else -1,
                start_new_session=True,
                preexec_fn=_die_with_parent if self.die_with_parent else None,
            )
        finally:
            if not self.pipes and out is not None and not isinstance(out, int):
                out.close()
        return self

    @property
    def pid(self) -> int:
        assert self.popen is not None, f"{self.name} was never started"
        return self.popen.pid

    @property
    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    @property
    def returncode(self) -> int | None:
        return None if self.popen is None else self.popen.poll()

    def signal(self, sig: int) -> None:
        """Signal the process itself (SIGTERM: its own clean stop)."""
        if self.popen is not None:
            with contextlib.suppress(ProcessLookupError):
                self.popen.send_signal(sig)

    def signal_group(self, sig: int) -> None:
        """Signal its whole session (pool children too)."""
        if self.popen is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.popen.pid, sig)

    def pause(self) -> None:
        """SIGSTOP the whole group: a process that cannot run at all (a VM freeze)."""
        self.signal_group(signal.SIGSTOP)

    def resume(self) -> None:
        self.signal_group(signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILL the whole group: a crash, orphans included."""
        self.signal_group(signal.SIGKILL)

    def wait(self, timeout: float | None = None) -> int:
        """Its exit status; past ``timeout``, its threads' stacks go to its log first.

        A process that does not exit is asked where it is: SIGABRT makes Python's fault
        handler (``PYTHONFAULTHANDLER``, set for every process here) print each thread's
        stack, and the log the test prints then says what it waited for.
        """
        assert self.popen is not None, f"{self.name} was never started"
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.popen.pid, signal.SIGABRT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(5)
            raise

    def dump_stacks(self) -> None:
        """Each process of its group prints its threads' stacks and ends, one at a time
        (SIGABRT: the fault handler), pool children first: at once they interleave."""
        group = [pid for pid, state in _group(self.pid) if state != "Z"]
        for pid in sorted(group, key=lambda pid: pid == self.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGABRT)
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and dict(_group(self.pid)).get(pid, "Z") != "Z":
                time.sleep(0.05)


def _group(pgid: int) -> list[tuple[int, str]]:
    """(pid, state) of each process in group ``pgid``, from /proc."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid:
                found.append((int(stat.parent.name), fields[0]))
    return found


def _die_with_parent() -> None:
    """In the child (before exec): get SIGTERM when the parent dies (Linux)."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def stop_all(procs: Iterable[Proc], grace: float) -> None:
    """SIGTERM (after SIGCONT) every live one, wait up to ``grace`` seconds in all, then
    SIGKILL what is left and every group's leftovers (orphaned pool children)."""
    procs = [p for p in procs if p.popen is not None]
    for p in procs:
        if p.alive:
            p.resume()
            p.signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    for p in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(max(0.1, deadline - time.monotonic()))
        p.kill()
        assert p.popen is not None
        p.popen.wait()
        for pipe in (p.popen.stdin, p.popen.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()
