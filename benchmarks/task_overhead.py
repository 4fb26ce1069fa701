"""What ``@leader_task`` costs: the in-task leadership check, and task throughput.

    .venv/bin/python benchmarks/task_overhead.py --quick     # smoke run, under a minute
    .venv/bin/python benchmarks/task_overhead.py             # full run, about 3 to 4 minutes

The project's issue asks for "throughput of 10,000 no-op @leader_task tasks against 10,000
plain tasks on the same worker, in one run, and the cost of the in-task check in
nanoseconds. Targets: ratio >= 0.98, check <= 1 us."

(a) Micro: in this process, with a real shared record (``SharedLeadership``) installed
    and saying "leader, trusted for an hour", ``timeit`` measures per call:
    ``time.monotonic()`` and ``boottime()`` (context: the clock reads), the record's
    ``read()``, ``current_term()``, and ``LeaderTask.before_start()`` of a real leader
    task with a request pushed: exactly what the worker calls before each leader task's
    body, and all a leader task adds (a plain task's tracer does not call
    ``before_start``). Reported: median and minimum ns per call over 7 repeats of about
    0.2 s each. The target applies to ``before_start``'s median.

(b) Throughput: ONE real worker process (``celery worker``, by default once with
    ``-P solo`` and once with ``-P prefork -c 2``), ``--election`` on a SQLite election
    file of its own, RabbitMQ as the broker (``--broker``; when it cannot be reached, a
    ``sqla+sqlite`` broker file, which is much slower and is flagged in the output). The
    worker is the only candidate, so it leads; the benchmark waits until a leader task
    actually runs before measuring. The app (written to a temp dir) has a no-op plain task
    and a no-op ``@leader_task`` (on_follower="skip"), both declared with ``queue=`` the
    same queue, which is the only queue the worker consumes (``-Q``): routing is not what
    is measured. Results are ignored (``task_ignore_result``): no result backend.

    How completion is timed, without a result backend and without measuring publishing:
    each batch (chunk) first sends one "gate" task per pool process; a gate blocks its process
    until the benchmark says go, so the N tasks of the batch wait in the broker while they
    are published. When every gate is waiting, the benchmark reads its clock (t0) and
    releases the gates. Each task body (the same for both kinds) counts itself in a slot
    of a shared-memory file (one slot per worker process, so no lock) and stores the time
    it finished. The batch's throughput is N / (last finish - t0). All times are
    CLOCK_MONOTONIC, which is comparable across processes on one host. A leader task that
    a follower skipped would never count itself, so a batch completes only if all N
    leader bodies ran as leader.

    Event-loop stalls: with this stack (Celery 5.7, kombu 5.7, py-amqp, RabbitMQ) a worker
    now and then leaves delivered messages waiting until the next timer of its event loop
    fires. A plain Celery app without election, 5,000 no-op tasks, solo pool, prefetch 4:
    single gaps of 10.01 s (kombu's hub polls for at most 10 s), 20-70 s per batch
    instead of 2 s; 2 s gaps with the worker heartbeat on. It hits either kind at random,
    which makes a 2 % comparison meaningless. So the benchmark's worker wakes its event
    loop with a no-op hub timer every ``--wake-ms`` (1 ms; 0 turns it off to see the raw
    behaviour). It costs both kinds the same.

    Interleaving: after one untimed warm-up batch of each kind, each of ``--repeat``
    repetitions (default 3) runs N plain and N leader tasks as alternating batches
    ("chunks") of ``--chunk`` tasks (default 1000), in the order P L L P P L L P ...:
    load from other processes on the machine, which comes and goes over seconds, then
    falls on both kinds alike (with one batch of 10,000 per kind, repetitions of ONE kind
    differed by up to 77 % on a busy 2-CPU machine). A kind's throughput in a repetition
    is N / (sum of its chunks' times). Reported per pool: tasks/s of each kind per
    repetition, their ratio leader/plain, and the p50 (median) over repetitions, which
    the target applies to; also the p50 of the ratios of adjacent chunk pairs, and how
    much repetitions of one kind differ (a miss smaller than that is shown as "within
    noise").

    CPU: the worker's CPU time (all threads of its processes, from
    /proc/PID/task/TID/schedstat, in ns) is read before each chunk is released and after
    it completed. CPU us per task is much less sensitive to other load than tasks/s, and
    "extra cost per leader task" (leader - plain CPU us per task) is the in-worker price
    of a leader task, to compare with the micro benchmark. Throughput in tasks/s also
    includes RabbitMQ's work, which is the same for both kinds.

(c) In-worker cost, solo pool: after (b), ``--pairs`` (5000) plain and leader messages
    alternating one by one, then as a control ``plain`` alternating with an identical
    plain task. Each body records ``time.process_time()``; the difference between two
    consecutive bodies is the worker's whole CPU cost of the later message. Reported: the
    median per kind and their difference: what a leader task really costs in a worker,
    where the check runs with cold caches between other work (measured: 5 to 13 us, for
    a check that takes 3 us in the hot loop of (a)). The control shows the method's
    noise (within about 2 us). Prefork is left out: a child's CPU misses the main
    process's share of each message.

Output: a table on stdout and a JSON file (default benchmarks/results/task_overhead.json)
with every sample, the settings, the machine (nproc, CPU, Python, Celery and kombu
versions) and the date. Exit status 1 if a target is missed, 2 if the run failed.

Clean-up: the worker runs in its own session and is stopped (SIGTERM to its process
group, then SIGKILL) in a finally block, also on Ctrl-C and SIGTERM; the queues it used
are deleted from the broker, and the temp dir and shared-memory file are removed.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib
import itertools
import json
import mmap
import os
import shutil
import signal
import socket
import statistics
import struct
import sys
import tempfile
import time
import timeit
import types
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import _root  # noqa: F401  (the repository root on sys.path: harness)
from _machine import machine_info  # benchmarks/ is on sys.path

from harness.processes import Proc, stop_all

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

DEFAULT_AMQP = os.environ.get(
    "CELERY_ELECTION_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//"
)
DEFAULT_JSON = REPO / "benchmarks" / "results" / "task_overhead.json"
RATIO_TARGET = 0.98
CHECK_TARGET_NS = 1000.0
#: issue 15: the check with metrics on (it also counts the run in the shared table)
CHECK_METRICS_TARGET_NS = 1500.0
WITH_METRICS = "LeaderTask.before_start() + metrics"
UNTRACED = "before_start(), no OpenTelemetry"  # as without the otel extra (issue 44)
ROUNDS = 15  # interleaved rounds of the micro timings

# The shared-memory file the worker's tasks report to (see BENCH_APP).
HEADER = 64  # [0:8] go generation, [8:16] slots claimed, [16:24] tracing, [24:32] traced
SLOT = 64  # [0:8] tasks run, [8:16] last finish (monotonic), [16:24] gate generation
SLOTS_END = 4096
MAX_SLOTS = (SLOTS_END - HEADER) // SLOT
TRACE_CAP = 40_000  # (c): one (kind, process CPU time) record per task, solo pool only
TRACE = struct.Struct("=Qd")
SHM_SIZE = SLOTS_END + TRACE.size * TRACE_CAP
KINDS = {"plain": 0, "leader": 1, "plain2": 2}
U64 = struct.Struct("=Q")
F64 = struct.Struct("=d")

BENCH_APP = f'''\
"""Generated by benchmarks/task_overhead.py: a no-op plain task, a no-op leader task."""

import fcntl
import mmap
import os
import struct
import time
import warnings

from celery import Celery, bootsteps

from celery_election import init_app, leader_task

QUEUE = os.environ["BENCH_QUEUE"]
BROKER = os.environ["BENCH_BROKER"]
if BROKER.startswith("sqla+"):
    from kombu.transport import sqlalchemy as _sqla

    _sqla.Transport.polling_interval = 0.01  # a class attribute, not a transport option

# Celery 5.7 deprecates the ``queue`` task attribute; the benchmark uses it on purpose.
warnings.filterwarnings("ignore", message=".*'queue' task attribute.*")

app = Celery("benchapp", broker=BROKER)
app.conf.update(
    task_ignore_result=True,
    election_url=os.environ["BENCH_ELECTION_URL"],
    election_namespace=os.environ["BENCH_NAMESPACE"],
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
    worker_prefetch_multiplier=int(os.environ.get("BENCH_PREFETCH", "4")),
    election_metrics_port=int(os.environ["BENCH_METRICS_PORT"])
    if os.environ.get("BENCH_METRICS_PORT") else None,
)
init_app(app)


class WakeLoop(bootsteps.StartStopStep):
    """Wake the worker's event loop every BENCH_WAKE seconds (see the module docstring)."""

    requires = ("celery.worker.components:Hub",)

    def start(self, worker):
        interval = float(os.environ.get("BENCH_WAKE") or 0)
        if interval > 0 and getattr(worker, "hub", None) is not None:
            worker.hub.call_repeatedly(interval, _noop)


def _noop():
    pass


app.steps["worker"].add(WakeLoop)

# Mapped at import, in the worker's main process: pool children inherit the mapping.
_PATH = os.environ["BENCH_SHM"]
_fd = os.open(_PATH, os.O_RDWR)
_map = mmap.mmap(_fd, {SHM_SIZE}, mmap.MAP_SHARED)
os.close(_fd)
_U64 = struct.Struct("=Q")
_REC = struct.Struct("=Qd")
_TRACE = struct.Struct("=Qd")
_pid = -1
_slot = 0
_count = 0


def _claim():
    """This process's slot (one writer per slot: no lock on the task path)."""
    global _pid, _slot, _count
    fd = os.open(_PATH, os.O_RDWR)  # a lock of its own: flock is per open file
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        n = _U64.unpack(_map[8:16])[0]
        _map[8:16] = _U64.pack(n + 1)
    finally:
        os.close(fd)
    _pid, _slot, _count = os.getpid(), {HEADER} + {SLOT} * n, 0
    return _slot


def _tick(kind):
    global _count
    off = _slot if _pid == os.getpid() else _claim()
    _count += 1
    _map[off : off + 16] = _REC.pack(_count, time.monotonic())
    if _map[16]:  # (c): tracing, solo pool only
        i = _U64.unpack(_map[24:32])[0]
        if i < {TRACE_CAP}:
            o = {SLOTS_END} + {TRACE.size} * i
            _map[o : o + {TRACE.size}] = _TRACE.pack(kind, time.process_time())
            _map[24:32] = _U64.pack(i + 1)


@app.task(queue=QUEUE, name="bench.plain")
def plain():
    _tick(0)


@leader_task(app=app, queue=QUEUE, name="bench.leader")
def leader():
    _tick(1)


@app.task(queue=QUEUE, name="bench.plain2")
def plain2():
    """The control of (c): a plain task like ``plain``."""
    _tick(2)


@app.task(queue=QUEUE, name="bench.gate")
def gate(generation):
    """Hold this pool process until the benchmark releases batch ``generation``."""
    off = _slot if _pid == os.getpid() else _claim()
    _map[off + 16 : off + 24] = _U64.pack(generation)
    while _U64.unpack(_map[0:8])[0] < generation:
        time.sleep(0.0002)
'''


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# -- (a) micro ------------------------------------------------------------------------------


def time_calls(
    fns: dict[str, Callable[[], Any]],
    around: dict[str, Callable[[], contextlib.AbstractContextManager[Any]]] | None = None,
    rounds: int = ROUNDS,
    target_s: float = 0.1,
) -> dict[str, dict[str, float]]:
    """ns per call of each function: median and minimum over ``rounds`` interleaved rounds.

    Each round times every function once (about ``target_s`` each), so a machine that
    slows down for a while (this VM's speed varies by up to 2x from minute to minute)
    slows every row alike instead of the ones that happened to run then. ``around[name]``
    is entered around that function's timing (metrics on).
    """
    around = around or {}
    timers = {name: timeit.Timer(fn) for name, fn in fns.items()}
    numbers = {}
    for name, timer in timers.items():
        number, elapsed = timer.autorange()
        numbers[name] = max(1000, int(number * target_s / max(elapsed, 1e-9)))
    runs: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, timer in timers.items():
            with around.get(name, contextlib.nullcontext)():
                runs[name].append(timer.timeit(numbers[name]) / numbers[name] * 1e9)
    return {
        name: {"median_ns": statistics.median(r), "min_ns": min(r), "calls": numbers[name]}
        for name, r in runs.items()
    }


def micro() -> dict[str, dict[str, float]]:
    from celery import Celery

    from celery_election import leader_task, metrics
    from celery_election.core.clock import boottime
    from celery_election.election import shared_state
    from celery_election.election.shared_state import ENV_VAR, SharedLeadership
    from celery_election.integration import tasks as tasks_module
    from celery_election.integration.tasks import current_term

    saved = os.environ.get(ENV_VAR)
    app = Celery("micro", broker="memory://", set_as_current=False)

    def noop() -> None:
        pass

    leader_task(app=app, shared=False, name="micro.noop")(noop)
    task = app.tasks["micro.noop"]
    record = SharedLeadership.create()
    shared_state.use(record)
    table = metrics.SharedCounters.create()

    @contextlib.contextmanager
    def metrics_on() -> Iterator[None]:
        # a worker with election_metrics_port: each run is counted in the shared table
        old = metrics.use_counters(table)
        try:
            yield
        finally:
            metrics.use_counters(old)

    @contextlib.contextmanager
    def untraced() -> Iterator[None]:
        # as with OpenTelemetry not installed (the otel extra, issue 44): no span looked for
        old = tasks_module._TRACED
        tasks_module._TRACED = False
        try:
            yield
        finally:
            tasks_module._TRACED = old

    try:
        record.write(12345, boottime() + 3600)
        assert current_term() == 12345
        task.push_request(id="micro", args=(), kwargs={})
        try:
            task.before_start("micro", (), {})
            assert task.election_term == 12345
            before_start = task.before_start
            return time_calls(
                {
                    "time.monotonic()": time.monotonic,
                    "boottime()": boottime,
                    "SharedLeadership.read()": record.read,
                    "current_term()": current_term,
                    "LeaderTask.before_start()": lambda: before_start("micro", (), {}),
                    WITH_METRICS: lambda: before_start("micro", (), {}),
                    UNTRACED: lambda: before_start("micro", (), {}),
                    "empty call (timeit overhead)": lambda: None,
                },
                around={WITH_METRICS: metrics_on, UNTRACED: untraced},
            )
        finally:
            task.pop_request()
    finally:
        shared_state.use(None)
        record.close()
        table.close()
        if saved is not None:
            os.environ[ENV_VAR] = saved


# -- (b) throughput -------------------------------------------------------------------------


def redact(url: str) -> str:
    parts = urlsplit(url)
    if parts.password:
        netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
        return parts._replace(netloc=netloc).geturl()
    return url


def amqp_reachable(url: str, timeout: float = 3.0) -> str | None:
    """None if the broker answers, else why not."""
    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 5672), 2):
            pass
        from kombu.connection import Connection

        with Connection(url, connect_timeout=timeout) as conn:  # type: ignore[no-untyped-call]
            conn.ensure_connection(max_retries=1, timeout=timeout)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


class Shm:
    """The runner's view of the shared-memory file the tasks write to."""

    def __init__(self, path: str) -> None:
        self.path = path
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, SHM_SIZE)
            self.map = mmap.mmap(fd, SHM_SIZE, mmap.MAP_SHARED)
        finally:
            os.close(fd)

    def slots(self) -> range:
        n = min(U64.unpack(self.map[8:16])[0], MAX_SLOTS)
        return range(HEADER, HEADER + SLOT * n, SLOT)

    def count(self) -> int:
        return sum(U64.unpack(self.map[o : o + 8])[0] for o in self.slots())

    def last_finish(self) -> float:
        return max((F64.unpack(self.map[o + 8 : o + 16])[0] for o in self.slots()), default=0.0)

    def gates_waiting(self, generation: int) -> int:
        return sum(U64.unpack(self.map[o + 16 : o + 24])[0] == generation for o in self.slots())

    def trace(self, on: bool) -> None:
        self.map[24:32] = U64.pack(0)
        self.map[16:24] = U64.pack(1 if on else 0)

    def traced(self) -> list[tuple[int, float]]:
        n = min(U64.unpack(self.map[24:32])[0], TRACE_CAP)
        return [TRACE.unpack_from(self.map, SLOTS_END + TRACE.size * i) for i in range(n)]

    def release(self, generation: int) -> None:
        self.map[0:8] = U64.pack(generation)

    def close(self) -> None:
        with contextlib.suppress(BufferError, ValueError):
            self.map.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


class Worker:
    """One ``celery worker`` subprocess in its own session."""

    def __init__(self, pool: str, concurrency: int, env: dict[str, str], workdir: Path) -> None:
        self.pool = pool
        self.concurrency = concurrency if pool == "prefork" else 1
        self._pids: list[int] = []
        self.logfile = workdir / f"worker-{pool}.log"
        argv = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "benchapp",
            "worker",
            "-P",
            pool,
            "-c",
            str(self.concurrency),
            "-Q",
            env["BENCH_QUEUE"],
            "--election",
            "-n",
            f"bench-{pool}-{os.getpid()}@%h",
            "-l",
            "WARNING",
            "--logfile",
            str(self.logfile),
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
        ]
        # Its own session and --logfile; SIGTERM reaches it if the benchmark dies.
        self.worker = Proc(
            f"worker-{pool}", argv, env=env, cwd=workdir, log=workdir / f"{pool}.out",
            die_with_parent=True,
        ).start()  # fmt: skip
        assert self.worker.popen is not None
        self.proc = self.worker.popen

    def pids(self) -> list[int]:
        """The worker's processes: its process group (main process and pool children)."""
        found = []
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                try:
                    with open(f"/proc/{entry.name}/stat", "rb") as f:
                        stat = f.read()
                except OSError:
                    continue
                if int(stat[stat.rfind(b")") + 2 :].split()[2]) == self.proc.pid:
                    found.append(int(entry.name))
        return found

    def cpu_seconds(self) -> float:
        """CPU time of all threads of the worker's processes (schedstat: nanoseconds)."""
        if not self._pids:
            self._pids = self.pids()
        total = 0
        try:
            for pid in self._pids:
                for tid in os.listdir(f"/proc/{pid}/task"):
                    with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                        total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            self._pids = []  # a process or thread went away: look again next time
            return self.cpu_seconds() if self.proc.poll() is None else 0.0
        return total / 1e9

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            raise RuntimeError(
                f"the {self.pool} worker exited with {self.proc.returncode}:\n{self.log_tail()}"
            )

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.logfile.read_text().splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        # SIGTERM, 30 s, then SIGKILL to the group (prefork children left behind too).
        stop_all([self.worker], grace=30)


class Bench:
    def __init__(self, app_module: types.ModuleType, shm: Shm, tasks: int) -> None:
        self.mod = app_module
        self.shm = shm
        self.tasks = tasks
        self.generation = 0

    def wait(self, what: str, cond: Callable[[], bool], timeout: float, worker: Worker) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            worker.check_alive()
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out after {timeout:g}s waiting for {what}")
            time.sleep(0.002)

    def wait_for_leadership(self, worker: Worker, timeout: float = 90.0) -> float:
        """Send single leader tasks until one runs (followers skip them); seconds taken."""
        start = time.monotonic()
        deadline = start + timeout
        while True:
            before = self.shm.count()
            self.mod.leader.apply_async()
            try:
                self.wait(
                    "a leader task to run",
                    lambda before=before: self.shm.count() > before,  # type: ignore[misc]
                    1.0,
                    worker,
                )
                return time.monotonic() - start
            except RuntimeError:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"the worker did not lead within {timeout:g}s:\n{worker.log_tail()}"
                    ) from None

    def batch(
        self, kind: str, worker: Worker, n: int, pattern: tuple[str, ...] = ()
    ) -> dict[str, float]:
        """Queue n tasks behind the gates, release them, time until the last one ran.

        ``kind`` names the task; ``pattern`` (task names) sends them in turn instead.
        """
        self.generation += 1
        gen = self.generation
        tasks = [getattr(self.mod, k) for k in (pattern or (kind,))]
        t_pub = time.monotonic()
        with self.mod.app.producer_or_acquire() as producer:
            for _ in range(worker.concurrency):
                self.mod.gate.apply_async((gen,), producer=producer)
            for i in range(n):
                tasks[i % len(tasks)].apply_async(producer=producer)
        publish_s = time.monotonic() - t_pub
        self.wait(
            "the gates",
            lambda: self.shm.gates_waiting(gen) >= worker.concurrency,
            30.0,
            worker,
        )
        base = self.shm.count()
        cpu0 = worker.cpu_seconds()
        t0 = time.monotonic()
        self.shm.release(gen)
        try:
            self.wait(
                f"{n} {kind} tasks",
                lambda: self.shm.count() - base >= n,
                max(60.0, n / 50),
                worker,
            )
        except RuntimeError as exc:
            done = self.shm.count() - base
            hint = " (leader tasks skipped: did the worker lose leadership?)" * (kind == "leader")
            raise RuntimeError(f"{exc}: {done}/{n} ran{hint}\n{worker.log_tail()}") from None
        cpu = worker.cpu_seconds() - cpu0
        elapsed = self.shm.last_finish() - t0
        done = self.shm.count() - base
        if done != n:
            raise RuntimeError(f"{done} {kind} tasks ran, expected {n}")
        return {
            "tasks_per_s": n / elapsed,
            "seconds": elapsed,
            "publish_s": publish_s,
            "worker_cpu_s": cpu,
            "cpu_us_per_task": cpu / n * 1e6,
        }


def throughput_pool(
    bench: Bench,
    pool: str,
    concurrency: int,
    env: dict[str, str],
    workdir: Path,
    repeat: int,
    chunk: int,
    pairs: int = 0,
) -> dict[str, Any]:
    """One worker; ``repeat`` repetitions of N plain + N leader tasks in alternating chunks."""
    n = bench.tasks
    chunk = min(chunk, n)
    sizes = [chunk] * (n // chunk) + ([n % chunk] if n % chunk else [])
    log(f"[{pool}] starting the worker")
    worker = Worker(pool, concurrency, env, workdir)
    try:
        lead_s = bench.wait_for_leadership(worker)
        log(f"[{pool}] leading after {lead_s:.1f}s; warm-up")
        warm = max(100, min(n // 5, 2000))
        for kind in ("plain", "leader"):
            bench.batch(kind, worker, warm)
        reps = []
        pair = 0
        for i in range(repeat):
            chunks: list[dict[str, Any]] = []
            for size in sizes:
                order = ("plain", "leader") if pair % 2 == 0 else ("leader", "plain")
                pair += 1
                for kind in order:
                    chunks.append({"kind": kind, "pair": pair, **bench.batch(kind, worker, size)})
            rep: dict[str, Any] = {"chunks": chunks}
            for kind in ("plain", "leader"):
                mine = [c for c in chunks if c["kind"] == kind]
                seconds = sum(c["seconds"] for c in mine)
                cpu = sum(c["worker_cpu_s"] for c in mine)
                rep[kind] = {
                    "tasks_per_s": n / seconds,
                    "seconds": seconds,
                    "cpu_us_per_task": cpu / n * 1e6,
                }
            rep["ratio"] = rep["leader"]["tasks_per_s"] / rep["plain"]["tasks_per_s"]
            rep["cpu_ratio"] = rep["plain"]["cpu_us_per_task"] / rep["leader"]["cpu_us_per_task"]
            reps.append(rep)
            log(
                f"[{pool}] rep {i + 1}/{repeat}: plain {rep['plain']['tasks_per_s']:.0f}/s "
                f"({rep['plain']['cpu_us_per_task']:.1f} us CPU/task), "
                f"leader {rep['leader']['tasks_per_s']:.0f}/s "
                f"({rep['leader']['cpu_us_per_task']:.1f} us CPU/task), "
                f"ratio {rep['ratio']:.4f}"
            )
        interleaved = interleaved_cpu(bench, worker, pairs) if pool == "solo" and pairs else None
    finally:
        bench.shm.release(2**63)  # a gate still waiting would hold up the warm shutdown
        worker.stop()
        bench.shm.release(bench.generation)
    plain = [r["plain"]["tasks_per_s"] for r in reps]
    leader = [r["leader"]["tasks_per_s"] for r in reps]
    ratios = [r["ratio"] for r in reps]
    p50_plain, p50_leader = statistics.median(plain), statistics.median(leader)
    cpu_plain = statistics.median(r["plain"]["cpu_us_per_task"] for r in reps)
    cpu_leader = statistics.median(r["leader"]["cpu_us_per_task"] for r in reps)
    p50_ratio = statistics.median(ratios)
    # Adjacent chunks of the two kinds ran within a second of each other: their ratio
    # is the least affected by load that comes and goes.
    pair_ratios = []
    for r in reps:
        by_pair: dict[int, dict[str, float]] = {}
        for c in r["chunks"]:
            by_pair.setdefault(c["pair"], {})[c["kind"]] = c["tasks_per_s"]
        pair_ratios += [p["leader"] / p["plain"] for p in by_pair.values()]
    # How much repetitions of ONE kind differ: the resolution of the ratio.
    spread = max(max(plain) / min(plain), max(leader) / min(leader)) - 1
    return {
        "pool": pool,
        "concurrency": worker.concurrency,
        "tasks": n,
        "chunk": chunk,
        "warmup_tasks": warm,
        "leadership_after_s": lead_s,
        "repetitions": reps,
        "p50_plain_tasks_per_s": p50_plain,
        "p50_leader_tasks_per_s": p50_leader,
        "p50_ratio": p50_ratio,
        "ratio_of_p50s": p50_leader / p50_plain,
        "p50_chunk_pair_ratio": statistics.median(pair_ratios),
        "implied_cost_us_per_task": (1 / p50_leader - 1 / p50_plain) * 1e6,
        "spread_between_repetitions": spread,
        "p50_cpu_us_per_task_plain": cpu_plain,
        "p50_cpu_us_per_task_leader": cpu_leader,
        "p50_cpu_ratio": statistics.median(r["cpu_ratio"] for r in reps),
        "cpu_extra_us_per_leader_task": cpu_leader - cpu_plain,
        "ratio_target_met": p50_ratio >= RATIO_TARGET,
        # A miss is conclusive only if repetitions agree better than the margin.
        "ratio_conclusive": p50_ratio >= RATIO_TARGET
        or (len(reps) > 1 and spread <= 1 - RATIO_TARGET),
        "interleaved_cpu": interleaved,
    }


def interleaved_cpu(bench: Bench, worker: Worker, pairs: int) -> dict[str, Any]:
    """(c) Per-message worker CPU, plain and leader messages alternating (solo pool).

    Each task body records the process's CPU time (``time.process_time()``); the
    difference between two consecutive bodies is the whole CPU cost of handling the later
    message in the worker (receiving, tracing, acking, the event loop; plus a share of the
    elector thread, which is tiny). With the kinds alternating one by one, load and drift
    fall on both alike. The control alternates ``plain`` with ``plain2``, an identical
    plain task: its difference is the method's noise.
    """
    out: dict[str, Any] = {"pairs": pairs}
    for label, other in (("leader", "leader"), ("control", "plain2")):
        bench.shm.trace(True)
        try:
            bench.batch("mixed", worker, 2 * pairs, pattern=("plain", other))
            records = bench.shm.traced()
        finally:
            bench.shm.trace(False)
        per_kind: dict[int, list[float]] = {0: [], KINDS[other]: []}
        for (_, before), (kind, after) in itertools.pairwise(records):
            per_kind[kind].append((after - before) * 1e6)
        plain_us = statistics.median(per_kind[0])
        other_us = statistics.median(per_kind[KINDS[other]])
        out[label] = {
            "messages": len(records),
            "plain_cpu_us": plain_us,
            f"{other}_cpu_us": other_us,
            "extra_us": other_us - plain_us,
            "cpu_ratio": plain_us / other_us,
        }
        log(
            f"[{worker.pool}] (c) {label}: plain {plain_us:.1f} us, {other} {other_us:.1f} us "
            f"CPU per message (medians)"
        )
    return out


@contextlib.contextmanager
def bench_environment(
    broker: str, workdir: Path, prefetch: int = 4, wake_ms: float = 1.0
) -> Iterator[tuple[Bench, dict[str, str], Shm]]:
    """Write the app, create the shared file, import the app here; clean all up after."""
    run_id = uuid.uuid4().hex[:8]
    base = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
    shm = Shm(os.path.join(base, f"task-overhead-{os.getpid()}-{run_id}"))
    (workdir / "benchapp.py").write_text(BENCH_APP)
    env_vars = {
        "BENCH_BROKER": broker,
        "BENCH_QUEUE": f"bench.{os.getpid()}.{run_id}",
        "BENCH_NAMESPACE": f"bench-{run_id}",
        "BENCH_ELECTION_URL": f"sqlite:///{workdir / 'election.sqlite3'}",
        "BENCH_SHM": shm.path,
        "BENCH_PREFETCH": str(prefetch),
        "BENCH_WAKE": str(wake_ms / 1000),
    }
    saved = {k: os.environ.get(k) for k in env_vars}
    os.environ.update(env_vars)
    sys.path.insert(0, str(workdir))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(workdir), str(REPO)]),
        "PYTHONUNBUFFERED": "1",
    }
    module = None
    try:
        module = importlib.import_module("benchapp")
        yield Bench(module, shm, 0), env, shm
    finally:
        if module is not None and broker.startswith("amqp"):
            leader_queue = f"election-leader.{env_vars['BENCH_NAMESPACE']}"
            with contextlib.suppress(Exception), module.app.connection_for_write() as conn:
                channel = conn.default_channel
                for queue in (env_vars["BENCH_QUEUE"], leader_queue):
                    with contextlib.suppress(Exception):
                        channel.queue_delete(queue)
        sys.modules.pop("benchapp", None)
        with contextlib.suppress(ValueError):
            sys.path.remove(str(workdir))
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        shm.close()


# -- report ---------------------------------------------------------------------------------


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def in_worker_verdict(c: dict[str, Any]) -> str:
    """PASS/MISS for (c), or "within noise" when the control says it cannot tell."""
    extra, noise = c["leader"]["extra_us"], abs(c["control"]["extra_us"])
    limit = CHECK_TARGET_NS / 1000
    if extra + noise <= limit:
        return "PASS"
    if extra - noise > limit:
        return "MISS"
    return f"within noise (control {noise:.1f} us)"


def print_report(result: dict[str, Any]) -> None:
    out = sys.stdout
    out.write(f"\n(a) in-task check, ns per call (median of {ROUNDS} interleaved rounds; min)\n")
    for name, m in result["micro"].items():
        target = ""
        if name == "LeaderTask.before_start()":
            ok = m["median_ns"] <= CHECK_TARGET_NS
            target = f"   target <= {CHECK_TARGET_NS:.0f} ns: {verdict(ok)}"
        if name == WITH_METRICS:
            ok = m["median_ns"] <= CHECK_METRICS_TARGET_NS
            target = f"   target <= {CHECK_METRICS_TARGET_NS:.0f} ns: {verdict(ok)}"
        out.write(f"  {name:36s} {m['median_ns']:8.0f} {m['min_ns']:8.0f}{target}\n")
    for t in result["throughput"]:
        out.write(
            f"\n(b) throughput, pool {t['pool']} (concurrency {t['concurrency']}), "
            f"broker {result['settings']['broker_kind']}: {t['tasks']} + {t['tasks']} tasks "
            f"per repetition,\n    in alternating chunks of {t['chunk']}\n"
        )
        out.write(
            f"  {'rep':4s} {'plain/s':>9s} {'leader/s':>9s} {'ratio':>7s}"
            f"   {'CPU us/task: plain':>18s} {'leader':>7s} {'ratio':>7s}\n"
        )
        for i, r in enumerate(t["repetitions"], 1):
            out.write(
                f"  {i:<4d} {r['plain']['tasks_per_s']:9.0f} "
                f"{r['leader']['tasks_per_s']:9.0f} {r['ratio']:7.4f}   "
                f"{r['plain']['cpu_us_per_task']:18.1f} {r['leader']['cpu_us_per_task']:7.1f} "
                f"{r['cpu_ratio']:7.4f}\n"
            )
        ok = t["ratio_target_met"]
        word = verdict(ok) if ok or t["ratio_conclusive"] else "MISS, within noise"
        out.write(
            f"  {'p50':4s} {t['p50_plain_tasks_per_s']:9.0f} "
            f"{t['p50_leader_tasks_per_s']:9.0f} {t['p50_ratio']:7.4f}   "
            f"{t['p50_cpu_us_per_task_plain']:18.1f} {t['p50_cpu_us_per_task_leader']:7.1f} "
            f"{t['p50_cpu_ratio']:7.4f}\n"
            f"  throughput ratio (p50 over repetitions) >= {RATIO_TARGET}: {word}\n"
            f"  p50 ratio of adjacent chunk pairs: {t['p50_chunk_pair_ratio']:.4f}; "
            f"repetitions of one kind differ by up to {t['spread_between_repetitions']:.1%}\n"
            f"  extra cost per leader task: {t['cpu_extra_us_per_leader_task']:+.1f} us of "
            f"worker CPU; {t['implied_cost_us_per_task']:+.1f} us from the rates\n"
        )
        c = t.get("interleaved_cpu")
        if c:
            lead, ctl = c["leader"], c["control"]
            out.write(
                f"\n(c) worker CPU per message, pool {t['pool']}, {c['pairs']} pairs of "
                f"alternating messages (medians)\n"
                f"  plain {lead['plain_cpu_us']:.1f} us, leader {lead['leader_cpu_us']:.1f} us: "
                f"leader {lead['extra_us']:+.1f} us (CPU-bound ratio "
                f"{lead['cpu_ratio']:.4f})\n  check in the worker <= "
                f"{CHECK_TARGET_NS / 1000:.0f} us: {in_worker_verdict(c)}\n"
                f"  control, plain vs an identical plain task: {ctl['extra_us']:+.1f} us "
                f"(the method's noise)\n"
            )
    out.write("\n")
    out.flush()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=None, help="tasks per batch (10000)")
    parser.add_argument("--quick", action="store_true", help="2000 tasks, solo pool only")
    parser.add_argument("--repeat", type=int, default=3, help="repetitions (3)")
    parser.add_argument(
        "--chunk", type=int, default=1000, help="tasks per alternating chunk (1000)"
    )
    parser.add_argument(
        "--pairs",
        type=int,
        default=None,
        help="(c) plain/leader message pairs, solo pool (5000; quick: 2000; 0: skip)",
    )
    parser.add_argument("--pools", default=None, help="comma-separated: solo,prefork (quick: solo)")
    parser.add_argument("--concurrency", type=int, default=2, help="prefork processes (2)")
    parser.add_argument("--broker", default=DEFAULT_AMQP, help="broker URL (RabbitMQ)")
    parser.add_argument(
        "--prefetch", type=int, default=4, help="worker_prefetch_multiplier (Celery's 4)"
    )
    parser.add_argument(
        "--wake-ms",
        type=float,
        default=1.0,
        help="wake the worker's event loop this often (ms); 0: never (see the docstring)",
    )
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON, help="where to write JSON")
    parser.add_argument(
        "--metrics", action="store_true", help="workers with --election-metrics-port (issue 15)"
    )
    parser.add_argument("--no-throughput", action="store_true", help="only the micro part")
    args = parser.parse_args(argv)
    if args.metrics:  # the benchmark's worker serves /metrics on a free port
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            os.environ["BENCH_METRICS_PORT"] = str(sock.getsockname()[1])
    tasks = args.tasks or (2000 if args.quick else 10_000)
    if args.pairs is None:
        args.pairs = 2000 if args.quick else 5000
    args.pairs = min(args.pairs, TRACE_CAP // 2 - 1)
    pools = (args.pools or ("solo" if args.quick else "solo,prefork")).split(",")
    if any(p not in ("solo", "prefork") for p in pools) or min(tasks, args.repeat, args.chunk) < 1:
        parser.error(
            "--pools takes solo and/or prefork; --tasks, --repeat and --chunk must be >= 1"
        )

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)

    started = time.monotonic()
    log("(a) micro: timing the in-task check")
    result: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine_info(),
        "targets": {"ratio_min": RATIO_TARGET, "check_max_ns": CHECK_TARGET_NS},
        "micro": micro(),
        "throughput": [],
    }
    broker, broker_kind, fallback_reason = args.broker, "amqp", None
    workdir = Path(tempfile.mkdtemp(prefix="task-overhead-"))
    status = 0
    try:
        if not args.no_throughput:
            if broker.startswith("amqp"):
                fallback_reason = amqp_reachable(broker)
                if fallback_reason is not None:
                    log(f"RabbitMQ unreachable ({fallback_reason}): using a sqla+sqlite broker")
                    broker = f"sqla+sqlite:///{workdir / 'broker.sqlite3'}"
            broker_kind = broker.split(":", 1)[0].split("+")[0]
            result["settings"] = {
                "metrics": bool(args.metrics),
                "tasks": tasks,
                "repeat": args.repeat,
                "chunk": args.chunk,
                "interleaved_pairs": args.pairs,
                "pools": pools,
                "prefork_concurrency": args.concurrency,
                "broker": redact(broker),
                "broker_kind": broker_kind + (" (fallback)" if fallback_reason else ""),
                "broker_fallback_reason": fallback_reason,
                "result_backend": None,
                "worker_prefetch_multiplier": args.prefetch,
                "event_loop_wake_ms": args.wake_ms,
                "election": "sqlite file of its own, default timings, one candidate",
            }
            with bench_environment(broker, workdir, args.prefetch, args.wake_ms) as (
                bench,
                env,
                _shm,
            ):
                bench.tasks = tasks
                for pool in pools:
                    result["throughput"].append(
                        throughput_pool(
                            bench,
                            pool,
                            args.concurrency,
                            env,
                            workdir,
                            args.repeat,
                            args.chunk,
                            args.pairs,
                        )
                    )
        else:
            result["settings"] = {"broker_kind": "-", "throughput": "skipped"}
    except KeyboardInterrupt:
        log("interrupted: workers stopped, nothing written")
        return 130
    except Exception as exc:
        log(f"FAILED: {exc}")
        status = 2
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    result["elapsed_s"] = round(time.monotonic() - started, 1)
    result["machine"]["loadavg_at_end"] = os.getloadavg()
    print_report(result)
    check_ok = result["micro"]["LeaderTask.before_start()"]["median_ns"] <= CHECK_TARGET_NS
    check_ok &= result["micro"][WITH_METRICS]["median_ns"] <= CHECK_METRICS_TARGET_NS
    ratios_ok = all(t["ratio_target_met"] for t in result["throughput"])
    result["targets"]["met"] = check_ok and ratios_ok and status == 0
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    log(f"wrote {args.json} ({result['elapsed_s']}s)")
    if status:
        return status
    return 0 if result["targets"]["met"] else 1


if __name__ == "__main__":
    sys.exit(main())
