"""Every layout Celery accepts holds one election: settings read as Celery reads its own,
leader tasks routed by name from a process that never imported them, and no silent
per-host SQLite default where other hosts share the broker.
"""

from __future__ import annotations

import logging
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from celery_election import init_app
from celery_election.errors import ConfigurationError
from celery_election.settings import ElectionSettings

from ..support.celery_cli import BEAT, one_error_line, run_celery, run_worker

PG = "postgresql+psycopg://app:s3cret@db.internal/app"


def fresh_app(**kwargs: Any) -> Celery:
    return Celery(f"layout{uuid.uuid4().hex[:8]}", set_as_current=False, **kwargs)


@pytest.fixture
def module_dir(tmp_path: Path) -> Iterator[Path]:
    """A directory on sys.path for modules a test writes; they are forgotten after."""
    sys.path.insert(0, str(tmp_path))
    before = set(sys.modules)
    try:
        yield tmp_path
    finally:
        sys.path.remove(str(tmp_path))
        for name in set(sys.modules) - before:
            if (getattr(sys.modules[name], "__file__", None) or "").startswith(str(tmp_path)):
                sys.modules.pop(name, None)


def write_module(where: Path, name: str, text: str) -> str:
    """``name`` (dotted: packages get an ``__init__``) with ``text``; a unique import name."""
    unique = f"{name.split('.')[0]}_{uuid.uuid4().hex[:8]}"
    parts = [unique, *name.split(".")[1:]]
    path = where
    for package in parts[:-1]:
        path = path / package
        path.mkdir(exist_ok=True)
        (path / "__init__.py").touch()
    (path / f"{parts[-1]}.py").write_text(textwrap.dedent(text))
    return ".".join(parts)


# -- settings: every way Celery accepts one ------------------------------------------------


class DjangoSettings:
    """What a Django project's settings.py holds (read with namespace="CELERY")."""

    CELERY_BROKER_URL = "amqp://guest:guest@rabbit.internal//"
    CELERY_ELECTION_URL = PG
    CELERY_ELECTION_NAMESPACE = "djproj"
    CELERY_ELECTION_TTL = 6
    DATABASES = {"default": {}}


def test_django_namespace_settings_are_read() -> None:
    """The bug: conf.items() yields CELERY_ELECTION_URL, so the URL fell back to a file."""
    app = fresh_app()
    app.config_from_object(DjangoSettings, namespace="CELERY")
    init_app(app)
    s = ElectionSettings.from_app(app)
    assert (s.url, s.url_source) == (PG, "election_url")
    assert s.namespace == "djproj"
    assert s.config.ttl == 6.0
    assert s.leader_queue == "election-leader.djproj"
    assert s.split is None


def test_a_celeryconfig_module_and_config_from_envvar(
    module_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = write_module(
        module_dir, "celeryconfig", f"election_url = {PG!r}\nelection_namespace = 'modns'\n"
    )
    by_name = fresh_app()
    by_name.config_from_object(name)
    monkeypatch.setenv("LAYOUT_CONFIG", name)
    by_env = fresh_app()
    by_env.config_from_envvar("LAYOUT_CONFIG")
    for app in (by_name, by_env):
        s = ElectionSettings.from_app(init_app(app))
        assert (s.url, s.namespace) == (PG, "modns")


def test_a_lower_case_namespace_and_a_plain_name_beside_it() -> None:
    """Celery's lookup: the namespaced spelling first, then the plain name."""
    app = fresh_app()
    app.config_from_object(
        {"celery_election_namespace": "low", "election_url": PG}, namespace="celery"
    )
    s = ElectionSettings.from_app(app)
    assert (s.url, s.namespace) == (PG, "low")


def test_a_value_changed_in_either_spelling_is_seen() -> None:
    app = fresh_app()
    app.config_from_object(DjangoSettings, namespace="CELERY")
    assert ElectionSettings.from_app(app).namespace == "djproj"
    app.conf.CELERY_ELECTION_NAMESPACE = "second"
    assert ElectionSettings.from_app(app).namespace == "second"
    # conf.x = y writes the plain name; Celery's lookup still prefers the namespaced one
    app.conf.election_namespace = "third"
    assert ElectionSettings.from_app(app).namespace == app.conf.election_namespace == "second"
    del app.conf.changes["CELERY_ELECTION_NAMESPACE"]
    # Celery's own answer now differs by version (5.7: "third", 5.3: "djproj" from the
    # config object again): ours is Celery's, whichever it is
    assert ElectionSettings.from_app(app).namespace == app.conf.election_namespace


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "celery_election.settings"]


def test_typos_and_unread_spellings_under_a_namespace_are_named_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Typos(DjangoSettings):
        CELERY_ELECTION_TLL = 3  # a typo
        ELECTION_LIVENESS = False  # a real name Celery will not read under CELERY
        CELERY_ELECTION_BEAT_MISSED = "skip"  # retired

    app = fresh_app()
    app.config_from_object(Typos, namespace="CELERY")
    caplog.set_level(logging.WARNING, "celery_election.settings")
    ElectionSettings.from_app(app)
    ElectionSettings.from_app(app, namespace="from-cli")  # the worker's second read
    app.conf.election_namespace = "changed"  # a new parse: still no second warning
    ElectionSettings.from_app(app)
    messages = warnings_of(caplog)
    assert len(messages) == 3, messages
    retired, typo, unread = sorted(messages)
    assert typo.startswith("CELERY_ELECTION_TLL is not a celery-election setting")
    assert "did you mean CELERY_ELECTION_TTL" in typo
    assert unread.startswith("ELECTION_LIVENESS is not read")
    assert "write CELERY_ELECTION_LIVENESS" in unread
    assert retired.startswith("CELERY_ELECTION_BEAT_MISSED is no longer used")


def test_settings_of_other_apps_and_celery_are_not_mistaken_for_typos(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = fresh_app()
    app.config_from_object(DjangoSettings, namespace="CELERY")
    caplog.set_level(logging.WARNING, "celery_election.settings")
    ElectionSettings.from_app(app)
    assert warnings_of(caplog) == []


# -- no silent per-host default -------------------------------------------------------------


@pytest.mark.parametrize(
    ("conf", "shared"),
    [
        ({"broker_url": "amqp://guest:pw@rabbit.internal//"}, "amqp://guest:***@rabbit.internal//"),
        ({"broker_url": "redis://10.0.0.5:6379/0"}, "redis://10.0.0.5:6379/0"),
        ({"broker_url": "memory://", "result_backend": "redis://cache:6379/1"}, "redis://cache"),
        ({"broker_url": "sqla+sqlite:///b.db;amqp://mq.internal//"}, "amqp://mq.internal//"),
        ({"broker_url": "memory://"}, None),
        ({"broker_url": "amqp://guest@localhost//"}, None),
        ({"broker_url": "amqp://guest@127.0.0.1:5672//", "result_backend": "rpc://"}, None),
        ({"broker_url": "redis://[::1]:6379/0"}, None),
        ({"broker_url": "sqla+sqlite:///broker.db", "result_backend": "db+sqlite:///r.db"}, None),
        ({"broker_url": "filesystem://"}, None),
    ],
)
def test_the_default_file_is_refused_where_other_hosts_share_the_broker(
    conf: dict[str, str], shared: str | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    s = ElectionSettings.from_app(_app(conf))
    if shared is None:
        assert s.split is None
        s.refuse_split()
        return
    with pytest.raises(ConfigurationError) as info:
        s.refuse_split()
    text = str(info.value)
    assert shared in text and "pw" not in text
    assert "set election_url to a PostgreSQL or MySQL URL" in text
    assert f"sqlite:///{tmp_path}/celery-election.sqlite3" in text


def _app(conf: dict[str, str]) -> Celery:
    app = fresh_app()
    app.conf.update(conf)
    return app


def test_a_chosen_url_is_never_refused(tmp_path: Path) -> None:
    """The user chose SQLite (single host) or a database: their choice stands."""
    for url in (f"sqlite:///{tmp_path}/e.db", PG):
        app = _app({"broker_url": "amqp://mq.internal//", "election_url": url})
        ElectionSettings.from_app(app).refuse_split()
    app = _app({"broker_url": "amqp://mq.internal//", "result_backend": f"db+{PG}"})
    s = ElectionSettings.from_app(app)
    assert (s.url, s.split) == (PG, None)


def test_the_refusal_names_the_django_spelling() -> None:
    class NoUrl:
        CELERY_BROKER_URL = "amqp://mq.internal//"

    app = fresh_app()
    app.config_from_object(NoUrl, namespace="CELERY")
    with pytest.raises(ConfigurationError, match="set CELERY_ELECTION_URL to"):
        ElectionSettings.from_app(app).refuse_split()


SPLIT = "broker_url='amqp://guest:pw@mq.internal//'"


def test_a_worker_refuses_a_per_host_election_in_one_line(tmp_path: Path) -> None:
    line = one_error_line(run_worker(tmp_path, SPLIT))
    assert "election_url is not set and the broker_url (amqp://guest:***@mq.internal//)" in line
    assert not (tmp_path / "celery-election.sqlite3").exists()


def test_a_beat_refuses_a_per_host_election_in_one_line(tmp_path: Path) -> None:
    line = one_error_line(run_celery(tmp_path, SPLIT, *BEAT))
    assert "election_url is not set and the broker_url (amqp://guest:***@mq.internal//)" in line
    assert not (tmp_path / "celery-election.sqlite3").exists()


# -- leader tasks sent by name from a process that never imported them ----------------------

TASKS = """\
    from celery import shared_task
    from celery_election import leader_task

    # shared tasks join every app: names of their own keep the tests apart
    PREFIX = __name__.split(".")[0]

    @leader_task(name=f"{PREFIX}.nightly")
    def nightly():
        return "led"

    @shared_task(name=f"{PREFIX}.plain")
    def plain():
        return "plain"
"""


def _queue_for(app: Celery, name: str) -> str:
    """Where Celery's router sends ``name``: what send_task and `celery call` use."""
    return str(app.amqp.router.route({}, name, (), {})["queue"].name)


@pytest.mark.parametrize("layout", ["include", "imports", "autodiscover"])
def test_a_leader_task_known_only_to_the_tasks_module_is_routed_by_name(
    module_dir: Path, layout: str
) -> None:
    tasks = write_module(module_dir, "proj.tasks", TASKS)
    package = tasks.rsplit(".", 1)[0]
    app = fresh_app(broker="memory://", **({"include": [tasks]} if layout == "include" else {}))
    app.conf.election_namespace = "bynames"
    if layout == "imports":
        app.conf.imports = [tasks]
    if layout == "autodiscover":
        app.autodiscover_tasks([package])
    init_app(app)
    assert tasks not in sys.modules  # the sender imported only the app
    assert _queue_for(app, f"{package}.nightly") == "election-leader.bynames"
    assert _queue_for(app, f"{package}.plain") == "celery"
    assert tasks in sys.modules


def test_an_unknown_name_imports_the_task_modules_once(module_dir: Path) -> None:
    tasks = write_module(module_dir, "proj.tasks", TASKS)
    app = init_app(fresh_app(broker="memory://", include=[tasks]))
    calls: list[int] = []
    real = app.loader.import_default_modules

    def counting() -> Any:
        calls.append(1)
        return real()

    app.loader.import_default_modules = counting  # type: ignore[method-assign]
    for _ in range(3):
        assert _queue_for(app, "elsewhere.unknown") == "celery"
    assert _queue_for(app, f"{tasks.split('.')[0]}.nightly") == "election-leader.default"
    assert calls == [1]


def test_a_task_module_that_fails_to_import_is_logged_and_the_send_goes_on(
    module_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    broken = write_module(module_dir, "broken.tasks", "raise RuntimeError('boom')\n")
    app = init_app(fresh_app(broker="memory://", include=[broken]))
    assert _queue_for(app, "somewhere.nightly") == "celery"
    assert any("could not import the app's task modules" in r.getMessage() for r in caplog.records)


@pytest.mark.usefixtures("clean_env")
def test_the_worker_banner_names_the_election_without_the_password() -> None:
    from celery_election.integration.bootstep import ElectionStep

    app = fresh_app(broker="memory://")
    app.conf.update(election_url=PG, election_namespace="banner")

    class Worker:
        def __init__(self) -> None:
            self.app = app

        def startup_info(self, artlines: bool = True) -> str:
            return "[config]\n.> app:         proj\n"

    worker = Worker()
    step = ElectionStep(worker, election=True)
    try:
        banner = worker.startup_info(artlines=False)
    finally:
        step.stop(worker)
    assert banner.startswith("[config]\n.> app:         proj\n")
    assert ".> namespace:   banner (leader queue election-leader.banner)" in banner
    assert ".> database:    postgresql+psycopg://app:***@db.internal/app (election_url)" in banner
    assert "s3cret" not in banner
