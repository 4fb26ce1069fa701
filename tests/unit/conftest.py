"""Fixtures of the unit tests."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from celery import Celery
from celery.signals import task_postrun

from celery_election import init_app
from celery_election.election import shared_state
from celery_election.election.shared_state import ENV_VAR, SharedLeadership

from ..support.apps import new_app
from ..support.postrun import Postrun


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No record installed and no record path in the environment; restored afterwards."""
    saved = os.environ.get(ENV_VAR)
    monkeypatch.delenv(ENV_VAR, raising=False)
    shared_state.use(None)
    try:
        yield
    finally:
        shared_state.use(None)
        if saved is None:
            os.environ.pop(ENV_VAR, None)
        else:
            os.environ[ENV_VAR] = saved


@pytest.fixture
def record(clean_env: None) -> Iterator[SharedLeadership]:
    """A real shared record, installed as this process's; closed and uninstalled after."""
    rec = SharedLeadership.create()
    shared_state.use(rec)
    try:
        yield rec
    finally:
        shared_state.use(None)
        rec.close()


@pytest.fixture
def app() -> Celery:
    """An app with the election (namespace "unit"), for the leader task tests."""
    return init_app(new_app(election_namespace="unit"))


@pytest.fixture
def postrun() -> Iterator[Postrun]:
    """The end states of the tasks an in-process worker runs (``support/postrun.py``)."""
    seen = Postrun()
    task_postrun.connect(seen, weak=False)
    yield seen
    task_postrun.disconnect(seen)
