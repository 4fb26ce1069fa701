"""Crash failover and NOTIFY handoff of real ``celery worker --election`` processes, per driver.

    .venv/bin/python benchmarks/driver_failover.py --quick     # 2 repetitions, ~3 minutes
    .venv/bin/python benchmarks/driver_failover.py             # 5 repetitions, ~6 minutes

The seconds that tests/e2e/test_worker_drivers.py used to assert (that test now asserts
the mechanism: the lock path, the NOTIFY wake-up), measured with the same processes: two
``celery -A tests.e2e.proj worker --election`` (prefork, -c 2) on RabbitMQ, through the
e2e ``Cluster`` helper, for each driver: psycopg 3 (``postgresql+psycopg``), psycopg2
(``postgresql+psycopg2``), PyMySQL (``mysql+pymysql``) and mysqlclient
(``mysql+mysqldb``). The workers' election and Celery's ``db+`` result backend use the
driver's URL.

crash failover (liveness on, its default delta 1 s; ttl 10 s)
    Once the leader's term is bound by the liveness lock and the follower reports
    (``celery inspect election``) that it waits on the lock, the parent reads the lease
    and SIGKILLs the leader. Reported: the new term's start minus the database's clock at
    that read (both database clock, so an upper bound by the read's latency), and how
    much of the dead leader's lease was left then (what the lease alone would have
    waited). The killed worker is replaced before the next repetition.
NOTIFY handoff (PostgreSQL drivers; liveness off, poll 30 s, ttl 10 s)
    Once the follower's LISTEN connection has listened (``Cluster.listening``), SIGTERM
    to the leader. Reported: from the old leader's resign statement to the new term's
    start, both database clock (the resign's time is kept by a trigger on the run's lease
    table, since the follower's election overwrites the vacated row within
    milliseconds); and, for context, SIGTERM to the parent seeing the new leader (host
    clock; it includes Celery's warm shutdown up to the resign, and the parent's 10 ms
    polling). The stopped worker is replaced before the next repetition. A follower not
    woken would look again when the lease it last read ends (up to ttl).

Output: a table (median, min, max per driver and metric) on stdout, and a JSON file
(default benchmarks/results/driver_failover.json) with every sample, the settings, the
machine and the date. It needs the loopback PostgreSQL, MariaDB and RabbitMQ (the URLs
the tests use: CELERY_ELECTION_TEST_PG_URL / _MYSQL_URL / _AMQP_URL). Each driver gets its
own table prefix and namespace, dropped at the end; workers are stopped on exit.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import socket
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import _root  # noqa: F401  (the repository root on sys.path: harness, tests)
import sqlalchemy as sa
from _machine import machine_info
from beat import AMQP_DEFAULT, MYSQL_DEFAULT, PG_DEFAULT

from harness.cluster import Cluster, wait_until

HERE = Path(__file__).resolve().parent
DEFAULT_JSON = HERE / "results" / "driver_failover.json"
#: label -> (server, SQLAlchemy driver name)
DRIVERS = {
    "psycopg 3": ("postgresql", "postgresql+psycopg"),
    "psycopg2": ("postgresql", "postgresql+psycopg2"),
    "PyMySQL": ("mysql", "mysql+pymysql"),
    "mysqlclient": ("mysql", "mysql+mysqldb"),
}
TTL = 10.0
POLL = 30.0


def urls() -> dict[str, str]:
    return {
        "postgresql": os.environ.get("CELERY_ELECTION_TEST_PG_URL", PG_DEFAULT),
        "mysql": os.environ.get("CELERY_ELECTION_TEST_MYSQL_URL", MYSQL_DEFAULT),
        "amqp": os.environ.get("CELERY_ELECTION_TEST_AMQP_URL", AMQP_DEFAULT),
    }


class Run:
    """One driver's cluster: two workers, replaced as they are killed or stopped."""

    def __init__(self, tmp: Path, driver: str, *, notify: bool) -> None:
        server, name = DRIVERS[driver]
        u = urls()
        url = sa.make_url(u[server]).set(drivername=name).render_as_string(hide_password=False)
        folder = tmp / f"{name.replace('+', '-')}-{'notify' if notify else 'crash'}"
        folder.mkdir()
        self.c = Cluster(folder, u["amqp"], url, f"db+{url}", ttl=TTL)
        self.c.env["E2E_RECORD"] = url
        # the crash runs poll as the library does by default for this ttl (1 s); the
        # handoff runs poll so rarely that only a wake-up explains a quick handoff
        self.c.env.update(E2E_POLL="1.0")
        if notify:
            self.c.env.update(E2E_LIVENESS="0", E2E_POLL=str(POLL))
        self.notify = notify
        self.run = uuid.uuid4().hex[:6]
        self.count = 0
        if notify:
            self._trace_resigns()

    def _trace_resigns(self) -> None:
        """Record each resign's database time: a trigger on this run's lease table.

        A resign vacates the row with ``expires_at`` = its statement's time, and the
        follower's election overwrites it a few milliseconds later, too soon to read; the
        trigger keeps it (one INSERT in the resign's transaction, before its NOTIFY).
        """
        self.log = f"{self.c.prefix}bench_resigns"
        fn = f"{self.c.prefix}bench_resign_fn"
        lease = self.c.backend.lease.name
        with self.c.engine.begin() as conn:
            conn.execute(sa.text(f'CREATE TABLE "{self.log}" (term BIGINT, at_us BIGINT)'))
            conn.execute(
                sa.text(
                    f'CREATE FUNCTION "{fn}"() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN '
                    "IF NEW.token IS NULL AND OLD.token IS NOT NULL THEN "
                    f'INSERT INTO "{self.log}" VALUES (NEW.term, NEW.expires_at); '
                    "END IF; RETURN NULL; END $$"
                )
            )
            conn.execute(
                sa.text(
                    f'CREATE TRIGGER "{fn}" AFTER UPDATE ON "{lease}" '
                    f'FOR EACH ROW EXECUTE FUNCTION "{fn}"()'
                )
            )
        self.fn = fn

    def close(self) -> None:
        if self.notify:
            with self.c.engine.begin() as conn:
                conn.execute(
                    sa.text(f'DROP TRIGGER IF EXISTS "{self.fn}" ON "{self.c.backend.lease.name}"')
                )
                conn.execute(sa.text(f'DROP TABLE IF EXISTS "{self.log}"'))
                conn.execute(sa.text(f'DROP FUNCTION IF EXISTS "{self.fn}"()'))
        self.c.close()

    def add_worker(self) -> str:
        self.count += 1
        name = f"b{self.run}{self.count}"
        self.c.start(name)
        return name

    def ready(self) -> tuple[str, str]:
        """Two live workers, registered; returns (leader, follower) once ready to measure."""
        while len(self.c.alive()) < 2:
            self.add_worker()
        alive = self.c.alive()
        wait_until(
            lambda: {i.candidate_id.split("@", 1)[0] for i in self.c.backend.candidates(
                self.c.namespace)} >= set(alive),
            60, "both workers registered",
        )  # fmt: skip
        leader = self.c.wait_leader(60)
        follower = next(n for n in alive if n != leader)
        if self.notify:
            wait_until(lambda: self.c.listening(follower), 30, f"{follower}'s LISTEN")
        else:
            wait_until(
                lambda: (self.c.lease() or _NoLease).liveness_us is not None,
                30,
                "a lease bound by the lock",
            )
            wait_until(lambda: self._liveness(follower) == "waiting", 30, "a hot standby")
        return leader, follower

    def _liveness(self, name: str) -> str | None:
        node = f"{name}@{socket.gethostname()}"
        replies = self.c.app.control.broadcast(
            "election", reply=True, timeout=2, destination=[node], limit=1
        )
        for reply in replies:
            if node in reply:
                return str(reply[node].get("liveness"))
        return None

    def crash(self) -> dict[str, Any]:
        leader, follower = self.ready()
        before = self.c.lease()
        assert before is not None
        t0 = time.monotonic()
        self.c.signal(leader, signal.SIGKILL)
        new_leader = wait_until(
            lambda: self.c.leader() if self.c.leader() not in (None, leader) else None,
            TTL + 10, "a new leader", every=0.01,
        )  # fmt: skip
        seen = time.monotonic() - t0
        self.c.wait_exit(leader)
        new = self.c.lease()
        assert new is not None and new.acquired_at_us is not None and new.term > before.term
        return {
            "failover_s": (new.acquired_at_us - before.db_now_us) / 1e6,
            "lease_left_s": (before.expires_at_us - before.db_now_us) / 1e6,
            "seen_s": seen,
            "via_lock": new.liveness_us is not None and new.acquired_at_us < before.expires_at_us,
            "new_leader_was_follower": new_leader == follower,
        }

    def handoff(self) -> dict[str, Any]:
        leader, follower = self.ready()
        before = self.c.lease()
        assert before is not None
        t0 = time.monotonic()
        self.c.signal(leader, signal.SIGTERM)
        new_leader = wait_until(
            lambda: self.c.leader() if self.c.leader() not in (None, leader) else None,
            TTL + POLL, "a new leader", every=0.01,
        )  # fmt: skip
        seen = time.monotonic() - t0
        new = self.c.lease()
        assert new is not None and new.acquired_at_us is not None and new.term > before.term
        resigned = wait_until(lambda: self._resigned(before.term), 10, "the resign's record")
        code = self.c.wait_exit(leader)
        return {
            "handoff_s": (new.acquired_at_us - resigned) / 1e6,
            "sigterm_to_seen_s": seen,
            "exit_code": code,
            "new_leader_was_follower": new_leader == follower,
        }

    def _resigned(self, term: int) -> int | None:
        query = sa.text(f'SELECT at_us FROM "{self.log}" WHERE term = :t')
        with self.c.engine.connect() as conn:
            at = conn.execute(query, {"t": term}).scalar()
        return None if at is None else int(at)


class _NoLease:
    liveness_us = None


def summary(xs: list[float]) -> dict[str, float]:
    return {"n": len(xs), "median": statistics.median(xs), "min": min(xs), "max": max(xs)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--drivers", default=",".join(DRIVERS), help="comma list of: %(default)s")
    p.add_argument("--reps", type=int, default=5, help="repetitions of each kind per driver")
    p.add_argument("--quick", action="store_true", help="2 repetitions")
    p.add_argument("--json", default=str(DEFAULT_JSON))
    args = p.parse_args()
    reps = 2 if args.quick else args.reps
    drivers = [d.strip() for d in args.drivers.split(",") if d.strip()]
    info = machine_info()
    started = datetime.datetime.now(datetime.timezone.utc)
    samples: dict[str, dict[str, list[dict[str, Any]]]] = {}
    with tempfile.TemporaryDirectory(prefix="driver-failover-") as tmp:
        for driver in drivers:
            samples[driver] = {}
            kinds = ["crash"] + (["handoff"] if DRIVERS[driver][0] == "postgresql" else [])
            for kind in kinds:
                run = Run(Path(tmp), driver, notify=kind == "handoff")
                got: list[dict[str, Any]] = []
                try:
                    for i in range(reps):
                        s = run.crash() if kind == "crash" else run.handoff()
                        got.append(s)
                        print(f"{driver:12} {kind:8} #{i + 1}: {_brief(s)}", flush=True)
                except Exception:
                    print(run.c.logs(), file=sys.stderr)
                    raise
                finally:
                    run.close()
                samples[driver][kind] = got
    rows = []
    for driver, kinds in samples.items():
        for kind, got in kinds.items():
            key = "failover_s" if kind == "crash" else "handoff_s"
            rows.append((driver, kind, summary([s[key] for s in got])))
    print()
    print("| driver | crash failover (s): median / min / max | NOTIFY handoff (s): same |")
    print("| --- | --- | --- |")
    for driver in samples:
        cells = []
        for kind in ("crash", "handoff"):
            row = next((r[2] for r in rows if r[0] == driver and r[1] == kind), None)
            cells.append(
                "n/a (no NOTIFY)" if row is None
                else f"{row['median']:.3f} / {row['min']:.3f} / {row['max']:.3f} (n={row['n']})"
            )  # fmt: skip
        print(f"| {driver} | {cells[0]} | {cells[1]} |")
    out = {
        "benchmark": "driver_failover",
        "date": started.isoformat(timespec="seconds"),
        "settings": {
            "reps": reps,
            "ttl": TTL,
            "crash": "liveness on (default delta 1 s), poll 1 s (the default)",
            "handoff": f"liveness off, poll {POLL} s",
            "workers": "2 x celery worker --election -P prefork -c 2, RabbitMQ broker",
        },
        "summary": {f"{d} {k}": s for d, k, s in rows},
        "samples": samples,
        "machine": info,
    }
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    print(f"\nwrote {args.json}")
    bad = [
        (d, s)
        for d, k in samples.items()
        for s in k.get("crash", [])
        if not (s["via_lock"] and s["new_leader_was_follower"])
    ]
    return 1 if bad else 0


def _brief(s: dict[str, Any]) -> str:
    return "  ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in s.items())


if __name__ == "__main__":
    sys.exit(main())
