"""The Celery side, in process: init_app, settings, default URL, tasks, shared record,
remote control handlers and signals. No servers; a few tests fork or start a Python.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import click
import pytest
from celery import Celery, states
from celery.exceptions import Ignore
from celery.result import EagerResult
from celery.worker.control import Panel

from celery_election import init_app, leader_task, shared_state
from celery_election.app import ElectionSettings, default_election_url, leader_queue_name
from celery_election.bootstep import ElectionStep
from celery_election.clock import boottime
from celery_election.elector import RevokeReason
from celery_election.errors import ConfigurationError, NotLeaderError
from celery_election.shared_state import ENV_VAR, Leadership, SharedLeadership
from celery_election.signals import leader_elected, leader_revoked
from celery_election.tasks import LeaderRouter, LeaderTask, current_term

from ..support.celery_cli import BEAT, REPO, one_error_line, run_celery, run_worker

SQLITE = "sqlite:///"


# -- fixtures -------------------------------------------------------------------------------


@pytest.fixture
def record(clean_env: None) -> Iterator[SharedLeadership]:
    """A real shared record, installed as this process's; closed and uninstalled after."""
    rec = SharedLeadership.create()
    shared_state.install(rec)
    try:
        yield rec
    finally:
        shared_state.install(None)
        rec.close()


def new_app(**conf: Any) -> Celery:
    app = Celery(f"t{uuid.uuid4().hex[:8]}", broker="memory://", set_as_current=True)
    app.conf.update(conf)
    return app


@pytest.fixture
def app() -> Celery:
    return init_app(new_app(election_namespace="unit"))


def election_options(app: Celery) -> list[click.Option]:
    return [
        o
        for o in app.user_options["worker"]
        if isinstance(o, click.Option) and "--election" in o.opts
    ]


def sqlite_path(url: str) -> str:
    assert url.startswith(SQLITE), url
    return url[len(SQLITE) :]


# -- init_app -------------------------------------------------------------------------------


def test_init_app_is_idempotent_and_returns_the_app() -> None:
    app = new_app()
    assert init_app(app) is app
    assert init_app(app) is app
    steps = [s for s in app.steps["worker"] if s is ElectionStep]
    assert len(steps) == 1
    assert len(election_options(app)) == 1
    names = [o.name for o in app.user_options["worker"] if isinstance(o, click.Option)]
    assert sorted(names) == ["election", "election_metrics_port", "election_namespace"]
    beat = [o.name for o in app.user_options["beat"] if isinstance(o, click.Option)]
    assert beat == ["election_metrics_port"]


def test_the_beat_metrics_port_option_sets_the_setting() -> None:
    """``celery beat`` hands its options to ``app.Beat``, which drops unknown ones."""
    app = init_app(new_app())
    (option,) = app.user_options["beat"]
    assert isinstance(option, click.Option)
    ctx = click.Context(click.Command("beat"), obj=SimpleNamespace(app=app))
    assert option.callback is not None
    option.callback(ctx, option, None)
    assert app.conf.get("election_metrics_port") is None
    option.callback(ctx, option, 9809)
    assert app.conf.election_metrics_port == 9809


def test_init_app_is_per_app() -> None:
    first, second = init_app(new_app()), new_app()
    assert len(election_options(first)) == 1
    assert election_options(second) == []
    assert ElectionStep not in second.steps["worker"]
    init_app(second)
    assert len(election_options(second)) == 1


def test_election_option_is_a_tristate_flag() -> None:
    (option,) = election_options(init_app(new_app()))
    assert option.opts == ["--election"]
    assert option.secondary_opts == ["--no-election"]
    assert option.default is None  # None: the election_enabled setting decides


def _worker_help(tmp_path: Path, module: str, with_election: bool) -> str:
    (tmp_path / f"{module}.py").write_text(
        textwrap.dedent(
            f"""
            from celery import Celery
            from celery_election import init_app

            app = Celery({module!r}, broker="memory://")
            if {with_election!r}:
                init_app(app)
                init_app(app)
            """
        )
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])}
    done = subprocess.run(
        [sys.executable, "-m", "celery", "-A", module, "worker", "--help"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _option_lines(text: str, flag: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip().startswith(flag)]


def test_worker_help_lists_the_options_and_leaves_e_and_b_alone(tmp_path: Path) -> None:
    with_election = _worker_help(tmp_path, "helpapp_on", True)
    without = _worker_help(tmp_path, "helpapp_off", False)
    assert "--election / --no-election" in with_election
    assert "--election-namespace" in with_election
    assert "--election" not in without
    # -E is --task-events and -B the embedded beat, with or without election.
    for flag in ("-E,", "-B,"):
        assert _option_lines(with_election, flag) == _option_lines(without, flag)
        assert len(_option_lines(with_election, flag)) == 1
    assert "--task-events" in _option_lines(with_election, "-E,")[0]
    assert "--beat" in _option_lines(with_election, "-B,")[0]
    # Each option is listed once although init_app ran twice.
    assert with_election.count("--election-namespace") == 1
    assert with_election.count("--election / --no-election") == 1


# -- ElectionSettings.from_app --------------------------------------------------------------


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


# -- tasks ----------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["ignore", "Skip", None, 1])
def test_leader_task_bad_on_follower_is_refused_at_decoration(mode: object) -> None:
    with pytest.raises(ConfigurationError) as info:
        leader_task(on_follower=mode)
    assert "on_follower" in str(info.value)
    assert repr(mode) in str(info.value)


def test_base_form_bad_on_follower_is_refused_at_declaration() -> None:
    """@app.task(base=LeaderTask, on_follower=...) is public too: a typo must not wait
    for a follower to run the task (and fail it) to show up."""
    app = new_app()
    app.finalize(auto=True)  # a finalized app builds the task class at decoration
    with pytest.raises(ConfigurationError):
        # shared=False: a shared task's constructor is kept for every later app
        @app.task(base=LeaderTask, shared=False, on_follower="requeu")
        def typo() -> None:
            pass


def test_leader_task_rejects_positional_options() -> None:
    with pytest.raises(TypeError):
        leader_task("name")


def test_bare_leader_task_uses_the_leader_queue_of_the_namespace() -> None:
    app = init_app(new_app(election_namespace="bare-ns"))

    @leader_task
    def bare_leader_noop() -> None:
        pass

    task = app.tasks[bare_leader_noop.name]
    assert isinstance(task, LeaderTask)
    assert task.on_follower == "requeue"  # the default: never lost
    assert task.leader_queue == "election-leader.bare-ns"
    assert bare_leader_noop.leader_queue == "election-leader.bare-ns"


# Celery 5.7 warns that the ``queue`` task attribute is deprecated (no effect in 6.0).
@pytest.mark.filterwarnings("ignore::celery.exceptions.CDeprecationWarning")
def test_leader_task_with_options() -> None:
    app = init_app(new_app(election_namespace="opt-ns"))

    @leader_task(
        app=app, shared=False, on_follower="raise", name="unit.with_options", requeue_delay=2.5
    )
    def with_options() -> None:
        pass

    @leader_task(app=app, shared=False, queue="explicit", name="unit.explicit_queue")
    def explicit_queue() -> None:
        pass

    task = app.tasks["unit.with_options"]
    assert isinstance(task, LeaderTask)
    assert (task.on_follower, task.requeue_delay) == ("raise", 2.5)
    assert task.leader_queue == "election-leader.opt-ns"
    assert app.tasks["unit.explicit_queue"].leader_queue == "explicit"


def test_shared_leader_task_with_options_and_leader_queue_setting() -> None:
    app = init_app(new_app(election_namespace="ns2", election_leader_queue="only-leaders"))

    @leader_task(on_follower="requeue")
    def shared_with_options() -> None:
        pass

    task = app.tasks[shared_with_options.name]
    assert isinstance(task, LeaderTask)
    assert task.on_follower == "requeue"
    assert task.leader_queue == "only-leaders"


@pytest.mark.filterwarnings("error::celery.exceptions.CDeprecationWarning")
def test_default_leader_queue_is_not_a_deprecated_task_attribute() -> None:
    """The leader queue comes from LeaderTask, not from a ``queue`` attribute on each task
    class (which Celery 5.7 deprecates): declaring and binding one must not warn."""
    app = init_app(new_app(election_namespace="nowarn"))

    @leader_task(app=app, shared=False, name="unit.no_warning")
    def no_warning() -> None:
        pass

    assert app.tasks["unit.no_warning"].leader_queue == "election-leader.nowarn"
    assert getattr(app.tasks["unit.no_warning"], "queue", None) is None  # no task attribute


def test_base_form_registers_a_leader_task(app: Celery) -> None:
    @app.task(base=LeaderTask, shared=False, on_follower="raise", name="unit.base_form")
    def base_form() -> None:
        pass

    task = app.tasks["unit.base_form"]
    assert isinstance(task, LeaderTask)
    assert task.leader_queue == "election-leader.unit"
    assert task.on_follower == "raise"


def test_leader_queue_reaches_the_message(app: Celery) -> None:
    """apply_async routes a leader task to the leader queue (memory broker, in process)."""

    @leader_task(app=app, shared=False, name="unit.routed")
    def routed() -> None:
        pass

    seen: list[dict[str, Any]] = []

    def before_publish(sender: str, routing_key: str, **kwargs: Any) -> None:
        seen.append({"task": sender, "routing_key": routing_key})

    from celery.signals import before_task_publish

    before_task_publish.connect(before_publish, weak=False)
    try:
        routed.apply_async()
    finally:
        before_task_publish.disconnect(before_publish)
    assert seen == [{"task": "unit.routed", "routing_key": "election-leader.unit"}]


def test_current_term_is_none_without_a_record(clean_env: None) -> None:
    assert shared_state.current() is None
    assert current_term() is None


def test_current_term_is_none_with_a_stale_path(
    clean_env: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "gone"))
    assert current_term() is None


def _make_tasks(app: Celery) -> dict[str, Any]:
    """One bound leader task per mode; each records its runs and returns its term."""
    runs: list[tuple[str, int | None, int | None]] = []
    tasks: dict[str, Any] = {"runs": runs}
    for mode in ("skip", "requeue", "raise"):

        def body(self: LeaderTask, _mode: str = mode) -> int | None:
            runs.append((_mode, self.election_term, current_term()))
            return self.election_term

        tasks[mode] = leader_task(
            app=app,
            shared=False,
            bind=True,
            on_follower=mode,
            name=f"unit.mode_{mode}",
            requeue_delay=0.01,
        )(body)
    return tasks


def test_leader_runs_the_body_with_its_term(app: Celery, record: SharedLeadership) -> None:
    tasks = _make_tasks(app)
    record.write(4242, boottime() + 10)
    for mode in ("skip", "requeue", "raise"):
        result = tasks[mode].apply()
        assert isinstance(result, EagerResult)
        assert result.state == states.SUCCESS, result.traceback
        assert result.result == 4242
    assert tasks["runs"] == [(m, 4242, 4242) for m in ("skip", "requeue", "raise")]


def test_term_changes_are_seen_by_the_next_run(app: Celery, record: SharedLeadership) -> None:
    tasks = _make_tasks(app)
    record.write(1, boottime() + 10)
    assert tasks["skip"].apply().result == 1
    record.write(2, boottime() + 10)
    assert tasks["skip"].apply().result == 2


def _follower_cases() -> list[Callable[[SharedLeadership], None]]:
    return [
        lambda rec: rec.write(None, None),  # the record says: not leader
        lambda rec: rec.write(7, boottime() - 0.001),  # leader, but trust has run out
        lambda rec: None,  # a fresh record: not leader
    ]


FOLLOWER_IDS = ["not-leader", "trust-expired", "fresh-record"]


@pytest.mark.parametrize("make_follower", _follower_cases(), ids=FOLLOWER_IDS)
def test_follower_skip_is_ignored(
    app: Celery, record: SharedLeadership, make_follower: Callable[[SharedLeadership], None]
) -> None:
    tasks = _make_tasks(app)
    make_follower(record)
    assert current_term() is None
    result = tasks["skip"].apply()
    # Celery reports Ignore raised by before_start as the IGNORED state.
    assert result.state == states.IGNORED
    assert tasks["runs"] == []


@pytest.mark.parametrize("make_follower", _follower_cases(), ids=FOLLOWER_IDS)
def test_follower_raise_fails_with_not_leader(
    app: Celery, record: SharedLeadership, make_follower: Callable[[SharedLeadership], None]
) -> None:
    tasks = _make_tasks(app)
    make_follower(record)
    result = tasks["raise"].apply()
    assert result.state == states.FAILURE
    assert isinstance(result.result, NotLeaderError)
    assert "unit.mode_raise" in str(result.result)
    with pytest.raises(NotLeaderError):
        result.get()
    with pytest.raises(NotLeaderError):
        tasks["raise"].apply(throw=True).get()
    assert tasks["runs"] == []


def test_follower_requeue_in_eager_mode(app: Celery, record: SharedLeadership) -> None:
    """In eager mode (apply(), task_always_eager) Celery runs a retry again at once: apply()
    re-applies the retry signature (countdown ignored) and returns the last attempt's
    result. So a follower never runs the body, and apply() must come back (no endless
    recursion). Observed with celery 5.7 and the current library: after max_retries (3)
    eager re-runs the result is FAILURE with MaxRetriesExceededError; the worker-side
    contract (never lost, never spinning) is tested in the next test."""
    tasks = _make_tasks(app)
    record.write(None, None)
    result = tasks["requeue"].apply()
    assert isinstance(result, EagerResult)
    assert result.state in {states.RETRY, states.FAILURE, states.IGNORED}
    assert result.state != states.SUCCESS
    assert tasks["runs"] == []


@pytest.mark.parametrize("retries", [0, 1, 3, 10, 1000])
def test_follower_requeue_in_a_worker_retries_forever(
    app: Celery, record: SharedLeadership, retries: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As a worker runs it (not eager): each requeue publishes the same request again to
    the leader queue with countdown requeue_delay and acks this copy (Ignore), however
    often it was requeued before: 'never lost', and the retry count is left alone."""
    from celery.canvas import Signature

    sent: list[Signature] = []
    monkeypatch.setattr(Signature, "apply_async", lambda sig, *a, **kw: sent.append(sig))
    tasks = _make_tasks(app)
    task = tasks["requeue"]
    record.write(None, None)
    task_id = uuid.uuid4().hex
    task.push_request(
        id=task_id,
        args=(),
        kwargs={},
        retries=retries,
        is_eager=False,
        called_directly=False,
        delivery_info={"routing_key": "election-leader.unit"},
    )
    try:
        with pytest.raises(Ignore):
            task.before_start(task_id, (), {})
    finally:
        task.pop_request()
    assert len(sent) == 1
    again = sent[0]
    assert again.options["queue"] == "election-leader.unit"
    assert again.options["countdown"] == pytest.approx(0.01)
    assert again.options["task_id"] == task_id  # the same request, not a new task
    assert again.options.get("retries", retries) == retries  # its retry budget untouched
    assert tasks["runs"] == []


def test_requeue_leaves_the_tasks_own_retry_limits_alone(
    app: Celery, record: SharedLeadership
) -> None:
    """A requeue on a follower must not change how the task retries its own errors later
    (Celery keeps retry(max_retries=...) on the task object as override_max_retries, which
    autoretry_for then uses for every later run in that process)."""
    calls: list[int] = []

    @leader_task(
        app=app,
        shared=False,
        bind=True,
        name="unit.autoretry",
        on_follower="requeue",
        autoretry_for=(ValueError,),
        max_retries=2,
        default_retry_delay=0,
    )
    def flaky(self: LeaderTask) -> None:
        calls.append(self.request.retries)
        raise ValueError("boom")

    task = app.tasks["unit.autoretry"]
    record.write(None, None)  # a follower requeues one message ...
    task.push_request(id="r", args=(), kwargs={}, retries=0, is_eager=False, called_directly=False)
    try:
        with pytest.raises(Ignore):  # republished to the leader queue, this copy acked
            task.before_start("r", (), {})
    finally:
        task.pop_request()
    record.write(1, boottime() + 10)  # ... then leads: its own retries stop at max_retries
    task.push_request(id="s", args=(), kwargs={}, retries=2, is_eager=False, called_directly=False)
    try:
        with pytest.raises(ValueError):
            task.run()
    finally:
        task.pop_request()
    assert calls == [2]


def test_leader_task_sets_no_term_for_a_follower(app: Celery, record: SharedLeadership) -> None:
    tasks = _make_tasks(app)
    record.write(3, boottime() + 10)
    task = tasks["skip"]
    task.push_request(id="x", args=(), kwargs={})
    try:
        task.before_start("x", (), {})
        assert task.election_term == 3
        record.write(None, None)  # the next run, on a follower, runs under no term
        with pytest.raises(Ignore):
            task.before_start("x", (), {})
        assert task.election_term is None
    finally:
        task.pop_request()


# -- shared_state ---------------------------------------------------------------------------


def test_fresh_record_reads_not_leader(record: SharedLeadership) -> None:
    reading = record.read()
    assert reading == Leadership(False, None, 0.0)
    assert reading.trusted() is False
    assert record.leader_term() is None
    assert os.environ[ENV_VAR] == record.path
    assert shared_state.current() is record


def test_write_read_round_trip(record: SharedLeadership) -> None:
    until = boottime() + 5
    record.write(2**62 + 5, until)
    reading = record.read()
    assert reading == Leadership(True, 2**62 + 5, until)
    assert reading.trusted()
    assert reading.trusted(now=until - 0.001)
    assert not reading.trusted(now=until)
    assert record.leader_term() == 2**62 + 5
    assert current_term() == 2**62 + 5


def test_token_round_trip(record: SharedLeadership) -> None:
    token = uuid.uuid4().hex
    until = boottime() + 5
    record.write(8, until, token)
    assert record.read() == Leadership(True, 8, until, token)
    record.write(9, until)  # no token
    assert record.read().token is None
    record.write(None, None, token)  # not leader: no token either
    assert record.read().token is None


@pytest.mark.parametrize(("term", "until"), [(None, None), (5, None), (None, 1e9)])
def test_none_means_not_leader(record: SharedLeadership, term: Any, until: Any) -> None:
    record.write(9, boottime() + 5)
    record.write(term, until)
    assert record.read() == Leadership(False, None, 0.0)
    assert record.leader_term() is None
    assert current_term() is None


def test_reading_is_shared_across_fork(record: SharedLeadership) -> None:
    """The child sees what the parent writes after the fork: the mapping is MAP_SHARED."""
    until = boottime() + 30
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        code = 1
        try:
            os.close(w)
            os.read(r, 1)  # wait until the parent has written
            ok_read = record.read() == Leadership(True, 77, until)
            ok_term = current_term() == 77 and shared_state.current() is record
            code = 0 if ok_read and ok_term else 2
        finally:
            os._exit(code)
    os.close(r)
    try:
        assert record.read() == Leadership(False, None, 0.0)
        record.write(77, until)
        os.write(w, b"x")
    finally:
        os.close(w)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


SPAWNED_READER = """
import sys
from celery_election import shared_state
from celery_election.tasks import current_term

record = shared_state.current()
print(record is not None and not record.owner, flush=True)
print(current_term(), flush=True)
sys.stdin.readline()
print(current_term(), flush=True)
record.close()  # a reader's close() must not remove the writer's file
"""


def test_spawned_process_attaches_by_path(record: SharedLeadership) -> None:
    record.write(11, boottime() + 30)
    env = {**os.environ, ENV_VAR: record.path, "PYTHONPATH": str(REPO)}
    child = subprocess.Popen(
        [sys.executable, "-c", SPAWNED_READER],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline().strip() == "True"
        assert child.stdout.readline().strip() == "11"
        record.write(None, None)  # live: the child sees the change
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "None"
        assert child.wait(timeout=30) == 0, child.stderr.read() if child.stderr else ""
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert os.path.exists(record.path)


def test_close_unlinks_the_file(clean_env: None) -> None:
    rec = SharedLeadership.create()
    path = rec.path
    assert os.path.exists(path)
    assert os.environ[ENV_VAR] == path
    rec.write(4, boottime() + 10)
    assert rec.leader_term() == 4
    rec.close()
    assert not os.path.exists(path)
    assert ENV_VAR not in os.environ
    assert rec.leader_term() is None  # a task that checks during shutdown: not leading
    assert not rec.read().leader
    rec.close()  # idempotent


def test_attached_reader_close_keeps_the_file(record: SharedLeadership) -> None:
    reader = SharedLeadership(record.path, create=False)
    record.write(3, boottime() + 10)
    assert reader.read().term == 3
    reader.close()
    assert os.path.exists(record.path)
    assert record.read().term == 3


#: The torn-read tests: a writer writes (n, BASE + n) for odd n and (n, 1.0), a trust that
#: has ended, for even n, n = 1, 2, ... until the reader has made MIN_READS reads and seen
#: MIN_TERMS different terms: that many, however fast or slow the machine (RACE_TIMEOUT
#: only stops a run that hangs). Both readers are checked: ``read()`` and the per-task
#: ``leader_term()``, which reads word by word and must never pair an even term with a
#: trust that has not ended.
MIN_READS = 20_000
MIN_TERMS = 1_000
RACE_TIMEOUT = 60.0
BASE = 1e7  # trust deadlines far in the future of the boot-time clock

READERS = {
    "read": lambda record: _whole(record.read()),
    "leader_term": lambda record: _odd(record.leader_term()),
}


def _whole(r: Leadership) -> tuple[bool, int | None]:
    term = r.term or 0
    until = BASE + term if term % 2 else 1.0
    return r.leader and r.trusted_until == until, r.term


def _odd(term: int | None) -> tuple[bool, int | None]:
    return term is None or term % 2 == 1, term


def write_step(record: SharedLeadership, n: int) -> None:
    record.write(n, BASE + n if n % 2 else 1.0)


def read_while_written(record: SharedLeadership, reader: str) -> tuple[int, set[int]]:
    """Read until MIN_READS reads have seen MIN_TERMS terms; return (reads, terms).

    Every reading must be whole and no term older than one read before it.
    """
    read = READERS[reader]
    torn: list[int | None] = []
    backwards: list[tuple[int, int]] = []
    terms: set[int] = set()
    reads, latest = 0, 0
    deadline = time.monotonic() + RACE_TIMEOUT
    while (reads < MIN_READS or len(terms) < MIN_TERMS) and time.monotonic() < deadline:
        whole, term = read(record)
        reads += 1
        if not whole:
            torn.append(term)
        elif term is None:
            pass
        elif term < latest:
            backwards.append((latest, term))
        else:
            latest = term
            terms.add(term)
        if len(torn) + len(backwards) >= 10:
            break
    assert torn == []
    assert backwards == []
    assert reads >= MIN_READS and len(terms) >= MIN_TERMS, (
        f"in {RACE_TIMEOUT}s the reader made {reads} reads and saw {len(terms)} terms"
    )
    return reads, terms


@pytest.mark.parametrize("reader", sorted(READERS))
def test_no_torn_reads_between_threads(record: SharedLeadership, reader: str) -> None:
    """A writer thread writes records; a reader must never see a mixed one."""
    write_step(record, 1)
    stop = threading.Event()
    written = [0]

    def writer() -> None:
        n = 1
        while not stop.is_set():
            write_step(record, n)
            written[0] = n
            n += 1

    old_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # switch threads often: mid-write switches happen
    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    try:
        _, terms = read_while_written(record, reader)
    finally:
        stop.set()
        thread.join(5)
        sys.setswitchinterval(old_interval)
    assert not thread.is_alive()
    assert written[0] >= max(terms)


@pytest.mark.parametrize("reader", sorted(READERS))
def test_no_torn_reads_across_processes(record: SharedLeadership, reader: str) -> None:
    """The real layout: a writer process and a reader process on different CPUs."""
    write_step(record, 1)
    stop_r, stop_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: the writer, until the reader is done (or gone)
        try:
            os.close(stop_w)
            os.set_blocking(stop_r, False)
            n, end = 1, time.monotonic() + RACE_TIMEOUT
            while time.monotonic() < end:
                for _ in range(1000):
                    write_step(record, n)
                    n += 1
                with contextlib.suppress(BlockingIOError):
                    os.read(stop_r, 1)
                    break  # a byte, or end of file: the reader is done
        finally:
            os._exit(0)
    os.close(stop_r)
    try:
        read_while_written(record, reader)
    finally:
        os.close(stop_w)  # the writer stops
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


# -- remote control -------------------------------------------------------------------------


def control_state(step: Any) -> Any:
    controller = SimpleNamespace() if step is None else SimpleNamespace(election=step)
    return SimpleNamespace(consumer=SimpleNamespace(controller=controller))


def test_commands_are_registered() -> None:
    assert Panel.meta["election"].type == "inspect"
    assert Panel.meta["election_resign"].type == "control"


def test_inspect_election_without_election() -> None:
    assert Panel.data["election"](control_state(None)) == {"enabled": False}


def test_inspect_election_reports_the_step() -> None:
    info = {"namespace": "ns", "leader": True, "term": 12, "trusted_for": 3.5}
    step = SimpleNamespace(info=lambda: info)
    assert Panel.data["election"](control_state(step)) == {"enabled": True, **info}


class FakeElector:
    def __init__(self, is_leader: bool, resigns: bool) -> None:
        self.is_leader = is_leader
        self._resigns = resigns
        self.calls: list[dict[str, Any]] = []

    def resign(self, **kwargs: Any) -> bool:
        self.calls.append(kwargs)
        self.is_leader = False
        return self._resigns


@pytest.mark.parametrize("step", [None, SimpleNamespace(elector=None)])
def test_resign_without_election(step: Any) -> None:
    reply = Panel.data["election_resign"](control_state(step))
    assert set(reply) == {"error"}
    assert "not enabled" in reply["error"]


@pytest.mark.parametrize(
    ("is_leader", "resigns", "expected"),
    [
        (True, True, {"ok": "resigned"}),
        (False, True, {"ok": "released an unconfirmed term"}),
        (False, False, {"ok": "not the leader"}),
    ],
)
def test_resign(is_leader: bool, resigns: bool, expected: dict[str, str]) -> None:
    elector = FakeElector(is_leader, resigns)
    reply = Panel.data["election_resign"](control_state(SimpleNamespace(elector=elector)))
    assert reply == expected
    assert len(elector.calls) == 1
    assert elector.calls[0].get("wait") is True


# -- the bootstep's signals and queue switching ---------------------------------------------


@pytest.fixture
def step(clean_env: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Any]:
    """An enabled ElectionStep on a fake worker (app, hostname; no consumer), not started."""
    monkeypatch.chdir(tmp_path)
    app = init_app(new_app(election_namespace="sig-ns"))
    worker = SimpleNamespace(app=app, hostname="w1@host")
    s = ElectionStep(worker, election=True)
    try:
        yield s
    finally:
        s.shutdown(worker)
        assert s.shared is None


def test_disabled_step_does_nothing(clean_env: None) -> None:
    worker = SimpleNamespace(app=init_app(new_app()), hostname="w")
    s = ElectionStep(worker)
    assert s.enabled is False
    assert s.shared is None
    assert not hasattr(worker, "election")
    assert shared_state.current() is None


def test_a_metrics_port_without_an_election_warns(
    clean_env: None, caplog: pytest.LogCaptureFixture
) -> None:
    worker = SimpleNamespace(app=init_app(new_app()), hostname="w")
    with caplog.at_level("WARNING", logger="celery_election"):
        s = ElectionStep(worker, election_metrics_port=9808)
    assert s.enabled is False and s.server is None
    (line,) = [r.getMessage() for r in caplog.records if "metrics_port" in r.getMessage()]
    assert "nothing is served" in line and "--election" in line


def test_enabled_step_publishes_not_leader_before_start(step: Any) -> None:
    assert step.worker.election is step
    shared: SharedLeadership = step.shared
    assert shared is not None
    assert shared_state.current() is shared
    assert shared.read() == Leadership(False, None, 0.0)
    assert os.environ[ENV_VAR] == shared.path
    info = step.info()
    assert info["namespace"] == "sig-ns"
    assert info["leader"] is False
    assert info["leader_queue"] == "election-leader.sig-ns"


def test_signals_deliver_term_and_namespace(step: Any) -> None:
    got: list[tuple[str, dict[str, Any]]] = []

    def on_elected(sender: Any, **kwargs: Any) -> None:
        got.append(("elected", {"sender": sender, **kwargs}))

    def on_revoked(sender: Any, **kwargs: Any) -> None:
        got.append(("revoked", {"sender": sender, **kwargs}))

    leader_elected.connect(on_elected, weak=False)
    leader_revoked.connect(on_revoked, weak=False)
    try:
        step._elected(41)
        step._revoked(41, RevokeReason.EXPIRED)
        step._revoked(41, RevokeReason.RESIGNED)
    finally:
        leader_elected.disconnect(on_elected)
        leader_revoked.disconnect(on_revoked)
    assert [name for name, _ in got] == ["elected", "revoked", "revoked"]
    elected, expired, resigned = (kw for _, kw in got)
    assert elected["sender"] == "w1@host"
    assert (elected["term"], elected["namespace"]) == (41, "sig-ns")
    assert (expired["term"], expired["namespace"], expired["reason"]) == (41, "sig-ns", "expired")
    assert resigned["reason"] == "resigned"
    assert "signal" in elected  # Celery adds the signal itself


def test_signal_receiver_errors_do_not_escape(step: Any, caplog: pytest.LogCaptureFixture) -> None:
    """A failing receiver must not break the elector's event thread (Celery logs it)."""
    raised: list[tuple[str, int]] = []
    received: list[tuple[str, int]] = []

    def broken(sender: Any, **kwargs: Any) -> None:
        raised.append((kwargs["signal"].name, kwargs["term"]))
        raise RuntimeError("receiver bug")

    def healthy(sender: Any, **kwargs: Any) -> None:
        received.append((kwargs["signal"].name, kwargs["term"]))

    consumer = FakeConsumer(step.worker.app, started=True)
    step.worker.consumer = consumer
    signals = (leader_elected, leader_revoked)
    for signal in signals:
        signal.connect(broken, weak=False)  # first: a receiver after it must still run
        signal.connect(healthy, weak=False)
    try:
        # the event thread's callbacks: each returns, though a receiver raised inside
        step._elected(1)
        step._revoked(1, RevokeReason.LOST)
    finally:
        for signal in signals:
            signal.disconnect(broken)
            signal.disconnect(healthy)
    assert raised == [("leader_elected", 1), ("leader_revoked", 1)]
    assert received == raised
    consumer.run_soon()  # and the leader queue still followed leadership
    assert consumer.added == consumer.cancelled == ["election-leader.sig-ns"]
    logged = [r for r in caplog.records if "receiver bug" in r.getMessage()]
    assert len(logged) == 2 and all(r.levelname == "ERROR" for r in logged)


class FakeConsumer:
    def __init__(self, app: Celery, started: bool) -> None:
        self.app = app
        self.task_consumer = object() if started else None
        self.soon: list[Callable[[], None]] = []
        self.added: list[str] = []
        self.cancelled: list[str] = []

    def call_soon(self, fn: Callable[[], None]) -> None:
        self.soon.append(fn)

    def add_task_queue(self, queue: str) -> None:
        self.added.append(queue)

    def cancel_task_queue(self, queue: str) -> None:
        self.cancelled.append(queue)

    def run_soon(self) -> None:
        soon, self.soon = self.soon, []
        for fn in soon:
            fn()


def test_leader_queue_follows_leadership_on_a_running_consumer(step: Any) -> None:
    consumer = FakeConsumer(step.worker.app, started=True)
    step.worker.consumer = consumer
    step._elected(5)
    assert consumer.added == []  # only through call_soon: the consumer's own thread
    consumer.run_soon()
    assert consumer.added == ["election-leader.sig-ns"]
    step._revoked(5, RevokeReason.LOST)
    consumer.run_soon()
    assert consumer.cancelled == ["election-leader.sig-ns"]


def test_leader_queue_selected_before_the_consumer_starts(step: Any) -> None:
    app = step.worker.app
    consumer = FakeConsumer(app, started=False)
    step.worker.consumer = consumer
    queues = app.amqp.queues
    step._elected(5)
    consumer.run_soon()
    assert "election-leader.sig-ns" in {q.name for q in queues.consume_from.values()}
    step._revoked(5, RevokeReason.LOST)
    consumer.run_soon()
    assert "election-leader.sig-ns" not in {q.name for q in queues.consume_from.values()}


def test_records_of_dead_workers_are_swept(tmp_path: Path) -> None:
    """A SIGKILLed worker cannot remove its record: the next worker on the host does."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    dead = tmp_path / f"celery-election-{gone.pid}-0123456789ab"
    alive = tmp_path / f"celery-election-{os.getpid()}-0123456789ab"
    other = tmp_path / "celery-election-notapid-x"
    for path in (dead, alive, other):
        path.write_bytes(b"\0" * 56)
    assert shared_state.sweep(str(tmp_path)) == 1
    assert not dead.exists() and alive.exists() and other.exists()


def test_metrics_tables_of_dead_workers_are_swept(tmp_path: Path, monkeypatch: Any) -> None:
    """The metrics table too: a new table sweeps those of workers that were SIGKILLed."""
    from celery_election import metrics, shm

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    dead = tmp_path / f"celery-election-metrics-{gone.pid}-0123456789ab"
    alive = tmp_path / f"celery-election-metrics-{os.getpid()}-0123456789ab"
    record = tmp_path / f"celery-election-{os.getpid()}-0123456789ab"
    for path in (dead, alive, record):
        path.write_bytes(b"\0" * 56)
    monkeypatch.setattr(shm, "directory", lambda: str(tmp_path))
    monkeypatch.delenv(metrics.ENV_VAR, raising=False)
    table = metrics.SharedCounters.create()
    try:
        assert not dead.exists() and alive.exists() and record.exists()
        assert os.path.dirname(table.path) == str(tmp_path)
    finally:
        table.close()
    assert shared_state.sweep(str(tmp_path)) == 0  # leaves the metrics tables alone
    assert alive.exists()


def test_a_worker_with_bad_settings_ends_with_one_clear_line(tmp_path: Path) -> None:
    """Not a 55-line traceback: one line, every problem, exit status 1."""
    done = run_worker(
        tmp_path, "election_url='memory://', election_ttl=-1, election_namespace=' padded'"
    )
    line = one_error_line(done)
    assert "election_ttl" in line and "election_namespace" in line


@contextlib.contextmanager
def taken_port() -> Iterator[int]:
    """A port another socket listens on, for as long as the block runs."""
    with socket.socket() as taken:
        taken.bind(("", 0))
        taken.listen()
        yield taken.getsockname()[1]


def test_a_taken_metrics_port_ends_the_worker_before_it_campaigns(tmp_path: Path) -> None:
    """The port is taken while the worker is built: one line, exit 1, and the election
    database never touched (no candidate, no lease, not even the file)."""
    pytest.importorskip("prometheus_client")
    db = tmp_path / "election.db"
    with taken_port() as port:
        done = run_worker(tmp_path, f"election_url='sqlite:///{db}'", "--election-metrics-port",
                          str(port))  # fmt: skip
    line = one_error_line(done)
    assert f"port {port}" in line and "election_metrics_port" in line
    assert not db.exists()


def test_a_standalone_beat_with_bad_settings_ends_with_one_clear_line(tmp_path: Path) -> None:
    """``celery beat`` logs a scheduler's exception with its traceback: ours exits first."""
    done = run_celery(tmp_path, "election_url='memory://', election_ttl=-1", *BEAT)
    line = one_error_line(done)
    assert "election_ttl" in line and "fix the election_* settings" in line


def test_a_standalone_beat_whose_metrics_port_is_taken_never_campaigns(tmp_path: Path) -> None:
    pytest.importorskip("prometheus_client")
    db = tmp_path / "election.db"
    with taken_port() as port:
        conf = f"election_url='sqlite:///{db}', election_metrics_port={port}"
        done = run_celery(tmp_path, conf, *BEAT)
    line = one_error_line(done)
    assert f"port {port}" in line
    with sqlite3.connect(db) as conn:  # the tables were installed, nobody campaigned
        assert conn.execute("SELECT count(*) FROM celery_election_lease").fetchone() == (0,)


# -- routing however a leader task is sent ---------------------------------------------------


def _queue_for(app: Celery, name: str, **options: Any) -> str:
    """Where Celery's router sends ``name`` (what send_task and `celery call` use)."""
    routed = app.amqp.router.route(options, name, (), {})
    return str(routed["queue"].name)


def test_leader_tasks_sent_by_name_go_to_the_leader_queue() -> None:
    app = init_app(new_app(election_namespace="routed"))

    @app.task(base=LeaderTask, shared=False, name="proj.nightly")
    def nightly() -> None:
        pass

    @app.task(shared=False, name="proj.plain")
    def plain() -> None:
        pass

    assert _queue_for(app, "proj.nightly") == "election-leader.routed"
    assert _queue_for(app, "proj.plain") == "celery"  # untouched
    assert _queue_for(app, "proj.nightly", queue="elsewhere") == "elsewhere"  # the call wins
    # send_task by name publishes there too (no apply_async of ours involved)
    with app.connection_for_write() as conn:
        result = app.send_task("proj.nightly", connection=conn)
        assert result.id


def test_the_apps_own_routes_win_and_are_kept() -> None:
    app = new_app(election_namespace="own", task_routes={"proj.nightly": {"queue": "mine"}})
    init_app(app)
    init_app(app)  # idempotent: one router

    @app.task(base=LeaderTask, shared=False, name="proj.nightly")
    def nightly() -> None:
        pass

    @app.task(base=LeaderTask, shared=False, name="proj.other")
    def other() -> None:
        pass

    assert _queue_for(app, "proj.nightly") == "mine"
    assert _queue_for(app, "proj.other") == "election-leader.own"
    routers = [r for r in app.conf.task_routes if isinstance(r, LeaderRouter)]
    assert len(routers) == 1


def test_the_router_arrives_with_a_configuration_loaded_after_init_app() -> None:
    app = Celery(f"t{uuid.uuid4().hex[:8]}", set_as_current=False)
    init_app(app)  # before config_from_object: must not load the configuration early
    assert not app.configured
    app.config_from_object({"broker_url": "memory://", "election_namespace": "late"})

    @app.task(base=LeaderTask, shared=False, name="proj.late")
    def late() -> None:
        pass

    assert _queue_for(app, "proj.late") == "election-leader.late"
