"""Fixtures of the unit tests."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from celery_election import shared_state
from celery_election.shared_state import ENV_VAR


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No record installed and no record path in the environment; restored afterwards."""
    saved = os.environ.get(ENV_VAR)
    monkeypatch.delenv(ENV_VAR, raising=False)
    shared_state.install(None)
    try:
        yield
    finally:
        shared_state.install(None)
        if saved is None:
            os.environ.pop(ENV_VAR, None)
        else:
            os.environ[ENV_VAR] = saved
