"""A tiny Celery project for the end-to-end tests, configured from the environment.

E2E_BROKER     broker URL (RabbitMQ, or sqla+sqlite:///... where there is none)
E2E_ELECTION   election database URL
E2E_PREFIX     table prefix (one per test, so tests never see each other)
E2E_NAMESPACE  election namespace

Every run of a leader task records (task, label, worker, pid, term) in the election
database, so a test can check who ran what under which term.
"""

from __future__ import annotations

import json
import os
from typing import Any

import sqlalchemy as sa
from celery import Celery

from celery_election import init_app, leader_task

try:
    from celery_election import singleton_task
except ImportError:  # the previous release, which tests/e2e/test_upgrade.py runs this with

    def singleton_task(*args: Any, **options: Any) -> Any:  # its tasks left unregistered
        return lambda fn: fn


from celery_election.backends.sql import db_now_us
from celery_election.integration.tasks import current_term
from celery_election.signals import leader_elected, leader_revoked
from harness.e2e_tables import e2e_tables

BROKER = os.environ.get("E2E_BROKER", "memory://")
if BROKER.startswith("sqla+"):
    from kombu.transport import sqlalchemy as sqla_transport

    sqla_transport.Transport.polling_interval = 0.1  # not an option: a class attribute

app = Celery("e2e", broker=BROKER, backend=os.environ.get("E2E_RESULTS"))
app.conf.update(
    # E2E_BORROW=1: no election_url, the result backend's db+ URL is borrowed (the default)
    election_url=None if os.environ.get("E2E_BORROW") else os.environ.get("E2E_ELECTION"),
    # E2E_LIVENESS=0: the lease alone (and NOTIFY wakeups on PostgreSQL)
    **({"election_liveness": False} if os.environ.get("E2E_LIVENESS") == "0" else {}),
    election_table_prefix=os.environ.get("E2E_PREFIX", "celery_election_"),
    election_namespace=os.environ.get("E2E_NAMESPACE", "e2e"),
    election_ttl=float(os.environ.get("E2E_TTL", "3")),
    election_poll_interval=float(os.environ.get("E2E_POLL", "0.2")),
    # E2E_HISTORY: a file of this process's transitions and sends (harness/checker.py)
    election_history_file=os.environ.get("E2E_HISTORY") or None,
    # E2E_RELEASE: the release this process registers (a rolling upgrade's older one)
    **({"election_release": os.environ["E2E_RELEASE"]} if os.environ.get("E2E_RELEASE") else {}),
    worker_prefetch_multiplier=1,
    task_acks_late=True,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
    # One queue per test: a broker outlives tests, and leftovers must not leak between them.
    task_default_queue=os.environ.get("E2E_QUEUE", "celery"),
)
if os.environ.get("E2E_BROKER_OPTIONS"):  # e.g. Redis: when a dead worker's tasks return
    app.conf.broker_transport_options = json.loads(os.environ["E2E_BROKER_OPTIONS"])
if os.environ.get("E2E_BEAT"):
    app.conf.beat_scheduler = "celery_election.beat:LeaderScheduler"
    app.conf.beat_max_loop_interval = 1
    # E2E_PUBLISHERS=N: the leading beat's sends go out through N publisher processes
    app.conf.election_beat_publishers = int(os.environ.get("E2E_PUBLISHERS") or 0)
    _tick_seconds = float(os.environ.get("E2E_TICK_SECONDS") or 0)  # each run that long
    app.conf.beat_schedule = {
        name: {"task": "tests.e2e.proj.tick", "schedule": 1.0, "args": [name, _tick_seconds]}
        for name in ("every-second-a", "every-second-b")
    }
    if os.environ.get("E2E_EXCLUSIVE_SECONDS"):  # a singleton run each second, each this long
        app.conf.beat_schedule["exclusive-entry"] = {
            "task": "tests.e2e.proj.exclusive", "schedule": 1.0,
            "args": ["beat-key", 0, float(os.environ["E2E_EXCLUSIVE_SECONDS"])],
        }  # fmt: skip
    if os.environ.get("E2E_BURST"):  # N entries, all due at each E2E_BURST_EVERY boundary
        from tests.support.beat import Boundary

        _boundary = Boundary(float(os.environ.get("E2E_BURST_EVERY", "10")))
        _seconds = float(os.environ.get("E2E_BURST_SECONDS") or 0)  # each run that long
        app.conf.beat_schedule = {
            f"burst-{i:05d}": {"task": "tests.e2e.proj.tick", "schedule": _boundary,
                               "args": [f"burst-{i:05d}", _seconds]}
            for i in range(int(os.environ["E2E_BURST"]))
        }  # fmt: skip
init_app(app)

_engine: sa.Engine | None = None
_runs, _transitions, _ticks = e2e_tables(os.environ.get("E2E_PREFIX", "celery_election_"))


def ticks_table() -> sa.Table:
    return _ticks


def tables() -> sa.MetaData:
    return _runs.metadata


def runs_table() -> sa.Table:
    return _runs


def transitions_table() -> sa.Table:
    return _transitions


def _engine_() -> sa.Engine:
    global _engine
    if _engine is None:
        # E2E_RECORD: where to record, when the election URL needs a driver SQLAlchemy's
        # bare scheme would not pick (postgresql:// is psycopg 3 on SQLAlchemy 2.1)
        url = os.environ.get("E2E_RECORD") or os.environ["E2E_ELECTION"]
        # SQLite: wait out other writers (the default 5 s lost records under load)
        extra = {"connect_args": {"timeout": 30}} if url.startswith("sqlite") else {}
        _engine = sa.create_engine(url, poolclass=sa.pool.NullPool, **extra)
    return _engine


@leader_elected.connect
def _on_elected(sender: str, term: int, namespace: str, **kw: object) -> None:
    with _engine_().begin() as conn:
        conn.execute(
            sa.insert(_transitions).values(worker=sender, kind="elected", term=term, at=db_now_us())
        )


@leader_revoked.connect
def _on_revoked(sender: str, term: int, namespace: str, reason: str, **kw: object) -> None:
    with _engine_().begin() as conn:
        conn.execute(
            sa.insert(_transitions).values(
                worker=sender, kind="revoked", term=term, reason=reason, at=db_now_us()
            )
        )


def _record(task: str, label: str, term: int | None) -> None:
    from celery import current_task

    with _engine_().begin() as conn:
        conn.execute(
            sa.insert(_runs).values(
                task=task,
                label=label,
                worker=current_task.request.hostname,
                pid=os.getpid(),
                term=term,
            )
        )


@leader_task(bind=True, on_follower="skip")
def skip(self, label: str) -> int | None:
    _record("skip", label, self.election_term)
    return self.election_term


@leader_task(bind=True, on_follower="requeue", requeue_delay=0.3)
def requeue(self, label: str) -> int | None:
    _record("requeue", label, self.election_term)
    return self.election_term


@leader_task(bind=True, on_follower="raise")
def strict(self, label: str) -> int | None:
    _record("strict", label, self.election_term)
    return self.election_term


@app.task(bind=True)
def tick(self, entry: str, seconds: float = 0.0) -> None:
    """Record this execution (and, given ``seconds``, run that long: when it ended too)."""
    with _engine_().begin() as conn:
        row = conn.execute(
            sa.insert(_ticks).values(
                entry=entry,
                run=getattr(self.request, "election_run", None),
                term=getattr(self.request, "election_term", None),
                worker=self.request.hostname,
                task_id=self.request.id,
                started_at=db_now_us(),
            )
        ).inserted_primary_key
    if seconds:
        import time

        time.sleep(seconds)
        with _engine_().begin() as conn:
            where = _ticks.c.id == row[0]
            conn.execute(sa.update(_ticks).where(where).values(ended_at=db_now_us()))


@leader_task(bind=True, on_follower="requeue", requeue_delay=0.3)
def slow(self, label: str, seconds: float) -> int | None:
    """A leader task that runs ``seconds``: a SIGKILL can land while it runs."""
    _record("slow", label, self.election_term)
    import time

    time.sleep(seconds)
    return self.election_term


@app.task
def plain(label: str) -> int | None:
    _record("plain", label, current_term())
    return current_term()


_HANG = os.environ.get("E2E_HANG_FILE")
if _HANG:
    from celery.signals import before_task_publish

    @before_task_publish.connect(weak=False)
    def _hang_while_file(sender: str | None = None, **kw: object) -> None:
        """A send that hangs while the test's file exists (wedges beat's tick loop)."""
        import time

        while sender == "tests.e2e.proj.tick" and os.path.exists(_HANG):
            time.sleep(0.05)


if os.environ.get("E2E_FIRST_MARK_CHANGES_NOTHING"):
    # The beat's first confirm of sent runs changes nothing and says so, as one that met a
    # lock timeout did (window 3 of issue 52); the leader's recheck of the store comes
    # after 2 s here, not 30 s.
    from celery_election.backends.sql_runs import SQLRunStore
    from celery_election.beat import sender as _sender

    _sender.RECHECK_EVERY, _sender.RECHECK_AGE = 1.0, 2.0
    _real_confirm, _marks = SQLRunStore.confirm, []

    def _confirm(self: Any, *args: Any, **kwargs: Any) -> int:
        _marks.append(1)
        return 0 if len(_marks) == 1 else _real_confirm(self, *args, **kwargs)

    SQLRunStore.confirm = _confirm  # type: ignore[method-assign]


_HANG_RUN_NOW = os.environ.get("E2E_HANG_RUN_NOW_FILE")
if _HANG_RUN_NOW:
    from celery_election.beat.sender import Sender

    _send_now = Sender.send_now

    def _hang_run_now(self: Any, *args: Any, **kwargs: Any) -> None:
        """A "run now" claimed, its send held while the test's file exists (window 9)."""
        import time

        while os.path.exists(_HANG_RUN_NOW):
            time.sleep(0.05)
        _send_now(self, *args, **kwargs)

    Sender.send_now = _hang_run_now  # type: ignore[method-assign]


@singleton_task(bind=True, unique_on=["key"], requeue_delay=0.2)
def exclusive(self, key: str, label: int, seconds: float) -> int | None:
    """One at a time per ``key`` (issue 43): records its start and end on the database clock.

    A ticks row per execution (entry=key, run=label, term=its key's term, worker=node:pid);
    at the end a runs row says whether it still trusted its hold and whether the key's
    term in the database had moved past its own (task ``end:trusted`` / ``end:superseded``).
    """
    return _exclusive(self, key, label, seconds)


@singleton_task(bind=True, unique_on=["key"], requeue_delay=0.2, one_waiting=True)
def exclusive_one(self, key: str, label: int, seconds: float) -> int | None:
    """``exclusive`` with one running plus at most one waiting per key."""
    return _exclusive(self, key, label, seconds)


def _exclusive(self, key: str, label: int, seconds: float) -> int | None:
    import time

    from celery_election.backends.green import call
    from celery_election.keys.singleton import key_holder

    term = self.singleton_term
    worker = f"{self.request.hostname}:{os.getpid()}"

    def started() -> Any:
        with _engine_().begin() as conn:
            return conn.execute(
                sa.insert(_ticks).values(entry=key, run=label, term=term, worker=worker,
                                         task_id=self.request.id, started_at=db_now_us())
            ).inserted_primary_key[0]  # fmt: skip

    # Under gevent on a pool thread, as the key holder's own statements run: plain sqlite3
    # on the hub would wait for their write lock in C, blocking the hub (docs/singleton.md)
    row = call(started)
    time.sleep(seconds)
    trusted = self.singleton_trusted()
    holder = key_holder(self.app)
    now = holder.backend.keys.get(holder.namespace, self.key_for((key, label, seconds), {}))
    moved = now is not None and term is not None and now.term > term
    end = "end:superseded" if moved else "end:trusted" if trusted else "end:untrusted"

    def ended() -> None:
        with _engine_().begin() as conn:
            conn.execute(sa.update(_ticks).where(_ticks.c.id == row).values(ended_at=db_now_us()))
            conn.execute(sa.insert(_runs).values(task=end, label=str(label), worker=key,
                                                 pid=os.getpid(), term=term))  # fmt: skip

    call(ended)
    return term
