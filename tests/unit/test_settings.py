"""The election_* settings: read once per app, every problem in one error, typos named."""

from __future__ import annotations

import logging
import os
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from celery_election.errors import ConfigurationError
from celery_election.settings import ElectionSettings, default_election_url, leader_queue_name

from ..support.apps import new_app

SQLITE = "sqlite:///"


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
    caplog.set_level(logging.WARNING)  # an in-process worker earlier may have raised root's
    ElectionSettings.from_app(app_with(election_tll=5, election_beat_missed="skip"))
    messages = [r.getMessage() for r in caplog.records]
    assert any("election_tll is not a celery-election setting" in m and "election_ttl" in m
               for m in messages)  # fmt: skip
    assert any("election_beat_missed is no longer used" in m for m in messages)


# -- ElectionSettings.from_app --------------------------------------------------------------


def sqlite_path(url: str) -> str:
    assert url.startswith(SQLITE), url
    return url[len(SQLITE) :]


def test_settings_defaults(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    s = ElectionSettings.from_app(new_app())
    assert s.namespace == "default"
    assert s.enabled is False
    assert s.table_prefix == "celery_election_"
    assert s.auto_install is True
    assert s.listen is True
    assert s.listen_url is None
    assert s.leader_queue == "election-leader.default" == leader_queue_name("default")
    path = sqlite_path(s.url)
    assert os.path.isabs(path)
    assert os.path.dirname(path) == str(tmp_path)
    assert s.config.ttl == 10.0


def test_settings_read_from_conf() -> None:
    app = new_app(
        election_url="sqlite:////tmp/x.db",
        election_namespace="billing",
        election_enabled=True,
        election_table_prefix="ce_",
        election_auto_install=False,
        election_listen=False,
        election_listen_url="postgresql+psycopg://direct/db",
        election_ttl=timedelta(seconds=6),
        election_renew_interval=2,
    )
    s = ElectionSettings.from_app(app)
    assert (s.url, s.url_source) == ("sqlite:////tmp/x.db", "election_url")
    assert s.namespace == "billing"
    assert s.enabled is True
    assert s.table_prefix == "ce_"
    assert s.auto_install is False
    assert s.listen is False
    assert s.listen_url == "postgresql+psycopg://direct/db"
    assert s.leader_queue == "election-leader.billing"
    assert (s.config.ttl, s.config.renew_interval) == (6.0, 2.0)


def test_explicit_leader_queue_setting_wins() -> None:
    s = ElectionSettings.from_app(new_app(election_leader_queue="lq", election_namespace="a"))
    assert s.leader_queue == "lq"


@pytest.mark.parametrize("conf_enabled", [True, False])
def test_command_line_overrides_conf(conf_enabled: bool) -> None:
    app = new_app(election_enabled=conf_enabled, election_namespace="from-conf")
    s = ElectionSettings.from_app(app, enabled=not conf_enabled, namespace="from-cli")
    assert s.enabled is (not conf_enabled)
    assert s.namespace == "from-cli"
    assert s.leader_queue == "election-leader.from-cli"
    # Options not given on the command line (None) leave the settings alone.
    s = ElectionSettings.from_app(app, enabled=None, namespace=None)
    assert s.enabled is conf_enabled
    assert s.namespace == "from-conf"


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("election_ttl", "ten"),
        ("election_ttl", -1),
        ("election_ttl", 0),
        ("election_ttl", float("nan")),
        ("election_ttl", True),
        ("election_renew_interval", "2s"),
        ("election_poll_interval", -0.5),
        ("election_safety_margin", "x"),
        ("election_jitter", 0.9),
        ("election_call_timeout", 0),
    ],
)
def test_bad_timing_names_the_setting(setting: str, value: object) -> None:
    with pytest.raises(ConfigurationError) as info:
        ElectionSettings.from_app(new_app(**{setting: value}))
    assert setting in str(info.value)
    assert repr(value) in str(info.value) or str(value) in str(info.value)


def test_inconsistent_timings_are_refused() -> None:
    with pytest.raises(ConfigurationError) as info:
        ElectionSettings.from_app(new_app(election_ttl=4, election_renew_interval=3))
    assert "election_ttl" in str(info.value)
    assert "election_renew_interval" in str(info.value)


@pytest.mark.parametrize(
    "setting", ["election_enabled", "election_auto_install", "election_listen"]
)
@pytest.mark.parametrize("value", ["yes", "false", 1, 0, "True"])
def test_non_bool_flags_are_refused(setting: str, value: object) -> None:
    with pytest.raises(ConfigurationError) as info:
        ElectionSettings.from_app(new_app(**{setting: value}))
    assert setting in str(info.value)
    assert repr(value) in str(info.value)


@pytest.mark.parametrize("value", [-1, 17, "2", 1.5, True])
def test_a_bad_number_of_publishers_is_refused_with_what_to_set(value: object) -> None:
    with pytest.raises(ConfigurationError) as info:
        ElectionSettings.from_app(new_app(election_beat_publishers=value))
    assert str(info.value) == (
        f"election_beat_publishers must be a whole number from 0 to 16: got {value!r}"
    )


def test_publishers_default_to_none_and_take_a_count() -> None:
    assert ElectionSettings.from_app(new_app()).beat_publishers == 0
    assert ElectionSettings.from_app(new_app(election_beat_publishers=2)).beat_publishers == 2


def test_all_problems_are_reported_at_once() -> None:
    """A bad flag and a bad timing: both in one error, like ElectionConfig does."""
    with pytest.raises(ConfigurationError) as info:
        ElectionSettings.from_app(new_app(election_enabled="yes", election_ttl=-1))
    text = str(info.value)
    assert "election_enabled" in text
    assert "election_ttl" in text


@pytest.mark.parametrize("namespace", [" padded", "tab\tbed", "x" * 191, 42, "new\nline"])
def test_bad_namespace_in_conf_is_refused(namespace: object) -> None:
    with pytest.raises(ConfigurationError) as info:
        ElectionSettings.from_app(new_app(election_namespace=namespace))
    assert "election_namespace" in str(info.value)


@pytest.mark.parametrize("namespace", [" padded", "x" * 191, "bell\a"])
def test_bad_namespace_on_command_line_is_refused(namespace: str) -> None:
    with pytest.raises(ConfigurationError):
        ElectionSettings.from_app(new_app(), namespace=namespace)


def test_empty_namespace_setting_is_refused() -> None:
    """election_namespace="" (e.g. from an empty environment variable) must not silently
    join the "default" election of every other app on the database."""
    with pytest.raises(ConfigurationError) as info:
        ElectionSettings.from_app(new_app(election_namespace=""))
    assert "election_namespace" in str(info.value)


# -- default_election_url -------------------------------------------------------------------


def test_default_url_from_db_result_backend() -> None:
    app = new_app(result_backend="db+postgresql+psycopg://u@h/db")
    url, why = default_election_url(app)
    assert url == "postgresql+psycopg://u@h/db"
    assert "result_backend" in why


def test_default_url_from_backend_argument() -> None:
    app = Celery("t", broker="memory://", backend="db+mysql+pymysql://u@h/db")
    assert default_election_url(app)[0] == "mysql+pymysql://u@h/db"


def test_default_url_from_sqla_broker() -> None:
    app = new_app(broker_url="sqla+mysql+pymysql://u:p@h:3306/db")
    url, why = default_election_url(app)
    assert url == "mysql+pymysql://u:p@h:3306/db"
    assert "broker_url" in why


def test_default_url_prefers_result_backend_over_broker() -> None:
    app = new_app(
        result_backend="db+postgresql+psycopg://u@pg/db",
        broker_url="sqla+mysql+pymysql://u@my/db",
    )
    assert default_election_url(app)[0] == "postgresql+psycopg://u@pg/db"


def test_default_url_follows_celery_environment_variables(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Celery's app.conf.result_backend / broker_url honour CELERY_RESULT_BACKEND and
    CELERY_BROKER_URL: the election must use the database the app really uses."""
    monkeypatch.setenv("CELERY_RESULT_BACKEND", "db+postgresql+psycopg://u@env/db")
    app = Celery("t")
    assert app.conf.result_backend == "db+postgresql+psycopg://u@env/db"
    assert default_election_url(app)[0] == "postgresql+psycopg://u@env/db"
    monkeypatch.delenv("CELERY_RESULT_BACKEND")
    monkeypatch.setenv("CELERY_BROKER_URL", "sqla+mysql+pymysql://u@env/db")
    app = Celery("t")
    assert default_election_url(app)[0] == "mysql+pymysql://u@env/db"


@pytest.mark.parametrize("relative", [False, True])
def test_sqlite_broker_is_never_the_election_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, relative: bool
) -> None:
    monkeypatch.chdir(tmp_path)
    broker_file = tmp_path / "broker.db"
    broker = "sqla+sqlite:///broker.db" if relative else f"sqla+sqlite:///{broker_file}"
    url, why = default_election_url(new_app(broker_url=broker))
    path = sqlite_path(url)
    assert os.path.isabs(path)
    assert Path(path) != broker_file
    assert "host" in why  # SQLite elects within one host only


def test_sqlite_broker_named_like_the_default_file_is_not_shared(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Even a broker file that happens to have the default election file's name."""
    monkeypatch.chdir(tmp_path)
    default_path = sqlite_path(default_election_url(new_app())[0])
    app = new_app(broker_url=f"sqla+sqlite:///{default_path}")
    assert sqlite_path(default_election_url(app)[0]) != default_path
    app = new_app(result_backend=f"db+sqlite:///{default_path}")
    assert sqlite_path(default_election_url(app)[0]) != default_path


def test_amqp_broker_and_rpc_backend_get_a_sqlite_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    app = new_app(broker_url="amqp://guest:guest@localhost//", result_backend="rpc://")
    url, why = default_election_url(app)
    assert os.path.isabs(sqlite_path(url))
    assert os.path.dirname(sqlite_path(url)) == str(tmp_path)
    assert "host" in why
    s = ElectionSettings.from_app(app)
    assert (s.url, s.url_source) == (url, why)


@pytest.mark.parametrize(
    "backend", ["db+sqlite:///r.db", "redis://localhost/0", "db+oracle://u@h/db"]
)
def test_other_result_backends_get_a_sqlite_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, backend: str
) -> None:
    monkeypatch.chdir(tmp_path)
    url, _ = default_election_url(new_app(result_backend=backend))
    assert url.startswith(SQLITE)
    assert Path(sqlite_path(url)) != tmp_path / "r.db"


# -- backend_options ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url", ["postgresql+psycopg://u@h/db", "postgresql://u@h/db", "postgres://u@h/db"]
)
def test_postgres_backend_options_listen(url: str) -> None:
    s = ElectionSettings.from_app(new_app(election_url=url, election_table_prefix="p_"))
    assert s.backend_options() == {"table_prefix": "p_", "listen": True}
    s = ElectionSettings.from_app(
        new_app(election_url=url, election_listen=False, election_listen_url="postgresql://d/b")
    )
    assert s.backend_options() == {
        "table_prefix": "celery_election_",
        "listen": False,
        "listen_url": "postgresql://d/b",
    }


@pytest.mark.parametrize("url", ["sqlite:////tmp/e.db", "mysql+pymysql://root@h/test"])
def test_other_backend_options_have_no_listen(url: str) -> None:
    s = ElectionSettings.from_app(
        new_app(election_url=url, election_listen=True, election_listen_url="postgresql://x/y")
    )
    assert s.backend_options() == {"table_prefix": "celery_election_"}
