"""The core (Elector, backends, config) never imports Celery; Celery-side names load lazily.

Each check runs in a fresh interpreter, because this test process has Celery loaded
already (pytest's plugins, other tests).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from .test_layers import CELERY_SIDE as CELERY_SIDE_MODULES
from .test_layers import MODULES, on_celery_side

CELERY_SIDE = ("celery", "kombu", "click", "billiard", "amqp", "vine")

#: The modules that need Celery to load: docs/design.md's Celery side (test_layers), a
#: package there (beat) with all its modules. Every other module is checked, so a new core
#: module is covered the day it is added, not when someone remembers a list.
NEEDS_CELERY = CELERY_SIDE_MODULES
CORE_MODULES = sorted(
    f"celery_election.{m}" if m else "celery_election" for m in MODULES if not on_celery_side(m)
)


def test_the_core_list_is_the_package_less_the_celery_side() -> None:
    # a renamed Celery-side module would otherwise silently leave this check
    assert NEEDS_CELERY <= MODULES
    assert {"celery_election.metrics", "celery_election.testing"} <= set(CORE_MODULES)
    assert not [m for m in CORE_MODULES if m.startswith("celery_election.beat")]


# Installed first thing in the child: records every attempt to import a Celery-side
# package (with the importing stack) and, when BLOCK is true, makes the attempt fail.
PRELUDE = """
import importlib.abc
import json
import sys
import traceback

WATCHED = {watched!r}
BLOCK = {block!r}
attempts = []


class CeleryBlocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".", 1)[0] in WATCHED:
            stack = "".join(traceback.format_stack(limit=12)[:-1])
            attempts.append({{"module": name, "stack": stack}})
            if BLOCK:
                raise ImportError(f"{{name}} is blocked: the core must not import it")
        return None


sys.meta_path.insert(0, CeleryBlocker())
preloaded = sorted(m for m in sys.modules if m.split(".", 1)[0] in WATCHED)


def report(**extra):
    loaded = sorted(m for m in sys.modules if m.split(".", 1)[0] in WATCHED)
    print(json.dumps({{"attempts": attempts, "preloaded": preloaded, "loaded": loaded, **extra}}))
"""

ELECTION = """
import importlib

for name in {modules!r}:
    importlib.import_module(name)

from celery_election import Elector, MemoryBackend

elector = Elector(MemoryBackend(), "core-imports", "child")
elector.start()
try:
    led = elector.wait_for_leadership(5)
    term = elector.term
finally:
    elector.stop()
report(led=led, term=term, state=elector.state.value)
"""


def run_child(body: str, *, block: bool, cwd: Path) -> dict[str, Any]:
    source = textwrap.dedent(PRELUDE).format(watched=CELERY_SIDE, block=block) + body
    proc = subprocess.run(
        [sys.executable, "-c", source],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
        check=False,
    )
    assert proc.returncode == 0, f"child failed ({proc.returncode}):\n{proc.stderr}"
    lines = proc.stdout.strip().splitlines()
    assert lines, f"child printed nothing; stderr:\n{proc.stderr}"
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def describe(attempts: list[dict[str, str]]) -> str:
    return "\n".join(f"import of {a['module']} from:\n{a['stack']}" for a in attempts)


def test_blocker_really_blocks(tmp_path: Path) -> None:
    # Without this, a broken blocker would make the tests below pass vacuously.
    body = """
try:
    import celery
except ImportError:
    blocked = True
else:
    blocked = False
report(blocked=blocked)
"""
    result = run_child(body, block=True, cwd=tmp_path)
    assert result["blocked"] is True
    assert [a["module"] for a in result["attempts"]] == ["celery"]
    assert result["loaded"] == []


@pytest.mark.parametrize("block", [True, False], ids=["celery-blocked", "celery-installed"])
def test_core_runs_an_election_without_celery(block: bool, tmp_path: Path) -> None:
    result = run_child(ELECTION.format(modules=CORE_MODULES), block=block, cwd=tmp_path)
    assert result["preloaded"] == [], "the interpreter started with Celery loaded"
    assert result["attempts"] == [], describe(result["attempts"])
    assert result["loaded"] == []
    assert result["led"] is True
    assert isinstance(result["term"], int)
    assert result["state"] == "stopped"


LAZY = """
import celery_election

before = "celery_election.integration.app" in sys.modules
in_namespace = "init_app" in vars(celery_election)
listed = "init_app" in celery_election.__all__
try:
    celery_election.init_app
except ImportError as exc:
    access = type(exc).__name__
else:
    access = "resolved"
report(
    app_loaded_at_import=before,
    in_namespace=in_namespace,
    listed=listed,
    access=access,
    app_loaded_after=sorted(
        m for m in sys.modules if m.startswith("celery_election.integration.app")
    ),
)
"""


def test_celery_side_names_load_lazily(tmp_path: Path) -> None:
    result = run_child(LAZY, block=True, cwd=tmp_path)
    # Importing the package resolves none of the Celery-side names.
    assert result["app_loaded_at_import"] is False
    assert result["in_namespace"] is False
    assert result["listed"] is True
    # Only touching init_app tries to load its module, which needs Celery: with Celery
    # blocked that access fails, and leaves nothing half-imported behind.
    assert result["access"] in ("ImportError", "ModuleNotFoundError")
    assert result["app_loaded_after"] == []
    assert result["loaded"] == []


def test_unknown_attribute_is_an_attribute_error(tmp_path: Path) -> None:
    body = """
import celery_election

try:
    celery_election.no_such_name
except AttributeError as exc:
    message = str(exc)
report(message=message)
"""
    result = run_child(body, block=True, cwd=tmp_path)
    assert result["message"] == "module 'celery_election' has no attribute 'no_such_name'"
    assert result["attempts"] == []


@pytest.mark.parametrize("module", ["celery_election", "celery_election.pytest_plugin"])
def test_importing_the_package_loads_no_sqlalchemy_http_server_or_celery(module: str) -> None:
    """Every test run of every project that installs us loads the pytest plugin: it pays
    this import. SQLAlchemy (~0.15 s) loads with the first SQL backend, the HTTP server
    with the first metrics port, Celery with the first Celery-side name."""
    code = (
        f"import sys, {module}\n"
        "heavy = ('sqlalchemy', 'http.server', 'celery', 'kombu', 'prometheus_client')\n"
        "print([m for m in heavy if m in sys.modules])"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
