"""Test set-up for the quickstart project: everything in memory, the report in tmp_path.

Run from the repository root: ``python -m pytest examples/quickstart/tests``.
The ``election`` fixtures come from celery-election's pytest plugin (installed with the
package); ``election_worker`` also needs Celery's fixtures, loaded here.
"""

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# Before proj is imported: the app reads its URLs from the environment at import time.
os.environ["CELERY_BROKER_URL"] = "memory://"
os.environ["CELERY_ELECTION_URL"] = "memory://"  # no worker elects here: the kit decides
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # makes `proj` importable

from proj import app
from proj.tasks import engine

pytest_plugins = ("celery.contrib.pytest",)

app.conf.update(
    result_backend="cache+memory://",
    broker_transport_options={"polling_interval": 0.01},  # ms round trips, not 1 s
)


@pytest.fixture(scope="session")
def celery_app():  # Celery's fixture, pointed at the project's own app
    return app


@pytest.fixture(autouse=True)
def app_database(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Each test writes its reports to a SQLite file of its own."""
    url = f"sqlite:///{tmp_path / 'app.sqlite3'}"
    monkeypatch.setenv("APP_DATABASE_URL", url)
    engine.cache_clear()
    yield url
    if engine.cache_info().currsize:
        engine().dispose()
    engine.cache_clear()
