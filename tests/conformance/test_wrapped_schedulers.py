"""The schedulers we wrap are the specification: their own test suites, run against ours.

Celery's ``t/unit/app/test_beat.py`` runs with ``LeaderSchedulerMixin`` over
``Scheduler`` and ``LeaderScheduler`` as ``PersistentScheduler``; django-celery-beat's
``t/unit/test_schedulers.py`` runs with the mixin over ``DatabaseScheduler``
(``swap_celery.py``, ``swap_django.py``). Leadership is won for real on a memory backend.
Every test that passes on stock must pass with the leader schedulers; the sdists of the
installed versions are fetched once (pip) and cached outside the clone, and so is each
stock result.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path

import pytest

from ..services import REQUIRE

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

HERE = Path(__file__).resolve().parent
CACHE = (
    Path(os.environ.get("CELERY_ELECTION_CACHE", Path.home() / ".cache" / "celery-election"))
    / "conformance"
)

#: Tests that pass on stock and not here, each with the reason the docs give (Beat page,
#: "Celery before 5.7"): the leader schedulers tick as Celery 5.7 does on every Celery.
_TICK_57 = (
    "Celery 5.3-5.6 ask an entry the heap says is ready and return its remaining time; "
    "the leader schedulers (and Celery 5.7) return the heap's time and reheap an entry "
    "that is not due at its retry time (celery#7649)"
)
KNOWN_DIFFERENCES: dict[str, str] = {
    "t.unit.app.test_beat.test_Scheduler::test_ticks": _TICK_57,
    "t.unit.app.test_beat.test_Scheduler::test_pending_tick": _TICK_57,
    "t.unit.app.test_beat.test_Scheduler::test_schedule_no_remain": _TICK_57,
    # django-celery-beat's record of that old tick: an entry at the heap's top that is not
    # due held up the others (with Celery 5.7 it fails on stock too)
    "t.unit.test_schedulers.test_DatabaseScheduler::test_heap_always_return_the_first_item": (
        _TICK_57
    ),
}


@dataclass(frozen=True)
class Suite:
    distribution: str
    tests: str  # inside the sdist
    plugin: str  # module in this directory, loaded with -p
    env: dict[str, str] = field(default_factory=dict)
    #: plugins loaded in the stock run and the leader run alike (virtual_clock.py)
    shared: tuple[str, ...] = ()


SUITES = {
    "celery": Suite("celery", "t/unit/app/test_beat.py", "swap_celery"),
    "django-celery-beat": Suite(
        "django-celery-beat",
        "t/unit/test_schedulers.py",
        "swap_django",
        {"DJANGO_SETTINGS_MODULE": "t.proj.settings"},
        ("virtual_clock",),
    ),
}


@contextlib.contextmanager
def locked() -> Iterator[None]:
    """One pytest process at a time fetches and extracts (two runs may share the cache)."""
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def unavailable(why: str) -> None:
    if REQUIRE:
        pytest.fail(f"{why} (CELERY_ELECTION_REQUIRE_SERVICES=1)")
    pytest.skip(why)


def sdist(distribution: str) -> Path:
    """The extracted sdist of the installed version, fetched by pip once."""
    release = version(distribution)
    root = CACHE / f"{distribution}-{release}"
    with locked():
        if (root / ".complete").exists():
            return root
        with tempfile.TemporaryDirectory() as tmp:
            got = subprocess.run(
                [sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                 "--no-binary", ":all:", f"{distribution}=={release}", "-d", tmp],
                capture_output=True, text=True, timeout=300,
            )  # fmt: skip
            archives = list(Path(tmp).glob("*.tar.gz"))
            if got.returncode != 0 or not archives:
                last = (got.stderr.strip().splitlines() or ["no archive"])[-1]
                unavailable(f"cannot fetch the {distribution} {release} sdist: {last}")
            shutil.rmtree(root, ignore_errors=True)
            with tarfile.open(archives[0]) as tar:
                tar.extractall(CACHE / "extract", filter="data")
            (extracted,) = (CACHE / "extract").iterdir()
            extracted.rename(root)
            shutil.rmtree(CACHE / "extract")
        (root / ".complete").touch()
    return root


def run(suite: Suite, root: Path, *, plugin: bool, out: Path) -> dict[str, str]:
    """Run the suite in a pytest subprocess; {test id: passed|failed|error|skipped}."""
    xml = out / f"{suite.distribution}-{'leader' if plugin else 'stock'}.xml"
    argv = [
        sys.executable, "-m", "pytest", suite.tests, "-q", "-p", "no:cacheprovider",
        "-p", "no:celery_election", f"--junitxml={xml}", "-o", "junit_family=xunit1",
    ]  # fmt: skip
    for name in suite.shared:
        argv += ["-p", name]
    if plugin:
        argv += ["-p", suite.plugin]
    env = {**os.environ, **suite.env}
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), str(root), env.get("PYTHONPATH", "")])
    done = subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True, timeout=800)
    if not xml.exists():
        pytest.fail(f"{suite.distribution}: no results\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    outcomes: dict[str, str] = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        test = f"{case.get('classname')}::{case.get('name')}"
        kinds = {child.tag for child in case}
        outcomes[test] = next(
            (k for k in ("failure", "error", "skipped") if k in kinds), "passed"
        ).replace("failure", "failed")
    return outcomes


def stock(suite: Suite, root: Path, out: Path) -> dict[str, str]:
    """Stock outcomes, cached per version and per the command that produced them."""
    shared = [(HERE / f"{name}.py").read_text() for name in suite.shared]
    recipe = hashlib.sha1(json.dumps([suite.tests, suite.env, shared]).encode()).hexdigest()[:10]
    cached = root / f".stock-{recipe}.json"
    if cached.exists():
        result: dict[str, str] = json.loads(cached.read_text())
        return result
    result = run(suite, root, plugin=False, out=out)
    cached.write_text(json.dumps(result))
    return result


@pytest.mark.parametrize("name", list(SUITES))
def test_every_test_that_passes_on_stock_passes_with_the_leader_scheduler(
    name: str, tmp_path: Path
) -> None:
    suite = SUITES[name]
    root = sdist(suite.distribution)
    before = stock(suite, root, tmp_path)
    after = run(suite, root, plugin=True, out=tmp_path)
    passed = sorted(t for t, outcome in before.items() if outcome == "passed")
    assert len(passed) > 50, f"{name}: the stock run passed only {len(passed)} tests"
    lost = {t: after.get(t, "missing") for t in passed if after.get(t) != "passed"}
    unexplained = {t: o for t, o in lost.items() if t not in KNOWN_DIFFERENCES}
    assert unexplained == {}, f"{name}: pass on stock, not with the leader scheduler"
    print(f"\n{name} {version(suite.distribution)}: stock {len(passed)}/{len(before)} passed, "
          f"leader {sum(o == 'passed' for o in after.values())}/{len(after)}")  # fmt: skip
