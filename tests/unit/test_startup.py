"""A worker or a standalone beat that cannot start ends with one clear line, before it
campaigns. Each test starts a Python (``celery -A ...``)."""

from __future__ import annotations

import contextlib
import socket
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..support.celery_cli import BEAT, one_error_line, run_celery, run_worker


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
