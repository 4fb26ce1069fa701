"""``celery-election demo``: three real workers with ``-B --election``, failover and handoff.

Nothing but Python is needed: the broker is kombu's SQLAlchemy transport on a SQLite file,
the election a SQLite file of its own (or ``--url``), and every event (elected, revoked,
each periodic task run with its run key) goes to a third SQLite file that this
process reads to draw the story and to check it: no tick may run twice. With
``--history FILE`` the workers and their beats also append their election history (trust
windows and beat sends, ``celery_election.history``) to FILE, for ``harness/checker.py``.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from ..backends import Backend, backend_from_url
from ..core.lease import Lease

__all__ = ["run"]

# The workers' app: a file of its own (package data), written next to the demo's files.
APP = (Path(__file__).parent / "demo_app.py.tmpl").read_text()


try:  # resolved here: between fork and exec the child must not import anything
    import ctypes

    _PRCTL: Any = ctypes.CDLL(None, use_errno=True).prctl
except Exception:  # not Linux: cleanup relies on the demo's own finally
    _PRCTL = None


def _die_with_parent() -> None:
    """In the child, before exec: get SIGTERM if the demo dies, even by SIGKILL."""
    if _PRCTL is not None:
        _PRCTL(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class Demo:
    def __init__(self, url: str | None, ttl: float, keep: bool, history: str | None) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="celery-election-demo-"))
        self.keep = keep
        self.ttl = ttl
        self.prefix = f"demo{uuid.uuid4().hex[:6]}_"
        self.url = url or f"sqlite:///{self.tmp}/election.db"
        self.events = self.tmp / "events.db"
        (self.tmp / "demoapp.py").write_text(APP)
        with sqlite3.connect(self.events) as db:
            db.execute(
                "CREATE TABLE events (id INTEGER PRIMARY KEY, kind TEXT, worker TEXT, "
                "term INTEGER, due INTEGER, reason TEXT, at REAL)"
            )
        self.backend: Backend = backend_from_url(self.url, table_prefix=self.prefix)
        self.backend.install()
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.seen = 0
        self.env = {
            **os.environ,
            "DEMO_BROKER": f"sqla+sqlite:///{self.tmp}/broker.db",
            "DEMO_ELECTION": self.url,
            "DEMO_PREFIX": self.prefix,
            "DEMO_TTL": str(ttl),
            "DEMO_EVENTS": str(self.events),
            "DEMO_HISTORY": str(Path(history).resolve()) if history else "",
            "PYTHONPATH": f"{self.tmp}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
        }

    # -- processes --------------------------------------------------------------------------

    def start(self, name: str) -> None:
        log = open(self.tmp / f"{name}.log", "wb")  # noqa: SIM115 (lives with the process)
        cmd = [
            sys.executable, "-m", "celery", "-A", "demoapp", "worker", "-B", "--election",
            "-c", "1", "-n", f"{name}@%h", "-s", str(self.tmp / f"{name}-schedule"),
            "--without-gossip", "--without-mingle", "--loglevel", "WARNING",
        ]  # fmt: skip
        self.procs[name] = subprocess.Popen(
            cmd, cwd=self.tmp, env=self.env, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True, preexec_fn=_die_with_parent,
        )  # fmt: skip

    def close(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        end = time.monotonic() + 15
        for p in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(max(0.1, end - time.monotonic()))
        for p in self.procs.values():  # and every child they left (pool, embedded beat)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        if not self.url.startswith("sqlite"):
            self.backend.uninstall()
        self.backend.close()
        if self.keep:
            print(f"kept {self.tmp}")
        else:
            shutil.rmtree(self.tmp, ignore_errors=True)

    # -- what happened ----------------------------------------------------------------------

    def rows(self, kind: str | None = None) -> list[tuple[Any, ...]]:
        with sqlite3.connect(self.events, timeout=10) as db:
            sql = "SELECT kind, worker, term, due, reason, at FROM events"
            args: tuple[Any, ...] = ()
            if kind:
                sql, args = sql + " WHERE kind = ?", (kind,)
            return list(db.execute(sql + " ORDER BY id", args))

    def pump(self) -> None:
        """Print the events that arrived since the last call."""
        rows = self.rows()
        for kind, worker, term, due, reason, _at in rows[self.seen :]:
            who = worker.split("@")[0]
            if kind == "tick":
                # ``due`` holds the run's key: the time of the run it follows
                stamp = time.strftime("%H:%M:%S", time.localtime(due / 1e6)) if due else "start"
                print(f"    tick after {stamp} ran on {who}  (term {term})")
            elif kind == "elected":
                print(f"  * {who} is the leader now (term {term}: greater than every before)")
            else:
                print(f"  - {who} stepped down ({reason})")
        self.seen = len(rows)

    def wait(self, what: str, check: Any, timeout: float) -> Any:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            self.pump()
            value = check()
            if value:
                return value
            time.sleep(0.2)
        raise RuntimeError(f"gave up waiting for {what} after {timeout:.0f}s")

    def leader(self, other_than: str | None = None) -> str | None:
        lease: Lease | None = self.backend.current("demo")
        who = lease.leader_id.split("@")[0] if lease and lease.held and lease.leader_id else None
        return who if who and who != other_than else None

    def ticks(self, more: int) -> None:
        start = len(self.rows("tick"))
        self.wait(f"{more} ticks", lambda: len(self.rows("tick")) >= start + more, 30)

    # -- the story --------------------------------------------------------------------------

    def play(self) -> int:
        print(f"celery-election demo: election in {self.backend.description}")
        print(
            f"  three `celery worker -B --election` workers, a task every second, ttl {self.ttl}s"
        )
        print("\n1. Start three workers; they elect one leader, whose embedded beat sends.")
        self.start("demo1")
        self.wait("the first worker", lambda: self.backend.candidates("demo"), 60)
        self.start("demo2")
        self.start("demo3")
        first = self.wait("a leader", self.leader, 60)
        self.ticks(4)

        print(
            f"\n2. Kill the leader {first} (SIGKILL): its liveness lock is freed at once, and a "
            f"follower takes over about a second later (before its lease could end)."
        )
        killed = time.time()
        self.procs[first].send_signal(signal.SIGKILL)
        self.procs[first].wait()
        second = self.wait("a new leader", lambda: self.leader(other_than=first), self.ttl + 30)
        # the workers record their events with this host's clock, as we read ``killed``
        # (from their dispatcher threads: the lease can show the new leader first)
        won = self.wait(
            "the new leader's record",
            lambda: [r[5] for r in self.rows("elected") if r[1].startswith(f"{second}@")],
            10,
        )
        crash = None
        if won:
            crash = won[-1] - killed
            print(f"  -> {second} took over {crash:.3f}s after the crash")
        self.ticks(4)

        print(
            f"\n3. Stop the leader {second} cleanly (SIGTERM): it resigns, a follower takes over."
        )
        self.procs[second].send_signal(signal.SIGTERM)
        third = self.wait("the handoff", lambda: self.leader(other_than=second), 30)

        def recorded() -> tuple[list[Any], list[Any]] | None:
            # each worker records its own event from its dispatcher thread: the new
            # leader can be seen in the lease before either line is written
            revoked = [r for r in self.rows("revoked") if r[1].startswith(f"{second}@")]
            elected = [r for r in self.rows("elected") if r[1].startswith(f"{third}@")]
            return (revoked, elected) if revoked and elected else None

        records = self.wait("the handoff's records", recorded, 10)
        handoff = None
        if records:
            revoked, elected = records
            handoff = elected[-1][5] - revoked[-1][5]
            print(f"  -> {third} took over {handoff * 1000:.0f} ms after {second} stepped down")
        self.ticks(4)
        self.procs[second].wait(30)
        return self.summary(crash, handoff)

    def summary(self, crash: float | None, handoff: float | None) -> int:
        ticks = [r for r in self.rows("tick")]
        # each run's key (the run before) and the task id it was sent as: a key sent under
        # two ids was sent twice; one id run twice is the broker delivering it again
        # (at-least-once, e.g. a warm shutdown's unacked message), not a second send
        sends: dict[Any, set[Any]] = {}
        for r in ticks:
            if r[3] is not None:
                sends.setdefault(r[3], set()).add(r[4])
        counts = Counter({key: len(ids) for key, ids in sends.items()})
        duplicates = sum(n - 1 for n in counts.values())
        redelivered = sum(r[3] is not None for r in ticks) - sum(counts.values())
        keys = sorted(k for k in counts if k)
        # runs a second apart; a longer step between two keys is a run nobody sent
        missed = sum(max(0, round((b - a) / 1e6) - 1) for a, b in itertools.pairwise(keys))
        expected = len(counts) + missed
        leaders = [r[1].split("@")[0] for r in self.rows("elected")]
        print("\nsummary")
        print(f"  ticks due           {expected}")
        print(f"  ticks run           {len(ticks)}")
        print(f"  duplicates          {duplicates}")
        if redelivered:
            print(f"  redelivered         {redelivered}  (one send run twice by the broker)")
        print(
            f"  missed (failovers)  {missed}  (runs that fell due while nobody led: one catch-up)"
        )
        print(f"  leaders, in order   {' -> '.join(leaders)}")
        if crash is not None:
            print(f"  crash failover      {crash:.3f}s after the crash (lease {self.ttl}s)")
        if handoff is not None:
            print(f"  clean handoff       {handoff * 1000:.0f} ms")
        ok = duplicates == 0 and bool(ticks) and len(set(leaders)) >= 3
        print("OK: every tick was sent at most once" if ok else "FAILED")
        return 0 if ok else 1


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def run(
    url: str | None = None, ttl: float = 3.0, keep: bool = False, history: str | None = None
) -> int:
    """Run the demo; 0 if every invariant held. ``history``: the election history's file."""
    # Ctrl-C must stop the demo even when started with SIGINT ignored (a background job of
    # a non-interactive shell is), and SIGTERM means the same: clean up every worker.
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    demo = Demo(url, ttl, keep, history)
    try:
        return demo.play()
    except KeyboardInterrupt:
        print("\ninterrupted: stopping every worker")
        return 130
    except RuntimeError as exc:
        print(f"\nFAILED: {exc}; worker logs are in {demo.tmp}")
        demo.keep = True
        return 1
    finally:
        demo.close()
