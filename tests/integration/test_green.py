"""The election under eventlet and gevent (Celery's ``-P eventlet`` / ``-P gevent``).

A follower waiting on the liveness lock must leave the hub to the other green threads:
under eventlet psycopg 3 waited in C and froze the whole worker (issue 33). A leader runs
in a plain process (``liveness_child.py``); the follower runs in a monkey-patched one
(``green_child.py``) beside a green ticker. While the server shows the follower waiting
for the lock, the ticker must keep printing; then the leader is SIGKILLed and the
follower must take over and stop cleanly, all under the hub.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from celery_election import backend_from_url

from ..conftest import server_url, unique_prefix
from ..support.locks import waiting_on_lock
from .test_liveness import NS, Child

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def _waiting_on_lock(url: str, prefix: str) -> bool:
    return waiting_on_lock(url, prefix, NS)


@pytest.mark.parametrize("hub", ["eventlet", "gevent"])
@pytest.mark.parametrize(
    "server", ["postgresql", "postgresql+psycopg2", "mysql", "mysql+mysqldb", "sqlite"]
)
def test_a_follower_waiting_on_the_lock_leaves_the_hub_to_the_others(
    hub: str, server: str, tmp_path: Path
) -> None:
    pytest.importorskip(hub)
    url = f"sqlite:///{tmp_path}/election.db" if server == "sqlite" else server_url(server)
    prefix = unique_prefix()
    backend = backend_from_url(url, table_prefix=prefix)
    backend.install()
    leader = Child(url, prefix, tmp_path / "h.jsonl", ttl=30)
    lines: list[str] = []
    proc: subprocess.Popen[str] | None = None
    try:
        leader.wait_for("elected", 20)
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.integration.green_child", hub, url, prefix, NS],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        out = proc.stdout
        assert out is not None
        threading.Thread(target=lambda: lines.extend(x.rstrip() for x in out), daemon=True).start()

        def ticks() -> int:
            return sum(x.startswith("tick") for x in list(lines))

        def until(check: object, timeout: float, what: str) -> None:
            end = time.monotonic() + timeout
            while not check():  # type: ignore[operator]
                assert time.monotonic() < end, f"{what}:\n" + "\n".join(lines[-40:])
                time.sleep(0.05)

        until(lambda: "started" in lines, 30, "the follower did not start")
        until(lambda: _waiting_on_lock(url, prefix), 30, "the follower never waited on the lock")
        seen = ticks()
        # 20 ticks of 50 ms: the lock wait (up to a minute) must not hold them up
        until(lambda: ticks() >= seen + 20 and _waiting_on_lock(url, prefix), 15,
              "the hub stood still while the follower waited on the lock")  # fmt: skip
        leader.proc.kill()
        until(lambda: "stopped" in lines, 30, "the follower did not take over and stop")
        assert proc.wait(10) == 0
        assert "leads True" in lines
        assert not [x for x in lines if "Traceback" in x or "lost" in x], "\n".join(lines)
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
        leader.close()
        backend.uninstall()
        backend.close()
