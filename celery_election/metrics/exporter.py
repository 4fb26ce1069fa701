"""The Prometheus exporter: /metrics, /healthz and /readyz on one port.

Only this module uses ``prometheus_client``, and it imports it (and ``http.server``)
lazily, so the package works without the ``metrics`` extra. ``collector()`` reads the
electors of this process (``elector.electors()``) and its store (``counters``);
``MetricsServer`` serves it with the probes of ``health``.

Part of the core: it never imports Celery.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import os
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

from ..core.clock import boottime
from ..core.stats import BUCKETS
from ..election.elector import electors
from ..errors import ConfigurationError
from . import counters
from .counters import _SEP, BEAT, KEY, TASK, TICK
from .health import health, tick_late

if TYPE_CHECKING:
    from ..election.elector import Elector

__all__ = [
    "INSTALL_HINT",
    "PREFIX",
    "MetricsServer",
    "add_overdue_source",
    "bind",
    "collector",
    "render",
    "require_client",
    "serve",
]

log = logging.getLogger("celery_election.metrics")

INSTALL_HINT = "pip install 'celery-election[metrics]'"
PREFIX = "celery_election_"

Probe = Callable[[], tuple[bool, bool, list[str]]]
#: A leader task's outcomes (integration/tasks.py counts them), each exported, 0 until seen.
TASK_OUTCOMES = ("run", "skipped", "requeued", "raised")


#: Each beat entry's overdue seconds by (namespace, entry), computed by the Celery side
#: (``schedule/overdue.py`` reads the shared schedule) and called at each scrape.
OverdueSource = Callable[[], Mapping[tuple[str, str], float]]
_overdue_sources: list[OverdueSource] = []


def add_overdue_source(source: OverdueSource) -> Callable[[], None]:
    """Export ``source`` as ``beat_entry_overdue_seconds`` from now on; returns its removal."""
    _overdue_sources.append(source)

    def remove() -> None:
        with contextlib.suppress(ValueError):
            _overdue_sources.remove(source)

    return remove


def require_client() -> None:
    """ConfigurationError (one line with the install command) without prometheus_client."""
    if importlib.util.find_spec("prometheus_client") is None:
        raise ConfigurationError(f"election_metrics_port needs prometheus_client: {INSTALL_HINT}")


def collector() -> Any:
    """A prometheus_client collector of this process's electors and store."""
    require_client()
    return _ElectionCollector()


class _ElectionCollector:
    def collect(self) -> Iterator[Any]:
        now = boottime()
        yield from _elector_families(electors(), now)
        values = counters.values()
        yield from _store_families(values, now)
        yield from _singleton_families(values)
        if _overdue_sources:
            yield _overdue_family(list(_overdue_sources))


def _elector_families(electors_: list[Elector], now: float) -> Iterator[Any]:
    from prometheus_client.core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
    )

    lab = ["namespace", "candidate"]
    leading = GaugeMetricFamily(PREFIX + "leading", "1 while this elector leads", labels=lab)
    term = GaugeMetricFamily(
        PREFIX + "term", "the term this elector leads, or the last term it saw", labels=lab
    )
    eligible = GaugeMetricFamily(
        PREFIX + "eligible",
        "1 if this elector may take a term, 0 if it never does (election_eligible)",
        labels=lab,
    )
    trust = GaugeMetricFamily(
        PREFIX + "trust_left_seconds", "seconds before the leader stops trusting its lease",
        labels=lab,
    )  # fmt: skip
    trans = CounterMetricFamily(
        PREFIX + "transitions", "changes of leadership", labels=[*lab, "kind", "reason"]
    )
    fails = CounterMetricFamily(
        PREFIX + "call_failures", "failed database calls", labels=[*lab, "operation"]
    )
    calls = HistogramMetricFamily(
        PREFIX + "call_duration_seconds", "database call duration",
        labels=[*lab, "operation"],
    )  # fmt: skip
    for e in electors_:
        ids = [e.namespace, e.candidate_id]
        snap = e.snapshot()
        leading.add_metric(ids, 1.0 if snap.leading else 0.0)
        term.add_metric(ids, float(snap.term))
        eligible.add_metric(ids, 1.0 if e.eligible else 0.0)
        until = snap.trusted_until
        trust.add_metric(ids, max(0.0, until - now) if until is not None else 0.0)
        s = e.stats
        for (kind, reason), n in sorted(s.transitions.items()):
            trans.add_metric([*ids, kind, reason], float(n))
        # every operation called has its failure count, 0 too: a rate over it is 0, not
        # absent, so a dashboard's query and an alert's have data before the first failure
        for op in sorted(set(s.failures) | set(s.calls)):
            fails.add_metric([*ids, op], float(s.failures.get(op, 0)))
        for op, (buckets, total, n) in sorted(s.calls.items()):
            cumulative, acc = [], 0
            for bound, c in zip(BUCKETS, buckets, strict=True):
                acc += c
                cumulative.append((str(bound), float(acc)))
            cumulative.append(("+Inf", float(n)))
            calls.add_metric([*ids, op], cumulative, total)
    yield from (leading, term, eligible, trust, trans, fails, calls)


def _store_families(values: dict[str, int], now: float) -> Iterator[Any]:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    tasks = CounterMetricFamily(
        PREFIX + "leader_tasks",
        "leader task runs by outcome (run, or on a follower: skipped, requeued, raised); "
        "run once (any task): duplicate (a second delivery skipped), deferred",
        labels=["task", "outcome"],
    )
    beat = _beat_families()
    age = GaugeMetricFamily(
        PREFIX + "beat_tick_age_seconds",
        "seconds since the beat's tick loop last ran",
        labels=["namespace"],
    )
    late = GaugeMetricFamily(
        PREFIX + "beat_tick_late_seconds",
        "seconds the beat's tick loop is late for the tick it announced (alert on this)",
        labels=["namespace"],
    )
    counted = _count_store(values, set(beat))
    for ns, last in counted.ticked:
        age.add_metric([ns], max(0.0, now - last / 1e6))
    _add_counts(tasks, beat, counted)
    for ns in sorted(counted.beats):
        seconds = tick_late(values, ns, now)
        if seconds is not None:
            late.add_metric([ns], seconds)
    yield tasks
    yield from beat.values()
    yield age
    yield late


def _singleton_families(values: dict[str, int]) -> Iterator[Any]:
    """Singleton tasks (keys/singleton.py counts them), by task; 0 where nothing happened yet."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    p = PREFIX + "singleton_"
    runs = CounterMetricFamily(
        p + "tasks", "singleton task starts by outcome: run, or, its key held elsewhere, "
        "skipped, requeued, raised", labels=["task", "outcome"],
    )  # fmt: skip
    held = GaugeMetricFamily(p + "keys_held", "keys its runs hold now", labels=["task"])
    waits = CounterMetricFamily(
        p + "waits", "runs that first waited out a dead holder's delta", labels=["task"]
    )
    waited = CounterMetricFamily(
        p + "wait_seconds", "seconds waited for dead holders' keys, summed", labels=["task"]
    )
    hold = CounterMetricFamily(
        p + "hold_seconds", "seconds keys were held, summed (rate / runs: mean)", labels=["task"]
    )
    by_task: dict[str, dict[str, int]] = {}
    for k, v in values.items():
        parts = k.split(_SEP)
        if parts[0] == KEY and len(parts) == 3:
            by_task.setdefault(parts[1], {})[parts[2]] = v
    for task, n in sorted(by_task.items()):
        for outcome in TASK_OUTCOMES:  # a singleton task's outcomes are a leader task's
            runs.add_metric([task, outcome], float(n.get(outcome, 0)))
        held.add_metric([task], float(max(0, n.get("run", 0) - n.get("ended", 0))))
        waits.add_metric([task], float(n.get("waited", 0)))
        waited.add_metric([task], n.get("wait_ms", 0) / 1000)
        hold.add_metric([task], n.get("hold_ms", 0) / 1000)
    yield from (runs, held, waits, waited, hold)


def _overdue_family(sources: list[OverdueSource]) -> Any:
    """The largest value any source gives for an entry (a worker and a beat may both watch)."""
    from prometheus_client.core import GaugeMetricFamily

    family = GaugeMetricFamily(
        PREFIX + "beat_entry_overdue_seconds",
        "seconds a beat entry's run is past due + grace, unsent or unfinished (0: on time)",
        labels=["namespace", "entry"],
    )
    seen: dict[tuple[str, str], float] = {}
    for source in sources:
        try:
            values = source()
        except Exception:  # a scrape must answer; the other families still do
            log.exception("metrics: an overdue source failed")
            continue
        for k, v in values.items():
            seen[k] = max(v, seen.get(k, 0.0))
    for (ns, entry), seconds in sorted(seen.items()):
        family.add_metric([ns, entry], seconds)
    return family


def _beat_families() -> dict[str, Any]:
    """The beat's counters, by the name its store counts them under."""
    from prometheus_client.core import CounterMetricFamily

    beat: dict[str, Any] = {
        what: CounterMetricFamily(PREFIX + f"beat_runs_{what}", doc, labels=["namespace", "entry"])
        for what, doc in (
            ("claimed", "runs this beat claimed in the shared state"),
            ("sent", "runs this beat sent"),
            ("refused", "runs not sent: another leader had claimed them"),
            ("publish_failed", "claimed runs whose send raised"),
            ("missed", "runs dropped by the entry's catch-up policy (or a resume that skips)"),
            ("skipped_overlap", "runs skipped while the entry's previous run was running"),
            ("run_now", "extra runs an operator asked for, sent"),
            ("held", "due answers not sent by the runaway guard (a schedule due again too soon)"),
        )
    }
    # lateness is counted in ms (the stores hold integers) and exported in seconds
    beat["late_ms"] = CounterMetricFamily(
        PREFIX + "beat_late_seconds",
        "seconds between each run's due time and its send, summed (rate / runs_sent: mean)",
        labels=["namespace", "entry"],
    )
    return beat


class _Counted(NamedTuple):
    """The store's values by what they count (``_count_store``)."""

    #: a leader task's count of each outcome, by task
    outcomes: dict[str, dict[str, int]]
    #: a beat entry's count of each beat counter, by (namespace, entry)
    entries: dict[tuple[str, str], dict[str, int]]
    #: the namespaces whose beat announced a tick
    beats: set[str]
    #: (namespace, when its tick loop last ran, epoch microseconds), by namespace
    ticked: list[tuple[str, int]]


def _count_store(values: dict[str, int], counters_: set[str]) -> _Counted:
    """Sort the store's ``values`` by what they count (``counters_``: the beat's names)."""
    counted = _Counted({}, {}, set(), [])
    for k, v in sorted(values.items()):
        parts = k.split(_SEP)
        if parts[0] == TASK and len(parts) == 3:
            counted.outcomes.setdefault(parts[1], {})[parts[2]] = v
        elif parts[0] == BEAT and len(parts) == 4 and parts[3] in counters_:
            counted.entries.setdefault((parts[1], parts[2]), {})[parts[3]] = v
        elif parts[0] == TICK and len(parts) == 3:
            counted.beats.add(parts[1])
            if parts[2] == "last" and v:
                counted.ticked.append((parts[1], v))
    return counted


def _add_counts(tasks: Any, beat: dict[str, Any], counted: _Counted) -> None:
    """Each leader task and beat entry that counted anything, with every counter of its family.

    0 where nothing happened yet: "refused" or "publish_failed" then read 0 rather than
    absent (Prometheus' advice: initialise the label sets you know), at no cost in the
    store (its shared table has room for 512 keys).
    """
    for task, outcomes in counted.outcomes.items():
        for outcome in sorted(set(outcomes) | set(TASK_OUTCOMES)):
            tasks.add_metric([task, outcome], float(outcomes.get(outcome, 0)))
    for (ns, entry), entry_counts in counted.entries.items():
        for what, family in beat.items():
            v = entry_counts.get(what, 0)
            family.add_metric([ns, entry], v / 1000 if what == "late_ms" else float(v))


def render() -> tuple[bytes, str]:
    """(body, content type) of /metrics for this process."""
    require_client()
    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector())
    return generate_latest(registry), CONTENT_TYPE_LATEST


def _handler(probe: Callable[[], Probe]) -> type:
    """The request handler class; ``probe()`` gives the server's current probe."""
    from http.server import BaseHTTPRequestHandler

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            try:
                if path == "/metrics":
                    body, ctype = render()
                    self._send(200, body, ctype)
                elif path in ("/healthz", "/readyz"):
                    healthy, ready, problems = probe()()
                    ok = healthy if path == "/healthz" else ready
                    text = json.dumps({"ok": ok, "healthy": healthy, "ready": ready,
                                       "problems": problems})  # fmt: skip
                    self._send(200 if ok else 503, text.encode(), "application/json")
                else:
                    self._send(404, b"not found: try /metrics, /healthz or /readyz\n")
            except Exception as exc:  # a probe must answer, never hang up
                log.exception("metrics: %s failed", path)
                self._send(500, f"{type(exc).__name__}: {exc}\n".encode())

        def _send(self, status: int, body: bytes, ctype: str = "text/plain") -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # scrapes every few seconds would flood the worker's log

    return Handler


class MetricsServer:
    """/metrics, /healthz and /readyz on one port, served by a daemon thread."""

    def __init__(self, port: int, *, host: str = "", probe: Probe | None = None) -> None:
        from http.server import ThreadingHTTPServer

        require_client()
        self.probe = probe or (lambda: health(electors(), []))
        self.httpd = ThreadingHTTPServer((host, port), _handler(lambda: self.probe))
        self.httpd.daemon_threads = True
        _servers.add(self)
        self.port = self.httpd.server_address[1]
        self._thread = threading.Thread(
            target=self.httpd.serve_forever, name="celery-election-metrics", daemon=True
        )

    def start(self) -> MetricsServer:
        """Serve in the background."""
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving and free the port (also when never started)."""
        if self._thread.is_alive():
            self.httpd.shutdown()  # waits for serve_forever, which must be running
        self.httpd.server_close()


_servers: weakref.WeakSet[MetricsServer] = weakref.WeakSet()


def _close_inherited_servers() -> None:
    """In a forked child (a prefork pool process): close our copy of the listening socket.

    The child never serves; holding the port would keep it taken after the worker that
    bound it died (SIGKILL), until the last child exited.
    """
    for server in list(_servers):
        with contextlib.suppress(OSError):
            server.httpd.socket.close()
    _servers.clear()


os.register_at_fork(after_in_child=_close_inherited_servers)


def bind(port: int, probe: Probe) -> MetricsServer:
    """Take the port now and serve later (``start()``).

    So a worker or beat whose port is taken ends with one line before it campaigns.
    """
    try:
        return MetricsServer(port, probe=probe)
    except OSError as exc:
        raise ConfigurationError(
            f"cannot serve metrics on port {port}: {exc.strerror or exc}, another process has it?"
        ) from exc


def serve(port: int, *, host: str = "") -> MetricsServer:
    """Serve this process's electors' metrics and probes, e.g. next to a bare Elector."""
    return MetricsServer(port, host=host).start()
