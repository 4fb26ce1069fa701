"""Celery projects laid out the ways Celery's documentation teaches, written into a folder.

Each layout puts the same settings and tasks in a different place: ``app.conf.update``,
Django settings read with ``namespace="CELERY"``, ``config_from_envvar``, a config module
by name; tasks in ``include=``, ``imports``, ``autodiscover_tasks()`` modules. Nothing in
``proj/__init__.py`` imports the tasks, so a process that imports only the app does not
know them, as in a real project.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from pathlib import Path

TASKS = """\
import json
import os

from celery import shared_task

from celery_election import leader_task


def record(kind, **fields):
    with open(os.environ["LAYOUT_RUNS"], "a") as f:
        f.write(json.dumps({"kind": kind, **fields}) + "\\n")


def record_run(task, label):
    record(
        "leader",
        label=label,
        host=task.request.hostname,
        term=task.election_term,
        queue=(task.request.delivery_info or {}).get("routing_key"),
    )


@leader_task(bind=True, name="layout.leader_job")
def leader_job(self, label):
    record_run(self, label)


@leader_task(bind=True, name="layout.retry_job", max_retries=3)
def retry_job(self, label):
    if self.request.retries == 0:  # Celery's own retry: sent again from the worker
        raise self.retry(countdown=0.2)
    record_run(self, label)


@shared_task(bind=True, name="layout.beat_job")
def beat_job(self):
    record("beat", run=getattr(self.request, "election_run", None), term=getattr(
        self.request, "election_term", None))
"""

BEAT_SCHEDULE = '{"tick": {"task": "layout.beat_job", "schedule": 1.0}}'


@dataclass(frozen=True)
class Settings:
    broker: str
    election_url: str
    namespace: str
    table_prefix: str
    queue: str

    def pairs(self) -> dict[str, str]:
        """Setting name -> Python literal."""
        return {
            "broker_url": repr(self.broker),
            "election_url": repr(self.election_url),
            "election_namespace": repr(self.namespace),
            "election_table_prefix": repr(self.table_prefix),
            "task_default_queue": repr(self.queue),
            "beat_schedule": BEAT_SCHEDULE,
            "broker_connection_retry_on_startup": "True",
        }


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


def conf_include(root: Path, s: Settings) -> dict[str, str]:
    """``app.conf.update(...)``, tasks in ``include=``."""
    conf = ", ".join(f"{k}={v}" for k, v in s.pairs().items())
    _write(root, {
        "proj/__init__.py": "from .celery import app\n",
        "proj/celery.py": f"""\
            from celery import Celery
            from celery_election import init_app

            app = Celery("proj", include=["proj.tasks"])
            app.conf.update({conf})
            init_app(app)
            """,
        "proj/tasks.py": TASKS,
    })  # fmt: skip
    return {}


def django_autodiscover(root: Path, s: Settings) -> dict[str, str]:
    """Celery's documented Django set-up: ``CELERY_*`` settings, ``autodiscover_tasks()``."""
    settings = "\n".join(f"CELERY_{k.upper()} = {v}" for k, v in s.pairs().items())
    _write(root, {
        "djsite/__init__.py": "",
        "djsite/settings.py": f"""\
SECRET_KEY = "layout-test"
USE_TZ = True
INSTALLED_APPS = ["jobs"]
DATABASES = {{}}
{settings}
""",
        "jobs/__init__.py": "",
        "jobs/tasks.py": TASKS,
        "proj/__init__.py": "from .celery import app\n",
        "proj/celery.py": """\
            import os

            from celery import Celery
            from celery_election import init_app

            os.environ.setdefault("DJANGO_SETTINGS_MODULE", "djsite.settings")
            app = Celery("proj")
            app.config_from_object("django.conf:settings", namespace="CELERY")
            app.autodiscover_tasks()
            init_app(app)
            """,
    })  # fmt: skip
    return {}


def envvar_imports(root: Path, s: Settings) -> dict[str, str]:
    """``config_from_envvar``: a module named by an environment variable, ``imports``."""
    settings = "\n".join(f"{k} = {v}" for k, v in s.pairs().items())
    _write(root, {
        "proj_settings.py": f'{settings}\nimports = ("proj.tasks",)\n',
        "proj/__init__.py": "from .celery import app\n",
        "proj/celery.py": """\
            from celery import Celery
            from celery_election import init_app

            app = Celery("proj")
            app.config_from_envvar("PROJ_CELERY_CONFIG")
            init_app(app)
            """,
        "proj/tasks.py": TASKS,
    })  # fmt: skip
    return {"PROJ_CELERY_CONFIG": "proj_settings"}


def module_autodiscover(root: Path, s: Settings) -> dict[str, str]:
    """A ``celeryconfig`` module by name, ``autodiscover_tasks(["proj"])`` without Django."""
    settings = "\n".join(f"{k} = {v}" for k, v in s.pairs().items())
    _write(root, {
        "proj/celeryconfig.py": settings + "\n",
        "proj/__init__.py": "from .celery import app\n",
        "proj/celery.py": """\
            from celery import Celery
            from celery_election import init_app

            app = Celery("proj")
            app.config_from_object("proj.celeryconfig")
            app.autodiscover_tasks(["proj"])
            init_app(app)
            """,
        "proj/tasks.py": TASKS,
    })  # fmt: skip
    return {}


LAYOUTS = {
    "conf+include": conf_include,
    "django+autodiscover": django_autodiscover,
    "envvar+imports": envvar_imports,
    "module+autodiscover": module_autodiscover,
}

#: The third process: imports the app only, sends the leader task by name every way.
SENDER = """\
import sys

from celery import chain, group

from proj import app

assert "layout.leader_job" not in app.tasks  # this process never imported the task
n = int(sys.argv[1])
for i in range(n):
    app.send_task("layout.leader_job", [f"send-{i}"])
app.send_task("layout.leader_job", ["countdown"], countdown=1)
app.signature("layout.leader_job", args=["signature"]).apply_async()
group(app.signature("layout.leader_job", args=[f"group-{i}"]) for i in range(2)).apply_async()
chain(
    app.signature("layout.leader_job", args=["chain-0"], immutable=True),
    app.signature("layout.leader_job", args=["chain-1"], immutable=True),
).apply_async()
app.send_task("layout.retry_job", ["retried"])
"""
