"""What the schedule page shows: the elections and the entries, read for every viewer at once.

An :class:`Observer` reads each namespace's lease four times a second on a thread of its
own (keeping the leadership changes it sees) and the entries at most every 0.25 s for all
viewers together, as the JSON the page polls (``celery_election.web``).
"""

from __future__ import annotations

import collections
import hashlib
import json
import logging
import operator
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from ..backends import SQLBackend
from ..backends.schema import entry_key
from ..core.lease import Lease
from ..errors import SchemaMissingError
from ..settings import ElectionSettings, hide_password
from .api import Entry, Schedule
from .marks import LATE_US, MARKS, run_mark
from .overdue import entry_due, overdue_by_entry
from .records import AuditRecord, RunRecord
from .spec import describe

if TYPE_CHECKING:  # the Celery side's types; nothing from Celery is loaded here
    from celery import Celery

__all__ = ["LeaderChange", "Observer"]

log = logging.getLogger("celery_election.web")


#: The timeline's default width in columns (pixels), and the most a page may ask for.
TIMELINE_WIDTH = 1000
TIMELINE_MAX_WIDTH = 4000
#: What each row of ``api/timeline`` holds, in order (see ``Observer.timeline``).
ROW_FIELDS = ("entry", "columns", "marks", "runs", "late_ms")
_DIGITS = "0123456789"


def _ms(us: int | None) -> int | None:
    return None if us is None else us // 1000


@dataclass(frozen=True)
class _Window:
    """The window of ``Observer.timeline``: epoch microseconds, its columns in milliseconds."""

    now_us: int
    oldest_us: int  # the history's retention
    from_us: int  # a column's edge
    to_us: int
    column_ms: int


# -- what the page shows -----------------------------------------------------------------------


@dataclass(frozen=True)
class LeaderChange:
    """A change of a namespace's lease that the observer saw."""

    at_ms: int
    namespace: str
    term: int | None
    leader: str | None
    previous_term: int | None
    previous_leader: str | None

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


class Observer:
    """Reads the election database for the page; one per WSGI app, shared by its requests.

    A daemon thread (started by the first request) looks at every namespace's lease every
    ``interval`` seconds and keeps the changes it sees (``transitions``): the lease table
    holds only the current term, so the history of who led is the one this process saw.
    Entries are read at most every ``interval`` seconds, whatever the number of pages open.
    """

    def __init__(
        self,
        app: Celery,
        *,
        namespace: str | None = None,
        backend: SQLBackend | None = None,
        interval: float = 0.25,
        keep: int = 200,
    ) -> None:
        self.app = app
        self.interval = interval
        self.schedule = Schedule(app, namespace=namespace, actor="web", backend=backend)
        self.backend = self.schedule.backend
        self.namespace = self.schedule.namespace
        settings = ElectionSettings.from_app(app)
        self.database = hide_password(settings.url)
        #: Where the app's singleton tasks hold their keys (the election namespace).
        self.keys_namespace = settings.namespace
        #: How far back the timeline reaches: the run history's retention (days).
        self.retention = float(settings.schedule_retention)
        #: An entry is overdue this long after it fell due, at most (schedule/overdue.py).
        self.overdue_grace = settings.beat_overdue_grace
        self._names: dict[str, str] = {}  # entry_key -> entry name, from the last listing
        self._lock = threading.Lock()
        self._status: dict[str, Any] = {"namespaces": [], "error": None, "now_ms": None}
        self._seen: dict[str, tuple[int | None, str | None]] = {}
        self.changes: collections.deque[LeaderChange] = collections.deque(maxlen=keep)
        self._entries: tuple[float, bytes, str] | None = None
        self._due: dict[tuple[str, str, str | None, str | None, int | None], int | None] = {}
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    # -- the leases --------------------------------------------------------------------------

    def start(self) -> None:
        with self._lock:
            if self._thread is not None:
                return
            self._thread = threading.Thread(target=self._watch, name="election-web", daemon=True)
            self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        self.schedule.close()

    def _watch(self) -> None:
        while not self._stop.is_set():
            try:
                self.look()
            except Exception as exc:  # the page says it, the thread goes on
                log.warning("celery-election web: cannot read the leases (%s)", exc)
                with self._lock:
                    self._status = {**self._status, "error": str(exc)}
            self._stop.wait(self.interval)

    def look(self) -> dict[str, Any]:
        """Read every namespace's lease and candidates once; record what changed."""
        backend = self.backend
        out = []
        now_us = None
        for ns in backend.namespaces():
            lease = backend.current(ns)
            candidates = backend.candidates(ns)
            if lease is not None:
                now_us = lease.db_now_us
            out.append(_namespace(ns, lease, candidates))
        if now_us is None:
            now_us = self.schedule.store.db_now()
        keys = self._keys()
        with self._lock:
            for info in out:
                key = info["namespace"]
                now = (info["term"], info["leader"])
                before = self._seen.get(key)
                if before != now:
                    self._seen[key] = now
                    self.changes.appendleft(
                        LeaderChange(now_us // 1000, key, now[0], now[1],
                                   *(before if before is not None else (None, None)))
                    )  # fmt: skip
            self._status = {"namespaces": out, "error": None, "now_ms": now_us // 1000,
                            "keys": keys, "keys_namespace": self.keys_namespace}  # fmt: skip
            return self._status

    def _keys(self) -> list[dict[str, Any]] | None:
        """The keys singleton tasks hold now (None: tables from before key holds)."""
        try:
            return [_key(h) for h in self.backend.keys.held(self.keys_namespace)]
        except SchemaMissingError:
            return None

    def status(self) -> dict[str, Any]:
        self.start()
        with self._lock:
            status = dict(self._status)
        if status["now_ms"] is None:  # the thread's first look has not finished
            status = dict(self.look())
        with self._lock:
            transitions = [t.as_dict() for t in self.changes]
        audit = self.schedule.store.audit(self.namespace, limit=20)
        return {
            **status,
            "database": self.database,
            "schedule_namespace": self.namespace,
            "transitions": transitions,
            "actions": [_audit_json(a) for a in audit],
        }

    # -- the entries -------------------------------------------------------------------------

    def entries_body(self) -> tuple[bytes, str]:
        """Every entry as JSON, and its ETag; read again at most every ``interval``."""
        with self._lock:
            cached = self._entries
        if cached is not None and time.monotonic() - cached[0] < self.interval:
            return cached[1], cached[2]
        entries = self.entries()
        body = json.dumps({"entries": entries}, default=str).encode()
        tag = '"' + hashlib.sha1(body).hexdigest()[:20] + '"'
        with self._lock:
            self._entries = (time.monotonic(), body, tag)
        return body, tag

    def entries(self) -> list[dict[str, Any]]:
        listed = self.schedule.list()
        self._names = {entry_key(e.name): e.name for e in listed}
        last = self.schedule.store.last_sent_many(
            self.schedule.run_namespaces, [e.name for e in listed]
        )
        now = datetime.now(timezone.utc)
        late = overdue_by_entry(self.schedule, self.overdue_grace, listed)
        return [self.entry_json(e, last.get(e.name), now, late.get(e.name, 0.0)) for e in listed]

    def entry_json(
        self, e: Entry, last: RunRecord | None, now: datetime, overdue: float = 0.0
    ) -> dict[str, Any]:
        args: Any = e.args
        kwargs: Any = e.kwargs
        hidden = False
        if "argsrepr" in e.options:
            args, hidden = e.options["argsrepr"], True
        if "kwargsrepr" in e.options:
            kwargs, hidden = e.options["kwargsrepr"], True
        if hidden and "argsrepr" not in e.options and e.args:
            args = "(hidden)"
        if hidden and "kwargsrepr" not in e.options and e.kwargs:
            kwargs = "(hidden)"
        # due from the beat's run state (what its is_due reads; a beat that loaded an entry
        # counts from then); the last run shown is the last one sent
        sent_at = last.sent_at if last is not None and last.kind in ("run", "run_now") else None
        due_from = e.last_run_us if e.last_run_us is not None else sent_at
        last_us = sent_at
        if last_us is None and e.total_run_count:
            last_us = e.last_run_us
        return {
            "name": e.name,
            "task": e.task,
            "kind": "static" if e.static else "dynamic",
            "schedule": e.schedule_text,
            "schedule_input": _schedule_input(e.spec),
            "tz": self._zone(e.spec),
            "next_due_ms": self._next_due(e, due_from, now),
            # seconds past due + grace, unsent or unfinished: what /metrics says (0: on time)
            "overdue": round(overdue, 3),
            "state": "disabled" if not e.enabled else "paused" if e.paused else "enabled",
            "enabled": e.enabled,
            "paused": e.paused,
            "run_now_pending": e.run_now_pending,
            # claimed, not yet accepted by the broker: the leader sends it until it is
            "pending_since_ms": _ms(e.pending_since_us),
            "policies": e.policies,
            "args": args,
            "kwargs": kwargs,
            "args_hidden": hidden,
            "options": e.options,
            "start_at": e.start_at,
            "expires_at": e.expires_at,
            "last_run_ms": _ms(last_us),
            "last": None if last is None else _run_json(last),
            "total_run_count": e.total_run_count,
            "updated_at_ms": _ms(e.updated_at),
            "updated_by": e.updated_by,
        }

    def _zone(self, spec: Mapping[str, Any]) -> str | None:
        if "cron" in spec:
            return str(spec.get("tz") or f"{self.app.conf.timezone or 'UTC'} (app)")
        if "at" in spec:
            return "UTC offset in the time"
        if "solar" in spec:
            return "solar (its place)"
        return None  # an interval has none

    def _next_due(self, e: Entry, last_us: int | None, now: datetime) -> int | None:
        """When the entry is next due after its last run (epoch ms; None: never again).

        One that never ran counts from now, as a beat that has just loaded it does.
        """
        if not e.spec:
            return None
        key = (e.name, json.dumps(e.spec, sort_keys=True), e.start_at, e.expires_at, last_us)
        now_ms = int(now.timestamp() * 1000)
        cached = self._due.get(key, -1)
        if cached is None or (cached != -1 and cached > now_ms):
            return cached
        try:
            due, _ = entry_due(e, last_us, now, self.app)  # the overdue seconds' rule
        except Exception as exc:  # a schedule Celery cannot compute: say so, show the rest
            log.debug("celery-election web: next due of %s: %s", e.name, exc)
            return None
        value = None if due is None else int(due.timestamp() * 1000)
        if len(self._due) > 20_000:
            self._due.clear()
        self._due[key] = value
        return value

    def entry(self, name: str) -> dict[str, Any]:
        e = self.schedule.get(name)
        history = self.schedule.history(name, limit=50)
        changes = [
            a for a in self.schedule.store.audit(self.namespace, limit=500) if a.name == name
        ]
        now = datetime.now(timezone.utc)
        late = overdue_by_entry(self.schedule, self.overdue_grace, [e]).get(e.name, 0.0)
        return {
            "entry": self.entry_json(e, history[0] if history else None, now, late),
            "history": [_run_json(r) for r in history],
            "changes": [_audit_json(a) for a in changes[:50]],
        }

    def timeline(
        self, from_ms: int | None = None, to_ms: int | None = None, width: int | None = None
    ) -> dict[str, Any]:
        """Who led when, and what each entry's runs look like, between ``from_ms`` and ``to_ms``.

        Default: the last hour; never further back than the history's retention. The terms
        are exact. The runs are what ``width`` pixel columns can show: the window is cut in
        columns of ``column_ms`` (``from_ms`` moves back to a column's edge, so a window that
        follows now keeps its columns), and each entry gets one mark per column with runs,
        the worst of them (``kinds``, least to most worrying), with how many runs it stands
        for. Each row of ``rows`` (``row_fields``) is one entry's marks:

        * ``entry``: an index of ``entries`` (the names) and ``keys`` (``api/mark``'s key);
        * ``columns``: the columns of its marks, each but the first as the step from the last;
        * ``marks``: one digit a mark, an index of ``kinds``;
        * ``runs``: ``[i, n, ...]``, mark i stands for n runs (only where n > 1);
        * ``late_ms``: ``[i, ms, ...]``, late mark i's most late run was that late.

        A day of a thousand entries' runs (114,000) is ~1 MB of integers and digits, not
        12 MB of objects; a run's task id, outcome and duration come from ``api/mark``.
        """
        window = self._window(from_ms, to_ms, width)
        keys, rows, total = self._mark_rows(window)
        return {
            "now_ms": _ms(window.now_us),
            "from_ms": _ms(window.from_us),
            "to_ms": _ms(window.to_us),
            "oldest_ms": _ms(window.oldest_us),
            "column_ms": window.column_ms,
            "late_ms": LATE_US // 1000,
            "terms": self._terms(window.from_us, window.to_us),
            "kinds": MARKS,
            "entries": [self._name(key) for key in keys],
            "keys": keys,
            "row_fields": ROW_FIELDS,
            "rows": rows,
            "runs": total,
        }

    def _window(self, from_ms: int | None, to_ms: int | None, width: int | None) -> _Window:
        """The timeline's window and its columns: see :meth:`timeline`."""
        now_us = self.schedule.store.db_now()
        oldest = now_us - int(self.retention * 86_400_000_000)
        to_us = now_us if to_ms is None else min(int(to_ms) * 1000, now_us)
        from_us = to_us - 3_600_000_000 if from_ms is None else int(from_ms) * 1000
        from_us = max(min(from_us, to_us - 1_000_000), oldest)
        columns = max(1, min(int(width or TIMELINE_WIDTH), TIMELINE_MAX_WIDTH))
        column_ms = max(1, -(-(to_us - from_us) // (columns * 1000)))
        first = (from_us // 1000) // column_ms * column_ms  # a column's edge
        return _Window(now_us, oldest, first * 1000, to_us, column_ms)

    def _mark_rows(self, window: _Window) -> tuple[list[str], list[list[Any]], int]:
        """The entries' keys, their rows of marks (``ROW_FIELDS``) and how many runs."""
        keys: list[str] = []
        rows: list[list[Any]] = []
        total = 0
        for key, cols, marks, runs, late_us in self.schedule.store.marks(
            self.schedule.run_namespaces, window.from_us, window.to_us + 1, window.column_ms * 1000
        ):
            steps = list(map(operator.sub, cols, (0, *cols[:-1])))
            many = [x for i, n in enumerate(runs) if n > 1 for x in (i, n)]
            late = [x for i, us in enumerate(late_us) if us is not None for x in (i, us // 1000)]
            rows.append([len(keys), steps, "".join(map(_DIGITS.__getitem__, marks)), many, late])
            keys.append(key)
            total += sum(runs)
        return keys, rows, total

    def _terms(self, from_us: int, to_us: int) -> list[dict[str, Any]]:
        """The terms of leadership in [from_us, to_us], the current ones marked."""
        with self._lock:
            leases = {
                n["namespace"]: {"term": n["term"], "held": n["leader"] is not None}
                for n in self._status["namespaces"]
            }
        return [
            {
                "namespace": t.namespace,
                "term": t.term,
                "leader": t.leader_id,
                "started_ms": _ms(t.started_at),
                "seen_ms": _ms(t.seen_at),
                "ended_ms": _ms(t.ended_at),
                "current": leases.get(t.namespace) == {"term": t.term, "held": True},
            }
            for t in self.schedule.store.terms(from_us, to_us)
        ]

    def mark(self, key: str, from_ms: int, to_ms: int) -> dict[str, Any]:
        """One mark of the timeline: entry ``key``'s runs sent in [from_ms, to_ms).

        The worst first (``run``: its task id, term, outcome, duration), up to 20 of them
        (``shown``), and how many runs of each kind the mark stands for (``counts``).
        """
        runs, counts = self.schedule.store.runs_in(
            self.schedule.run_namespaces, key, int(from_ms) * 1000, int(to_ms) * 1000
        )
        shown = [{**_run_json(r), "mark": run_mark(r)} for r in runs]
        return {
            "entry": self._name(key),
            "key": key,
            "from_ms": from_ms,
            "to_ms": to_ms,
            "runs": sum(counts.values()),
            "counts": counts,
            "run": shown[0] if shown else None,
            "shown": shown,
        }

    def _name(self, key: str) -> str:
        """The name of the entry of ``key`` (a removed one has none: its key's start)."""
        if not self._names:
            self.entries_body()
        return self._names.get(key, f"(removed {key[:8]})")

    def changed(self) -> None:
        """An action was taken: the next read of the entries goes to the database."""
        with self._lock:
            self._entries = None


def _key(h: Lease) -> dict[str, Any]:
    """One held key as the page shows it (times on the database's clock)."""
    since = h.acquired_at_us
    return {
        "key": h.key,
        "holder": h.leader_id,
        "term": h.term,
        "since_ms": _ms(since),
        "held_for": None if since is None else max(0, h.db_now_us - since) / 1e6,
        "expires_in": round(h.remaining, 3),
        "liveness": None if h.liveness_us is None else h.liveness_us / 1e6,
    }


def _namespace(ns: str, lease: Lease | None, candidates: list[Any]) -> dict[str, Any]:
    held = lease is not None and lease.held
    leader = lease.leader_id if lease is not None and held else None
    now_us = lease.db_now_us if lease is not None else None
    host = pid = None
    for c in candidates:
        if leader is not None and c.candidate_id == leader:
            host, pid = c.hostname, c.pid
    if leader is not None and host is None:  # not (yet) registered: read the default id
        parts = leader.split(":")
        if len(parts) >= 2 and parts[1].isdigit():
            host, pid = parts[0], int(parts[1])
    acquired = lease.acquired_at_us if lease is not None and held else None
    if now_us is None:
        now_us = max((c.heartbeat_at_us for c in candidates), default=0)
    return {
        "namespace": ns,
        "leader": leader,
        "host": host,
        "pid": pid,
        "term": lease.term if lease is not None else None,
        "acquired_at_ms": _ms(acquired),
        "led_for": None if acquired is None else (now_us - acquired) / 1e6,
        "expires_in": round(lease.remaining, 3) if lease is not None and held else None,
        "liveness": None
        if lease is None or not held or lease.liveness_us is None
        else lease.liveness_us / 1e6,
        "candidates": [
            {
                "id": c.candidate_id,
                "host": c.hostname,
                "pid": c.pid,
                "heartbeat_age": round((now_us - c.heartbeat_at_us) / 1e6, 3),
                "leading": c.candidate_id == leader,
            }
            for c in candidates
        ],
    }


def _audit_json(a: AuditRecord) -> dict[str, Any]:
    """An operator change as the page shows it (the latest actions, an entry's changes)."""
    return {
        "at_ms": _ms(a.at),
        "name": a.name,
        "action": a.action,
        "actor": a.actor,
        "detail": _redact(a.detail),
    }


def _redact(detail: Mapping[str, Any]) -> dict[str, Any]:
    """An audit record's detail without arguments.

    They may be secrets: the entry's own view shows them, or its argsrepr/kwargsrepr.
    """
    out = dict(detail)
    for key in ("args", "kwargs"):
        if key in out:
            out[key] = "(not shown)"
    options = out.get("options")
    if isinstance(options, dict):
        out["options"] = {k: v for k, v in options.items() if k not in ("argsrepr", "kwargsrepr")}
    return out


def _run_json(r: RunRecord) -> dict[str, Any]:
    return {
        "id": r.id,
        "kind": r.kind,
        "count": r.count,
        "term": r.term,
        "due_ms": _ms(r.due_at),
        "sent_ms": _ms(r.sent_at),
        "task_id": r.task_id,
        "finished_ms": _ms(r.finished_at),
        "outcome": r.status,
        "duration": None if r.duration_us is None else r.duration_us / 1e6,
    }


def _schedule_input(spec: Mapping[str, Any]) -> str | None:
    """The spec as the text an operator types (what ``parse_schedule`` reads back)."""
    if "every" in spec:
        return describe(spec)  # "every 1h", "every 2.5s": what parse_schedule reads
    if "cron" in spec:
        return str(spec["cron"])
    if "solar" in spec:
        return f"{spec['solar']} {spec['lat']} {spec['lon']}"
    if "at" in spec:
        return f"at {spec['at']}"
    return None


# -- the WSGI application ----------------------------------------------------------------------
