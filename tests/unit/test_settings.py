"""The election_* settings: read once per app, every problem in one error, typos named."""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery

from celery_election.errors import ConfigurationError
from celery_election.settings import ElectionSettings


def app_with(**conf: Any) -> Celery:
    app = Celery("settings", broker="memory://", set_as_current=False)
    app.conf.update(election_url="memory://", **conf)
    return app


def test_every_problem_is_reported_at_once() -> None:
    app = app_with(
        election_ttl=5,
        election_renew_interval=3,
        election_table_prefix="1bad",
        election_beat_namespace="",
        election_leader_queue="",
        election_listen="yes",
        election_beat_missed="skip",  # retired: a warning, not a problem
    )
    with pytest.raises(ConfigurationError) as err:
        ElectionSettings.from_app(app)
    text = str(err.value)
    for fragment in (
        "ttl (election_ttl) must exceed 2 x renew_interval",
        "table_prefix (election_table_prefix)",
        "namespace (election_namespace) must be non-empty",  # the beat namespace
        "election_leader_queue must be a non-empty string",
        "election_listen must be True or False: got 'yes'",
    ):
        assert fragment in text
    assert len(err.value.problems) == 5


def test_settings_are_parsed_once_per_app_until_they_change(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    app = app_with(election_namespace="shop")
    parsed: list[int] = []
    real = ElectionSettings._parse.__func__  # type: ignore[attr-defined]

    def counting(cls: Any, *args: Any, **kwargs: Any) -> ElectionSettings:
        parsed.append(1)
        return real(cls, *args, **kwargs)  # type: ignore[no-any-return]

    monkeypatch.setattr(ElectionSettings, "_parse", classmethod(counting))
    first = ElectionSettings.from_app(app)
    assert ElectionSettings.from_app(app) is first
    assert len(parsed) == 1
    app.conf.election_namespace = "shop2"
    assert ElectionSettings.from_app(app).namespace == "shop2"
    assert ElectionSettings.from_app(app).leader_queue == "election-leader.shop2"
    assert ElectionSettings.from_app(app).beat_namespace == "shop2-beat"
    assert len(parsed) == 2
    # command-line values win, and do not replace the app's cached settings
    assert ElectionSettings.from_app(app, namespace="cli").namespace == "cli"
    assert ElectionSettings.from_app(app).namespace == "shop2"


def test_a_misspelt_or_retired_setting_is_named(caplog: pytest.LogCaptureFixture) -> None:
    ElectionSettings.from_app(app_with(election_tll=5, election_beat_missed="skip"))
    messages = [r.getMessage() for r in caplog.records]
    assert any("election_tll is not a celery-election setting" in m and "election_ttl" in m
               for m in messages)  # fmt: skip
    assert any("election_beat_missed is no longer used" in m for m in messages)
