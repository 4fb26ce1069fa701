"""A file in /dev/shm mapped MAP_SHARED, shared by a worker and its pool children.

Children inherit the mapping at fork, and find the file by an environment variable when
started some other way.

Two users: ``shared_state`` (the leadership record the per-task check reads) and
``metrics`` (the counters children add to). Standard library only, so the core may use it.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import tempfile

__all__ = ["alive", "directory", "map_file", "sweep", "unmap"]


def directory() -> str:
    """/dev/shm where it exists (memory, never the disk), else the temp directory."""
    return "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


def map_file(path: str, size: int, *, create: bool) -> mmap.mmap:
    """Map ``path`` (``create``: a new, zeroed file of ``size`` bytes, only ours)."""
    fd = os.open(path, os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0), 0o600)
    try:
        if create:
            os.ftruncate(fd, size)
        return mmap.mmap(fd, size, mmap.MAP_SHARED)
    finally:
        os.close(fd)  # the mapping stays: no fd for embedded beat's close_open_fds() to sweep


def unmap(mapping: mmap.mmap, path: str, *, owner: bool, env_var: str) -> None:
    """Unmap; the owner (the creating process) also removes the file and its variable."""
    with contextlib.suppress(BufferError, ValueError):
        mapping.close()
    if owner:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        if os.environ.get(env_var) == path:
            del os.environ[env_var]


def sweep(base: str, prefix: str) -> int:
    """Remove ``<prefix><pid>-...`` files whose creator is gone (SIGKILL, OOM); how many.

    A file's name carries its creator's pid; one whose process is gone serves nobody
    (forked children keep their own mapping). A reused pid only keeps a stale file.
    """
    removed = 0
    with contextlib.suppress(OSError):
        for name in os.listdir(base):
            if not name.startswith(prefix):
                continue
            pid = name[len(prefix) :].split("-", 1)[0]
            if not pid.isdigit() or alive(int(pid)):
                continue
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(base, name))
                removed += 1
    return removed


def alive(pid: int) -> bool:
    """True if process ``pid`` exists (another user's process counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
