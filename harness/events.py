"""What failover.py and peers.py share: elector child processes that report events as JSON
lines on stdout, and the parent that collects those reports in order and times them.

A child reports ``elected`` (with ``cand``, ``term``, ``at``), ``revoked`` (``cand``, ``at``)
and ``stopped`` (``at``); a benchmark may add kinds of its own. The parent's reader thread
adds ``proc`` (the child's name) to each report, and an ``eof`` report when the child's
stdout closes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import queue
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, NamedTuple, TypeVar

from celery_election.core.clock import boottime
from harness.processes import Proc, stop_all

TX_VERBS = {"BEGIN", "COMMIT", "ROLLBACK", "START", "END"}

_EMIT_LOCK = threading.Lock()


def emit(obj: dict[str, Any]) -> None:
    """One JSON line to the parent; lines from several threads must not interleave."""
    line = json.dumps(obj, separators=(",", ":")) + "\n"
    with _EMIT_LOCK:
        sys.stdout.write(line)
        sys.stdout.flush()


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def verb_view(verbs: dict[str, int]) -> dict[str, Any]:
    """Statements counted per verb: transaction control is not a statement."""
    return {"stmts": sum(n for v, n in verbs.items() if v not in TX_VERBS), "verbs": verbs}


# =========================================================================================
# child
# =========================================================================================


def start_child(name: str) -> threading.Event:
    """A child's logging, and the event that tells it to stop (set by SIGTERM or SIGINT)."""
    logging.basicConfig(
        level=logging.WARNING, format=f"[{name}] %(levelname)s %(name)s: %(message)s"
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    return stop


def read_commands(stop: threading.Event, command: Callable[[str, str], None] | None = None) -> None:
    """A thread that passes each stdin line (command, rest) on; at EOF (the parent is
    gone) it sets ``stop``.
    """

    def commands() -> None:
        for line in sys.stdin:
            if command is not None:
                cmd, _, rest = line.strip().partition(" ")
                command(cmd, rest)
        stop.set()

    threading.Thread(target=commands, daemon=True).start()


# =========================================================================================
# parent
# =========================================================================================


class BenchError(Exception):
    pass


def start_parent(
    args: argparse.Namespace, chosen: str, choices: tuple[str, ...], what: str
) -> list[str]:
    """Check the command line, seed the trial timing, and make SIGINT and SIGTERM raise
    KeyboardInterrupt (also when started in the background, where SIGINT is ignored, or
    stopped with kill), so that children and tables are cleaned up. Returns the ``chosen``
    comma list.
    """
    if args.seed is not None:
        random.seed(args.seed)

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    signal.signal(signal.SIGINT, interrupt)
    signal.signal(signal.SIGTERM, interrupt)
    names = [c.strip() for c in chosen.split(",") if c.strip()]
    unknown = [c for c in names if c not in choices]
    if unknown:
        raise SystemExit(f"unknown {what} {unknown}; choose from {', '.join(choices)}")
    if args.n < 2:
        raise SystemExit("--n must be at least 2: a failover needs someone to fail over to")
    return names


def quick_defaults(
    args: argparse.Namespace, names: tuple[str, ...], quick: tuple[Any, ...], full: tuple[Any, ...]
) -> argparse.Namespace:
    """``args``, each option in ``names`` that was not set given its ``--quick`` or full-run
    value.
    """
    for name, default in zip(names, quick if args.quick else full, strict=True):
        if getattr(args, name) is None:
            setattr(args, name, default)
    return args


@contextlib.contextmanager
def outcome(result: dict[str, Any], label: str, any_error: bool = False) -> Iterator[None]:
    """Record in ``result`` how its measurement ended. A BenchError (with ``any_error``:
    any exception) ends the measurement but not the run; Ctrl-C ends both.
    """
    try:
        yield
    except BenchError as exc:
        failure = str(exc)
    except KeyboardInterrupt:
        result["status"] = "interrupted"
        raise
    except Exception as exc:
        if not any_error:
            raise
        failure = f"{type(exc).__name__}: {exc}"
    else:
        return
    result["status"] = "error"
    result["failures"].append(failure)
    log(f"[{label}] FAILED: {failure}")


@dataclass
class Child:
    """One child process."""

    name: str
    popen: subprocess.Popen[str]
    ended_at: float | None = None  # boot time it was killed / stopped / exited

    @property
    def alive(self) -> bool:
        return self.popen.poll() is None


class Span(NamedTuple):
    """One belief "I lead", from its ``elected`` report to its end."""

    cand: str
    term: int
    start: float
    end: float


C = TypeVar("C", bound=Child)


class Collector(Generic[C]):
    """Child processes and the ordered stream of their reports.

    Reports are taken from the queue only in the thread that calls ``drain``, ``wait_for``
    and ``pump``; ``leading`` follows them: candidate -> (process, term).
    """

    def __init__(self, grace: float = 10.0) -> None:
        self.grace = grace  # how long ``close`` waits for the children to stop
        self.procs: dict[str, C] = {}
        self.events: list[dict[str, Any]] = []
        self.q: queue.Queue[dict[str, Any]] = queue.Queue()
        self.leading: dict[str, tuple[str, int]] = {}
        self._children: dict[str, Proc] = {}  # every process launched, by name
        self._seq = 0

    # -- processes ------------------------------------------------------------------------

    def launch(
        self, script: str, name: str, options: list[str], env: dict[str, str] | None = None
    ) -> subprocess.Popen[str]:
        """``script --child name *options`` in its own session, its reports read."""
        cmd = [sys.executable, str(Path(script).resolve()), "--child", name, *options]
        proc = Proc(name, cmd, env=env, pipes=True).start()
        self._children[name] = proc
        popen = proc.popen
        assert popen is not None

        def read() -> None:
            assert popen.stdout is not None
            for line in popen.stdout:
                try:
                    event = json.loads(line)
                except ValueError:
                    sys.stderr.write(f"[{name}] {line}")
                    continue
                event["proc"] = name
                self.q.put(event)
            self.q.put({"event": "eof", "proc": name, "at": boottime()})

        threading.Thread(target=read, daemon=True).start()
        return popen

    def signal(self, proc: C, sig: int) -> float:
        self.drain()
        at = boottime()
        proc.popen.send_signal(sig)
        return at

    def close(self) -> None:
        stop_all(self._children.values(), self.grace)
        self.drain()

    # -- reports --------------------------------------------------------------------------

    def _take(self, event: dict[str, Any]) -> None:
        """Record one report (a subclass may look at kinds of its own, after this)."""
        self.events.append(event)
        kind, proc = event["event"], self.procs.get(event["proc"])
        if kind == "elected":
            self.leading[event["cand"]] = (event["proc"], event["term"])
        elif kind == "revoked":
            self.leading.pop(event["cand"], None)
        elif kind in ("stopped", "eof"):
            for cand, (p, _term) in list(self.leading.items()):
                if p == event["proc"]:
                    self.leading.pop(cand)
            if proc is not None and proc.ended_at is None:
                proc.ended_at = event["at"]

    def drain(self) -> None:
        while True:
            try:
                self._take(self.q.get_nowait())
            except queue.Empty:
                return

    def wait_for(
        self, pred: Callable[[dict[str, Any]], bool], since: int, timeout: float
    ) -> dict[str, Any] | None:
        """The first report from index ``since`` on that satisfies ``pred``, or None."""
        deadline = time.monotonic() + timeout
        i = since
        while True:
            while i < len(self.events):
                if pred(self.events[i]):
                    return self.events[i]
                i += 1
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            with contextlib.suppress(queue.Empty):
                self._take(self.q.get(timeout=min(left, 0.5)))

    def pump(self, seconds: float) -> None:
        self.wait_for(lambda e: False, len(self.events), seconds)

    def single_leader(self, timeout: float) -> tuple[C, str, int]:
        """Wait until exactly one live elector leads; (its process, candidate, term)."""
        deadline = time.monotonic() + timeout
        while True:
            self.drain()
            live = {c: pt for c, pt in self.leading.items() if self.procs[pt[0]].alive}
            if len(live) == 1:
                cand, (pname, term) = next(iter(live.items()))
                return self.procs[pname], cand, term
            if time.monotonic() > deadline:
                raise BenchError(f"expected one leader, have {sorted(live)}")
            self.pump(0.05)

    def next_elected(
        self, old: Child, after: float, since: int, timeout: float
    ) -> dict[str, Any] | None:
        """The first ``elected`` report of another process than ``old`` timed after ``after``."""
        return self.wait_for(
            lambda e: e["event"] == "elected" and e["proc"] != old.name and e["at"] > after,
            since,
            timeout,
        )

    def spans(self) -> list[Span]:
        """Every belief "I lead" so far; one still held ends when its process ended, or now."""
        spans: list[Span] = []
        open_: dict[str, tuple[int, float, str]] = {}
        # A child that reports its trust deadline ("trust" events, in the order written)
        # believes at most until the last one: a stopped process cannot say it stopped.
        until: dict[str, float] = {}
        now = boottime()

        def end(cand: str, at: float) -> float:
            return min(at, until.get(cand, at))

        for e in self.events:
            if e["event"] == "elected":
                open_[e["cand"]] = (e["term"], e["at"], e["proc"])
                until.pop(e["cand"], None)
            elif e["event"] == "trust" and e["cand"] in open_:
                until[e["cand"]] = float(e["until"])
            elif e["event"] == "revoked" and e["cand"] in open_:
                term, start, _p = open_.pop(e["cand"])
                spans.append(Span(e["cand"], term, start, end(e["cand"], e["at"])))
        for cand, (term, start, pname) in open_.items():
            proc = self.procs.get(pname)
            stop = (proc.ended_at if proc else None) or now
            spans.append(Span(cand, term, start, end(cand, stop)))
        return spans

    def overlapping(self) -> list[tuple[Span, Span]]:
        """Pairs of beliefs "I lead" of different candidates that overlapped in time."""
        spans = sorted(self.spans(), key=lambda s: s.start)
        pairs = []
        for i, a in enumerate(spans):
            for b in spans[i + 1 :]:
                if b.start >= a.end:
                    break
                if a.cand != b.cand:
                    pairs.append((a, b))
        return pairs
