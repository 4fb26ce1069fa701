"""What both swap plugins give a stand-in scheduler: a real election, won before use."""

from __future__ import annotations

from typing import Any

import pytest

#: Schedulers built during the current test (their elections are stopped after it).
made: list[Any] = []
LEAD_WITHIN = 5.0


class Leading:
    """Elect on the memory backend, and lead before the test uses the scheduler."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        app = kwargs.get("app") or args[0]
        if not app.conf.get("election_url"):
            app.conf.election_url = "memory://"
        super().__init__(*args, **kwargs)
        made.append(self)

    def setup_schedule(self) -> None:
        super().setup_schedule()  # type: ignore[misc]
        assert self.wait_for_leadership(LEAD_WITHIN)  # type: ignore[attr-defined]

    def tick(self, *args: Any, **kwargs: Any) -> Any:
        assert self.wait_for_leadership(LEAD_WITHIN)  # type: ignore[attr-defined]
        return super().tick(*args, **kwargs)  # type: ignore[misc]


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_teardown(item: pytest.Item) -> None:
    """Stop only what the election started, before the test's own fixtures are torn down.

    The scheduler itself is the test's (a test may leave it half-mocked, e.g. a dict as
    its store, and never close it); Celery's ``threads_not_lingering`` checks threads.
    """
    while made:
        scheduler = made.pop()
        election, scheduler._fence.election = scheduler._fence.election, None
        if election is not None:
            election.close()
