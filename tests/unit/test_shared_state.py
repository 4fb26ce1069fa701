"""The shared leadership record: round trips, fork and spawn, no torn reads, and the
sweep of dead workers' files."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from celery_election.core.clock import boottime
from celery_election.election import shared_state
from celery_election.election.shared_state import ENV_VAR, SharedLeadership, TrustRecord
from celery_election.integration.tasks import current_term

from ..support.celery_cli import REPO


def test_fresh_record_reads_not_leader(record: SharedLeadership) -> None:
    reading = record.read()
    assert reading == TrustRecord(False, None, 0.0)
    assert reading.trusted() is False
    assert record.leader_term() is None
    assert os.environ[ENV_VAR] == record.path
    assert shared_state.current() is record


def test_write_read_round_trip(record: SharedLeadership) -> None:
    until = boottime() + 5
    record.write(2**62 + 5, until)
    reading = record.read()
    assert reading == TrustRecord(True, 2**62 + 5, until)
    assert reading.trusted()
    assert reading.trusted(now=until - 0.001)
    assert not reading.trusted(now=until)
    assert record.leader_term() == 2**62 + 5
    assert current_term() == 2**62 + 5


def test_token_round_trip(record: SharedLeadership) -> None:
    token = uuid.uuid4().hex
    until = boottime() + 5
    record.write(8, until, token)
    assert record.read() == TrustRecord(True, 8, until, token)
    record.write(9, until)  # no token
    assert record.read().token is None
    record.write(None, None, token)  # not leader: no token either
    assert record.read().token is None


@pytest.mark.parametrize(("term", "until"), [(None, None), (5, None), (None, 1e9)])
def test_none_means_not_leader(record: SharedLeadership, term: Any, until: Any) -> None:
    record.write(9, boottime() + 5)
    record.write(term, until)
    assert record.read() == TrustRecord(False, None, 0.0)
    assert record.leader_term() is None
    assert current_term() is None


def test_reading_is_shared_across_fork(record: SharedLeadership) -> None:
    """The child sees what the parent writes after the fork: the mapping is MAP_SHARED."""
    until = boottime() + 30
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        code = 1
        try:
            os.close(w)
            os.read(r, 1)  # wait until the parent has written
            ok_read = record.read() == TrustRecord(True, 77, until)
            ok_term = current_term() == 77 and shared_state.current() is record
            code = 0 if ok_read and ok_term else 2
        finally:
            os._exit(code)
    os.close(r)
    try:
        assert record.read() == TrustRecord(False, None, 0.0)
        record.write(77, until)
        os.write(w, b"x")
    finally:
        os.close(w)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


SPAWNED_READER = """
import sys
from celery_election.election import shared_state
from celery_election.integration.tasks import current_term

record = shared_state.current()
print(record is not None and not record.owner, flush=True)
print(current_term(), flush=True)
sys.stdin.readline()
print(current_term(), flush=True)
record.close()  # a reader's close() must not remove the writer's file
"""


def test_spawned_process_attaches_by_path(record: SharedLeadership) -> None:
    record.write(11, boottime() + 30)
    env = {**os.environ, ENV_VAR: record.path, "PYTHONPATH": str(REPO)}
    child = subprocess.Popen(
        [sys.executable, "-c", SPAWNED_READER],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline().strip() == "True"
        assert child.stdout.readline().strip() == "11"
        record.write(None, None)  # live: the child sees the change
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "None"
        assert child.wait(timeout=30) == 0, child.stderr.read() if child.stderr else ""
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert os.path.exists(record.path)


def test_close_unlinks_the_file(clean_env: None) -> None:
    rec = SharedLeadership.create()
    path = rec.path
    assert os.path.exists(path)
    assert os.environ[ENV_VAR] == path
    rec.write(4, boottime() + 10)
    assert rec.leader_term() == 4
    rec.close()
    assert not os.path.exists(path)
    assert ENV_VAR not in os.environ
    assert rec.leader_term() is None  # a task that checks during shutdown: not leading
    assert not rec.read().leader
    rec.close()  # idempotent


def test_attached_reader_close_keeps_the_file(record: SharedLeadership) -> None:
    reader = SharedLeadership(record.path, create=False)
    record.write(3, boottime() + 10)
    assert reader.read().term == 3
    reader.close()
    assert os.path.exists(record.path)
    assert record.read().term == 3


#: The torn-read tests: a writer writes (n, BASE + n) for odd n and (n, 1.0), a trust that
#: has ended, for even n, n = 1, 2, ... until the reader has made MIN_READS reads and seen
#: MIN_TERMS different terms: that many, however fast or slow the machine (RACE_TIMEOUT
#: only stops a run that hangs). Both readers are checked: ``read()`` and the per-task
#: ``leader_term()``, which reads word by word and must never pair an even term with a
#: trust that has not ended.
MIN_READS = 20_000
MIN_TERMS = 1_000
RACE_TIMEOUT = 60.0
BASE = 1e7  # trust deadlines far in the future of the boot-time clock

READERS = {
    "read": lambda record: _whole(record.read()),
    "leader_term": lambda record: _odd(record.leader_term()),
}


def _whole(r: TrustRecord) -> tuple[bool, int | None]:
    term = r.term or 0
    until = BASE + term if term % 2 else 1.0
    return r.leader and r.trusted_until == until, r.term


def _odd(term: int | None) -> tuple[bool, int | None]:
    return term is None or term % 2 == 1, term


def write_step(record: SharedLeadership, n: int) -> None:
    record.write(n, BASE + n if n % 2 else 1.0)


def read_while_written(record: SharedLeadership, reader: str) -> tuple[int, set[int]]:
    """Read until MIN_READS reads have seen MIN_TERMS terms; return (reads, terms).

    Every reading must be whole and no term older than one read before it.
    """
    read = READERS[reader]
    torn: list[int | None] = []
    backwards: list[tuple[int, int]] = []
    terms: set[int] = set()
    reads, latest = 0, 0
    deadline = time.monotonic() + RACE_TIMEOUT
    while (reads < MIN_READS or len(terms) < MIN_TERMS) and time.monotonic() < deadline:
        whole, term = read(record)
        reads += 1
        if not whole:
            torn.append(term)
        elif term is None:
            pass
        elif term < latest:
            backwards.append((latest, term))
        else:
            latest = term
            terms.add(term)
        if len(torn) + len(backwards) >= 10:
            break
    assert torn == []
    assert backwards == []
    assert reads >= MIN_READS and len(terms) >= MIN_TERMS, (
        f"in {RACE_TIMEOUT}s the reader made {reads} reads and saw {len(terms)} terms"
    )
    return reads, terms


@pytest.mark.parametrize("reader", sorted(READERS))
def test_no_torn_reads_between_threads(record: SharedLeadership, reader: str) -> None:
    """A writer thread writes records; a reader must never see a mixed one."""
    write_step(record, 1)
    stop = threading.Event()
    written = [0]

    def writer() -> None:
        n = 1
        while not stop.is_set():
            write_step(record, n)
            written[0] = n
            n += 1

    old_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # switch threads often: mid-write switches happen
    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    try:
        _, terms = read_while_written(record, reader)
    finally:
        stop.set()
        thread.join(5)
        sys.setswitchinterval(old_interval)
    assert not thread.is_alive()
    assert written[0] >= max(terms)


@pytest.mark.parametrize("reader", sorted(READERS))
def test_no_torn_reads_across_processes(record: SharedLeadership, reader: str) -> None:
    """The real layout: a writer process and a reader process on different CPUs."""
    write_step(record, 1)
    stop_r, stop_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: the writer, until the reader is done (or gone)
        try:
            os.close(stop_w)
            os.set_blocking(stop_r, False)
            n, end = 1, time.monotonic() + RACE_TIMEOUT
            while time.monotonic() < end:
                for _ in range(1000):
                    write_step(record, n)
                    n += 1
                with contextlib.suppress(BlockingIOError):
                    os.read(stop_r, 1)
                    break  # a byte, or end of file: the reader is done
        finally:
            os._exit(0)
    os.close(stop_r)
    try:
        read_while_written(record, reader)
    finally:
        os.close(stop_w)  # the writer stops
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_records_of_dead_workers_are_swept(tmp_path: Path) -> None:
    """A SIGKILLed worker cannot remove its record: the next worker on the host does."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    dead = tmp_path / f"celery-election-{gone.pid}-0123456789ab"
    alive = tmp_path / f"celery-election-{os.getpid()}-0123456789ab"
    other = tmp_path / "celery-election-notapid-x"
    for path in (dead, alive, other):
        path.write_bytes(b"\0" * 56)
    assert shared_state.sweep(str(tmp_path)) == 1
    assert not dead.exists() and alive.exists() and other.exists()


def test_metrics_tables_of_dead_workers_are_swept(tmp_path: Path, monkeypatch: Any) -> None:
    """The metrics table too: a new table sweeps those of workers that were SIGKILLed."""
    from celery_election import metrics
    from celery_election.core import shm

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    dead = tmp_path / f"celery-election-metrics-{gone.pid}-0123456789ab"
    alive = tmp_path / f"celery-election-metrics-{os.getpid()}-0123456789ab"
    record = tmp_path / f"celery-election-{os.getpid()}-0123456789ab"
    for path in (dead, alive, record):
        path.write_bytes(b"\0" * 56)
    monkeypatch.setattr(shm, "directory", lambda: str(tmp_path))
    monkeypatch.delenv(metrics.ENV_VAR, raising=False)
    table = metrics.SharedCounters.create()
    try:
        assert not dead.exists() and alive.exists() and record.exists()
        assert os.path.dirname(table.path) == str(tmp_path)
    finally:
        table.close()
    assert shared_state.sweep(str(tmp_path)) == 0  # leaves the metrics tables alone
    assert alive.exists()
