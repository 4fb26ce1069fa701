"""django-celery-beat operator actions against REAL ``celery beat`` processes, side by side.

The same scenario runs twice on a throwaway PostgreSQL database (Django's), driven from
this process through the ORM at fixed wall-clock marks (t = seconds after the start):

=====  ==========================================================  ======================
t      action                                                      stock sends
=====  ==========================================================  ======================
0      ``hourly_reset`` (every 3600 s, due at t=1); one-off         ``hourly_reset`` ~1
       clocked ``invoice`` (due far after the end)
12     ``invoice`` deleted and created again, due at t=15           ``invoice`` ~15
20     ``hourly_reset.last_run_at`` 2 h back + update_changed()     ``hourly_reset`` ~20
30     (leader run only) the leading beat SIGKILLed
40     the forced run of ``hourly_reset`` again                     ``hourly_reset`` ~40
43     ``invoice`` deleted and created again, due at t=44           ``invoice`` ~44
=====  ==========================================================  ======================

* **stock**: one ``celery beat -S`` django-celery-beat ``DatabaseScheduler`` process;
* **leader**: two ``celery beat`` processes with ``LeaderSchedulerMixin`` +
  ``DatabaseScheduler``, each in a working directory of its own, elected on PostgreSQL
  (``CELERY_ELECTION_URL``, a unique ``CELERY_ELECTION_TABLE_PREFIX``).

Both schedulers are subclasses (tests/e2e/djadmin/schedulers.py) that append what they
really send (entry, wall time, pid) to a file. The leader must send what stock sends, each
within 2 s, nothing twice; the SIGKILLed beat's sends stop at the kill and the other's go
on; and no ``PeriodicTask.total_run_count`` ever decreases (sampled every 0.5 s).

The ORM actions here go through a database alias of their own (``djadmin``), so that the
test also runs where another module configured Django first (tests/integration).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("django")
pytest.importorskip("django_celery_beat")

import sqlalchemy as sa

from harness.cluster import ROOT, tail_logs, wait_until
from harness.processes import Proc, stop_all

from ..conftest import server_url, unique_prefix
from ..support.django_settings import configure

pytestmark = [pytest.mark.tier2, pytest.mark.timeout(600)]

ALIAS = "djadmin"
END = 50.0  # the scenario's last mark is 44; a few ticks more for late sends
KILL_AT = 30.0
TOLERANCE = 2.0
#: what stock is expected to send: (entry, earliest t, latest t)
STOCK_TABLE = [
    ("hourly_reset", 0.5, 3.5),
    ("invoice", 14.5, 17.5),
    ("hourly_reset", 19.5, 22.5),
    ("hourly_reset", 39.5, 42.5),
    ("invoice", 43.5, 46.5),
]


# -- Django in this process -----------------------------------------------------------------


def _django_db(url: str, name: str) -> dict[str, Any]:
    u = sa.engine.make_url(url)
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": name,
        "HOST": u.host or "127.0.0.1",
        "PORT": str(u.port or 5432),
        "USER": u.username or "postgres",
        "PASSWORD": u.password or "",
    }


def _setup_django(db: dict[str, Any], tmp: Path) -> None:
    """Django here, with the beats' database under the alias ``djadmin``."""
    configured_here = configure(str(tmp / "default.db"))
    from django.core.management import call_command
    from django.db import connections

    filled = connections.configure_settings({"default": dict(db), ALIAS: dict(db)})
    connections.settings[ALIAS] = filled[ALIAS]
    if configured_here:  # the models' signals write PeriodicTasks on "default"
        call_command("migrate", verbosity=0)
    call_command("migrate", database=ALIAS, verbosity=0)


def _forget_alias() -> None:
    from django.db import connections

    with contextlib.suppress(Exception):
        connections[ALIAS].close()
    with contextlib.suppress(Exception):
        del connections[ALIAS]
    connections.settings.pop(ALIAS, None)


@pytest.fixture
def django_db(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """A throwaway PostgreSQL database for Django, dropped afterwards."""
    url = server_url("postgresql")
    name = f"djadmin_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    db = _django_db(url, name)
    try:
        _setup_django(db, tmp_path)
        yield db
    finally:
        _forget_alias()
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


# -- the operator's actions (through the alias) ---------------------------------------------


def _changed() -> None:
    from django.utils import timezone as djtz
    from django_celery_beat.models import PeriodicTasks

    PeriodicTasks.objects.using(ALIAS).update_or_create(
        ident=1, defaults={"last_update": djtz.now()}
    )


def _clear() -> None:
    from django_celery_beat.models import (
        ClockedSchedule,
        IntervalSchedule,
        PeriodicTask,
        PeriodicTasks,
    )

    PeriodicTask.objects.using(ALIAS).all().delete()
    for model in (IntervalSchedule, ClockedSchedule, PeriodicTasks):
        model.objects.using(ALIAS).all().delete()


def _create_hourly_reset(t0: float) -> None:
    from django_celery_beat.models import IntervalSchedule, PeriodicTask

    every, _ = IntervalSchedule.objects.using(ALIAS).get_or_create(
        every=3600, period=IntervalSchedule.SECONDS
    )
    due = datetime.fromtimestamp(t0 + 1.0, timezone.utc)
    PeriodicTask.objects.using(ALIAS).create(
        name="hourly_reset",
        task="t.hourly_reset",
        interval=every,
        last_run_at=due - timedelta(seconds=3600),
    )


def _create_invoice(t0: float, due_t: float) -> None:
    from django_celery_beat.models import ClockedSchedule, PeriodicTask

    clocked = ClockedSchedule.objects.using(ALIAS).create(
        clocked_time=datetime.fromtimestamp(t0 + due_t, timezone.utc)
    )
    PeriodicTask.objects.using(ALIAS).create(
        name="invoice", task="t.invoice", clocked=clocked, one_off=True
    )


def _recreate_invoice(t0: float, due_t: float) -> None:
    from django_celery_beat.models import PeriodicTask

    for obj in PeriodicTask.objects.using(ALIAS).filter(name="invoice"):
        obj.delete(using=ALIAS)
    _changed()
    _create_invoice(t0, due_t)
    _changed()


def _force_run(name: str) -> None:
    """django-celery-beat's way to force a run: last_run_at 2 h back, and tell the beats."""
    from django.utils import timezone as djtz
    from django_celery_beat.models import PeriodicTask

    PeriodicTask.objects.using(ALIAS).filter(name=name).update(
        last_run_at=djtz.now() - timedelta(hours=2)
    )
    _changed()


def _counts() -> dict[tuple[str, int], int]:
    from django_celery_beat.models import PeriodicTask

    return {(o.name, o.pk): o.total_run_count for o in PeriodicTask.objects.using(ALIAS).all()}


# -- the beats ------------------------------------------------------------------------------


@dataclass
class Run:
    leader: bool
    t0: float = 0.0
    beats: list[tuple[Proc, Path]] = field(default_factory=list)
    killed_pid: int | None = None
    kill_t: float | None = None
    samples: list[tuple[float, dict[tuple[str, int], int]]] = field(default_factory=list)

    def events(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for _, rec in self.beats:
            if rec.exists():
                out += [json.loads(line) for line in rec.read_text().splitlines() if line]
        return sorted(out, key=lambda e: e["at"])

    def sends(self) -> list[tuple[str, float, int]]:
        return [
            (e["entry"], round(e["at"] - self.t0, 2), e["pid"])
            for e in self.events()
            if e["event"] == "send"
        ]

    def leading_pid(self) -> int | None:
        state: dict[int, bool] = {}
        for e in self.events():
            if e["event"] in ("leading", "following"):
                state[e["pid"]] = e["event"] == "leading"
        live = {p.pid for p, _ in self.beats if p.alive}
        leaders = [pid for pid, on in state.items() if on and pid in live]
        return leaders[0] if len(leaders) == 1 else None

    def ticking(self, proc: Proc) -> bool:
        return any(e["pid"] == proc.pid for e in self.events())


def _start_beat(
    run: Run, index: int, tmp: Path, db: dict[str, Any], election: str, prefix: str
) -> Proc:
    cwd = tmp / f"{'leader' if run.leader else 'stock'}-host{index}"
    cwd.mkdir(parents=True)
    rec = cwd / "sent.jsonl"
    cls = "LeaderRecording" if run.leader else "StockRecording"
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "DJANGO_SETTINGS_MODULE": "tests.e2e.djadmin.settings",
        "DJADMIN_DB": json.dumps(db),
        "DJADMIN_RECORD": str(rec),
        "DJADMIN_ELECTION_URL": election,
        "DJADMIN_ELECTION_PREFIX": prefix,
    }
    cmd = [
        sys.executable, "-m", "celery", "-A", "tests.e2e.djadmin.celery:app", "beat",
        "-S", f"tests.e2e.djadmin.schedulers:{cls}", "--max-interval", "1", "-l", "info",
    ]  # fmt: skip
    proc = Proc(f"beat{index}", cmd, env=env, cwd=cwd, log=tmp / f"{cwd.name}.log")
    proc.start()
    run.beats.append((proc, rec))
    return proc


def _scenario(run: Run) -> dict[float, Callable[[], None]]:
    t0 = run.t0

    def setup() -> None:
        _create_hourly_reset(t0)
        _create_invoice(t0, 1000.0)  # not due inside the scenario
        _changed()

    def kill() -> None:
        pid = run.leading_pid()
        assert pid is not None, "no single leading beat to kill"
        proc = next(p for p, _ in run.beats if p.pid == pid)
        run.kill_t = time.time() - t0
        proc.kill()
        run.killed_pid = pid

    actions: dict[float, Callable[[], None]] = {
        0.0: setup,
        12.0: lambda: _recreate_invoice(t0, 15.0),
        20.0: lambda: _force_run("hourly_reset"),
        40.0: lambda: _force_run("hourly_reset"),
        43.0: lambda: _recreate_invoice(t0, 44.0),
    }
    if run.leader:
        actions[KILL_AT] = kill
    return actions


def drive(leader: bool, tmp: Path, db: dict[str, Any]) -> Run:
    _clear()
    _changed()
    run = Run(leader)
    election = server_url("postgresql")
    prefix = unique_prefix()
    try:
        first = _start_beat(run, 1, tmp, db, election, prefix)
        wait_until(lambda: run.ticking(first), 60, "the first beat ticking")
        if leader:
            wait_until(lambda: run.leading_pid() == first.pid, 30, "the first beat leading")
            second = _start_beat(run, 2, tmp, db, election, prefix)
            wait_until(lambda: run.ticking(second), 60, "the second beat ticking")
            assert run.leading_pid() == first.pid
        run.t0 = time.time()
        pending = sorted(_scenario(run).items())
        next_sample = 0.0
        while (t := time.time() - run.t0) < END:
            while pending and pending[0][0] <= t:
                pending.pop(0)[1]()
            if leader and t >= next_sample:
                run.samples.append((round(t, 2), _counts()))
                next_sample += 0.5
            time.sleep(0.05)
        assert not pending
        if leader:
            wait_until(lambda: run.leading_pid() is not None, 10, "a leader at the end")
    except BaseException:
        print(tail_logs(tmp))
        raise
    finally:
        stop_all([p for p, _ in run.beats], grace=10)
        if leader:
            from celery_election.backends import backend_from_url

            b = backend_from_url(election, table_prefix=prefix)
            with contextlib.suppress(Exception):
                b.uninstall()
            b.close()
    return run


def _entries(sends: list[tuple[str, float, int]]) -> list[tuple[str, float]]:
    return [(entry, t) for entry, t, _ in sends]


def test_operator_actions_real_beats_stock_vs_leader(
    django_db: dict[str, Any], tmp_path: Path
) -> None:
    started = time.monotonic()
    stock = drive(False, tmp_path, django_db)
    leader = drive(True, tmp_path, django_db)
    stock_sent, leader_sent = _entries(stock.sends()), _entries(leader.sends())
    print(f"\nstock  sent: {stock_sent}")
    print(f"leader sent: {[(e, t, pid) for e, t, pid in leader.sends()]}")
    print(f"leader: killed pid {leader.killed_pid} at t={leader.kill_t}")
    print(f"runtime {time.monotonic() - started:.1f} s")

    # stock shows the table (else the scenario no longer shows what it is about)
    assert [e for e, _ in stock_sent] == [e for e, _, _ in STOCK_TABLE], stock_sent
    for (entry, t), (_, lo, hi) in zip(stock_sent, STOCK_TABLE, strict=True):
        assert lo <= t <= hi, f"stock sent {entry} at {t}, expected {lo}..{hi}"

    # the leader sends what stock sends, each within the tolerance, nothing twice
    assert [e for e, _ in leader_sent] == [e for e, _ in stock_sent], (stock_sent, leader_sent)
    late = [
        (e, ts, tl)
        for (e, ts), (_, tl) in zip(stock_sent, leader_sent, strict=True)
        if abs(ts - tl) > TOLERANCE
    ]
    assert late == [], f"sent more than {TOLERANCE} s from stock's time: {late}"
    for entry in {e for e, _ in leader_sent}:
        times = sorted(t for e, t in leader_sent if e == entry)
        twice = [(a, b) for a, b in itertools.pairwise(times) if b - a <= TOLERANCE]
        assert twice == [], f"{entry} sent twice: {twice}"

    # the SIGKILLed beat's sends stop at the kill; the other's go on
    assert leader.killed_pid is not None and leader.kill_t is not None
    by_killed = [t for _, t, pid in leader.sends() if pid == leader.killed_pid]
    by_other = [t for _, t, pid in leader.sends() if pid != leader.killed_pid]
    assert by_killed and max(by_killed) < leader.kill_t, (by_killed, leader.kill_t)
    assert by_other and min(by_other) > leader.kill_t, (by_other, leader.kill_t)

    # no row's total_run_count ever went down
    assert len(leader.samples) >= END / 0.5 - 2
    went_back = []
    for (ta, a), (tb, b) in itertools.pairwise(leader.samples):
        for key, count in b.items():
            if key in a and count < a[key]:
                went_back.append((key, ta, a[key], tb, count))
    assert went_back == [], f"total_run_count went backwards: {went_back}"
