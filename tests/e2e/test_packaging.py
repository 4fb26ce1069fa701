"""The built wheel, installed with only the `postgres` extra into a fresh venv, works.

A user's first command must not die on a missing dependency (`pip install
celery-election[postgres]` once brought no Celery, and `celery-election --help` failed on
`import click`).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from celery_election import Elector, backend_from_url

from ..conftest import server_url

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
ROOT = Path(__file__).resolve().parents[2]


def run(*argv: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    # a user's fresh venv: no PYTHONPATH of ours (one naming a checkout made pip's
    # install of the wheel leave out its console script)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=500
    )
    assert done.returncode == 0, f"{argv}: {done.stdout}\n{done.stderr}"
    return done


def test_the_wheel_with_only_the_postgres_extra(tmp_path: Path) -> None:
    pg = server_url("postgresql")
    run(sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", tmp_path / "dist", ROOT)
    (wheel,) = (tmp_path / "dist").glob("celery_election-*.whl")
    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", venv)
    run(venv / "bin/python", "-m", "pip", "install", "-q", f"{wheel}[postgres]")
    assert "Usage" in run(venv / "bin/celery-election", "--help").stdout

    prefix = f"t{uuid.uuid4().hex[:10]}_"
    (tmp_path / "proj.py").write_text(
        textwrap.dedent(
            f"""
            from celery import Celery
            from celery_election import init_app

            app = Celery("proj", broker="memory://")
            app.conf.update(election_url={pg!r}, election_table_prefix={prefix!r},
                            election_namespace="packaged")
            init_app(app)
            """
        )
    )
    backend = backend_from_url(pg, table_prefix=prefix, listen=False)
    try:
        backend.install()
        with Elector(backend, "packaged", "the-leader", ttl=30) as elector:
            assert elector.wait_for_leadership(10)
            status = run(venv / "bin/celery", "-A", "proj", "election", "status", cwd=tmp_path)
        assert "the-leader" in status.stdout
        # the schedule page's files are package data: the wheel serves them
        page = textwrap.dedent(
            """
            from wsgiref.util import setup_testing_defaults
            from proj import app
            from celery_election.web import make_app

            web = make_app(app)
            for path in ("/", "/static/page.js", "/static/page.css"):
                environ = {"PATH_INFO": path}
                setup_testing_defaults(environ)
                got = []
                body = b"".join(web(environ, lambda status, headers, exc=None: got.append(status)))
                print(path, got[0], len(body))
            web.close()
            """
        )
        served = run(venv / "bin/python", "-c", page, cwd=tmp_path)
        assert served.stdout.count("200 OK") == 3, served.stdout
    finally:
        backend.uninstall()
        backend.close()
