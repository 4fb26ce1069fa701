"""The errors celery_election raises.

::

    ElectionError                      base of everything raised here
     +-- ConfigurationError            bad settings or arguments (also a ValueError)
     |    +-- IncompatibleSchemaError    tables or peers newer than this code understands
     +-- SchemaMissingError            the election tables do not exist yet
     +-- BackendUnavailableError       the database cannot be reached (keeps __cause__)
     +-- NotLeaderError                leader-only work attempted by a follower

Each class's docstring is its default message.
"""

from __future__ import annotations

__all__ = [
    "BackendUnavailableError",
    "ConfigurationError",
    "ElectionError",
    "IncompatibleSchemaError",
    "NotLeaderError",
    "SchemaMissingError",
]


class ElectionError(Exception):
    """Leader election failed."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (type(self).__doc__ or "").strip())


class ConfigurationError(ElectionError, ValueError):
    """The election configuration is invalid."""

    def __init__(self, problems: str | list[str]) -> None:
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        if len(self.problems) == 1:
            message = self.problems[0]
        else:
            message = "invalid election configuration:\n" + "\n".join(
                f"  - {p}" for p in self.problems
            )
        super().__init__(message)


def cannot_start(exc: ConfigurationError, fix: str) -> str:
    """What a worker or beat that cannot start prints: every problem and the fix, one line."""
    return f"celery-election: {'; '.join(exc.problems)} ({fix})"


class IncompatibleSchemaError(ConfigurationError):
    """The election tables, or the processes sharing them, are newer than this code.

    Raised before anything is written: upgrade celery-election on this host.
    """


class SchemaMissingError(ElectionError):
    """The election tables do not exist: create them with `celery -A proj election install`."""

    def __init__(self, table: str | None = None, url: str | None = None) -> None:
        self.table = table
        where = f" in {url}" if url else ""
        what = f"table {table!r}" if table else "the election tables"
        super().__init__(
            f"{what} does not exist{where}: create it with `celery -A proj election "
            f"install` (your app for proj), or `celery-election --url URL install`, or "
            f"backend.install()"
        )


class BackendUnavailableError(ElectionError):
    """The election database cannot be reached."""

    #: True when the connection it failed on was found dead (and has been discarded).
    connection_invalidated = False


class NotLeaderError(ElectionError):
    """Leader-only work was attempted on a process that is not the leader."""
