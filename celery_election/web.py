"""The schedule page: who leads each election, every beat entry, and the operator's actions.

    celery -A proj election web [--bind 127.0.0.1] [--port 8080] [--token TOKEN]

    from celery_election.web import make_app
    application = make_app(app, token=os.environ["ELECTION_WEB_TOKEN"])  # any WSGI server

A plain WSGI application (the standard library's: a dozen routes need no framework, and
WSGI mounts in Django, Flask or, through asgiref's ``WsgiToAsgi``, an ASGI app), a JSON
API under ``api/`` and one static page (HTML, CSS and JavaScript shipped in the package:
no CDN, it works offline) that polls the API every second.

* ``api/state``: each election namespace (leader, host and pid, term, how long it has
  led, liveness, candidates), the leadership changes this process saw while it ran (an
  :class:`Observer` thread looks four times a second) and the latest operator actions.
* ``api/entries``: every beat entry, static and dynamic (``Schedule.list()``), with its
  schedule in words and its time zone, its next due time (its Celery schedule from its last
  run), its last run from the history (one query for all entries), state and policies.
* ``api/entry?name=N``: one entry, its run history and its changes.
* ``POST api/actions``: pause, resume, run now, enable, disable, edit, through
  :class:`~celery_election.schedule.Schedule` (the CLI's API, fenced the same way).

Security:

* Read-only unless a token (``token=``, ``--token``, ``CELERY_ELECTION_WEB_TOKEN``) or the
  host app's own check (``auth=``) is configured: every action is then refused with 403.
* An action is a POST with the token (``Authorization: Bearer``), the page's CSRF token
  (``X-CSRF-Token``: derived from a secret of this process, embedded in the page) and, from
  a browser, an Origin (or else Referer) of this host; anything less is 403.
* Nothing secret is shown: the database URL's password is hidden, and an entry whose
  options carry Celery's ``argsrepr``/``kwargsrepr`` shows those instead of its arguments.
* Each action is recorded with its actor, ``web:<token name or remote address>`` (or
  ``web:<user>`` from ``auth``), and the time, by the schedule's audit.
"""

from __future__ import annotations

import collections
import hashlib
import hmac
import json
import logging
import re
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, urlsplit

import sqlalchemy as sa
from celery import Celery

from .backends import SQLBackend
from .backends.schema import entry_key
from .backends.sql_schedule import EntryRow, RunRecord
from .entry_spec import POLICY_DEFAULTS, RESUME, check_policies, describe, from_spec
from .errors import ConfigurationError, ElectionError
from .schedule import Entry, Schedule
from .settings import ElectionSettings, hide_password
from .term import Lease

__all__ = ["ACTIONS", "TOKEN_ENV", "Observer", "WebApp", "make_app", "server"]

log = logging.getLogger("celery_election.web")

#: The environment variable ``election web`` reads its token from.
TOKEN_ENV = "CELERY_ELECTION_WEB_TOKEN"
ACTIONS = ("pause", "resume", "run_now", "enable", "disable", "edit")
#: What the page's edit form may change (a static entry: only its policies).
EDITABLE = ("schedule", "tz", *POLICY_DEFAULTS)

StartResponse = Callable[..., Any]
Environ = dict[str, Any]
#: The host app's own check: the environ of a request, and who it is (None: nobody).
AuthCheck = Callable[[Environ], "str | bool | None"]


def _ms(us: int | None) -> int | None:
    return None if us is None else us // 1000


# -- what the page shows -----------------------------------------------------------------------


@dataclass(frozen=True)
class Transition:
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
        self.database = hide_password(ElectionSettings.from_app(app).url)
        self._lock = threading.Lock()
        self._status: dict[str, Any] = {"namespaces": [], "error": None, "now_ms": None}
        self._seen: dict[str, tuple[int | None, str | None]] = {}
        self.transitions: collections.deque[Transition] = collections.deque(maxlen=keep)
        self._entries: tuple[float, bytes, str] | None = None
        self._due: dict[tuple[str, str, int | None], int | None] = {}
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
        with self._lock:
            for info in out:
                key = info["namespace"]
                now = (info["term"], info["leader"])
                before = self._seen.get(key)
                if before != now:
                    self._seen[key] = now
                    self.transitions.appendleft(
                        Transition(now_us // 1000, key, now[0], now[1],
                                   *(before if before is not None else (None, None)))
                    )  # fmt: skip
            self._status = {"namespaces": out, "error": None, "now_ms": now_us // 1000}
            return self._status

    def status(self) -> dict[str, Any]:
        self.start()
        with self._lock:
            status = dict(self._status)
        if status["now_ms"] is None:  # the thread's first look has not finished
            status = dict(self.look())
        with self._lock:
            transitions = [t.as_dict() for t in self.transitions]
        audit = self.schedule.store.audit(self.namespace, limit=20)
        return {
            **status,
            "database": self.database,
            "schedule_namespace": self.namespace,
            "transitions": transitions,
            "actions": [
                {
                    "at_ms": _ms(a.at),
                    "name": a.name,
                    "action": a.action,
                    "actor": a.actor,
                    "detail": _redact(a.detail),
                }
                for a in audit
            ],
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
        last = self.last_runs([e.name for e in listed])
        now = datetime.now(timezone.utc)
        return [self.entry_json(e, last.get(e.name), now) for e in listed]

    def last_runs(self, names: Iterable[str]) -> dict[str, RunRecord]:
        """Each entry's latest history row, in one query.

        What ``history(name, limit=1)`` gives, without a round trip per entry.
        """
        store = self.schedule.store
        r = store.run
        by_key = {entry_key(n): n for n in names}
        latest = (
            sa.select(sa.func.max(r.c.id))
            .where(r.c.namespace == self.namespace)
            .group_by(r.c.entry_key)
            .scalar_subquery()
        )
        stmt = sa.select(r).where(r.c.id.in_(latest))
        from .backends.sql_schedule import _record

        rows = store._read(lambda conn: [_record(row) for row in conn.execute(stmt)], r)
        return {by_key[x.entry_key]: x for x in rows if x.entry_key in by_key}

    def entry_json(self, e: Entry, last: RunRecord | None, now: datetime) -> dict[str, Any]:
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
            "state": "disabled" if not e.enabled else "paused" if e.paused else "enabled",
            "enabled": e.enabled,
            "paused": e.paused,
            "run_now_pending": e.run_now_pending,
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
        """When the entry is next due, from its Celery schedule and its last run (epoch ms).

        Celery's own ``remaining_estimate``; an entry that never ran counts from now, as a
        beat that has just loaded it does. None: never again (a one-off that ran, expired).
        """
        if not e.spec:
            return None
        key = (e.name, json.dumps(e.spec, sort_keys=True), last_us)
        now_ms = int(now.timestamp() * 1000)
        cached = self._due.get(key, -1)
        if cached is None or (cached != -1 and cached > now_ms):
            return cached
        try:
            sched = from_spec(e.spec, app=self.app)
            ran = now if last_us is None else datetime.fromtimestamp(last_us / 1e6, tz=timezone.utc)
            if "at" in e.spec and last_us is not None:
                due = None if ran >= sched.at else sched.at
            else:
                due = now + sched.remaining_estimate(ran)
            if due is not None and e.start_at:
                due = max(due, datetime.fromisoformat(e.start_at))
            if due is not None and e.expires_at and due > datetime.fromisoformat(e.expires_at):
                due = None
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
        return {
            "entry": self.entry_json(e, history[0] if history else None, now),
            "history": [_run_json(r) for r in history],
            "changes": [
                {
                    "at_ms": _ms(a.at),
                    "action": a.action,
                    "actor": a.actor,
                    "detail": _redact(a.detail),
                }
                for a in changes[:50]
            ],
        }

    def changed(self) -> None:
        """An action was taken: the next read of the entries goes to the database."""
        with self._lock:
            self._entries = None


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
    cand_now = now_us
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
                "heartbeat_age": round((cand_now - c.heartbeat_at_us) / 1e6, 3),
                "leading": c.candidate_id == leader,
            }
            for c in candidates
        ],
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
        "outcome": r.outcome or ("running" if r.task_id and r.finished_at is None else None),
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


class HTTPError(Exception):
    """An answer other than 200: its status and one line for the page."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


_REASONS = {
    200: "OK", 304: "Not Modified", 308: "Permanent Redirect", 400: "Bad Request",
    401: "Unauthorized", 403: "Forbidden", 404: "Not Found", 405: "Method Not Allowed",
    413: "Content Too Large", 503: "Service Unavailable",
}  # fmt: skip
_STATIC = {
    "page.js": "text/javascript; charset=utf-8",
    "page.css": "text/css; charset=utf-8",
}
_JSON = ("Content-Type", "application/json")
_HEADERS = [
    ("X-Content-Type-Options", "nosniff"),
    ("Referrer-Policy", "same-origin"),
    ("X-Frame-Options", "DENY"),
    (
        "Content-Security-Policy",
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'",
    ),
]
_NAME = re.compile(r"[A-Za-z0-9_.@+-]{1,64}")


def _tokens(token: str | Iterable[str] | Mapping[str, str] | None) -> dict[str, str | None]:
    """Map each secret to its name (None: the actor is the remote address).

    ``NAME:SECRET`` names one.
    """
    if token is None:
        return {}
    if isinstance(token, Mapping):
        pairs: list[tuple[str | None, str]] = [(str(n), str(s)) for n, s in token.items()]
    else:
        pairs = []
        for t in [token] if isinstance(token, str) else list(token):
            named, sep, secret = t.partition(":")
            if sep and secret and _NAME.fullmatch(named):
                pairs.append((named, secret))
            else:
                pairs.append((None, t))
    out: dict[str, str | None] = {}
    for name, secret in pairs:
        if not secret:
            raise ConfigurationError("an empty web token would let anyone act: give a secret")
        out[secret] = name
    return out


class WebApp:
    """The WSGI callable of :func:`make_app` (see the module)."""

    def __init__(
        self,
        app: Celery,
        *,
        token: str | Iterable[str] | Mapping[str, str] | None = None,
        auth: AuthCheck | None = None,
        protect_reads: bool = False,
        namespace: str | None = None,
        allowed_origins: Iterable[str] = (),
        observer: Observer | None = None,
    ) -> None:
        self.observer = observer or Observer(app, namespace=namespace)
        self.tokens = _tokens(token)
        self.auth = auth
        self.protect_reads = protect_reads
        self.allowed_origins = {o.rstrip("/").lower() for o in allowed_origins}
        self._secret = secrets.token_bytes(32)
        self.csrf = hmac.new(self._secret, b"csrf", hashlib.sha256).hexdigest()[:40]

    @property
    def can_act(self) -> bool:
        return bool(self.tokens) or self.auth is not None

    def close(self) -> None:
        self.observer.close()

    # -- WSGI --------------------------------------------------------------------------------

    def __call__(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        try:
            status, headers, body = self._route(environ)
        except HTTPError as exc:
            status, headers, body = exc.status, [_JSON], _json({"error": str(exc)})
        except ConfigurationError as exc:  # the schedule refused: a wrong name or value
            status, headers, body = 400, [_JSON], _json({"error": str(exc)})
        except ElectionError as exc:
            log.warning("celery-election web: %s", exc)
            answer = {"error": f"the election database did not answer: {exc}"}
            status, headers, body = 503, [_JSON], _json(answer)
        headers = [*headers, *_HEADERS, ("Content-Length", str(len(body)))]
        if not any(h[0] == "Cache-Control" for h in headers):
            headers.append(("Cache-Control", "no-store"))
        start_response(f"{status} {_REASONS.get(status, 'Error')}", headers)
        return [body] if environ.get("REQUEST_METHOD") != "HEAD" else [b""]

    def _route(self, environ: Environ) -> tuple[int, list[tuple[str, str]], bytes]:
        path = environ.get("PATH_INFO") or ""
        method = environ.get("REQUEST_METHOD", "GET")
        if path == "":  # mounted at /prefix: the page's relative links need /prefix/
            where = (environ.get("SCRIPT_NAME") or "") + "/"
            return 308, [("Location", where), ("Content-Type", "text/plain")], b""
        if path.startswith("/api/"):
            if path == "/api/actions":
                if method != "POST":
                    raise HTTPError(405, "actions are POSTs")
                return self._act(environ)
            if method not in ("GET", "HEAD"):
                raise HTTPError(405, f"{path} is read with GET")
            if self.protect_reads and self._actor(environ) is None:
                raise HTTPError(403, "this page needs the token to be read")
            return self._read(path, environ)
        if method not in ("GET", "HEAD"):
            raise HTTPError(405, "the page is read with GET")
        if path in ("/", "/index.html"):
            page = _asset("index.html").decode()
            page = page.replace("{{csrf}}", self.csrf).replace(
                "{{mode}}", "act" if self.can_act else "read-only"
            )
            return 200, [("Content-Type", "text/html; charset=utf-8")], page.encode()
        name = path.removeprefix("/static/")
        if name in _STATIC and path.startswith("/static/"):
            kind = ("Content-Type", _STATIC[name])
            return 200, [kind, ("Cache-Control", "no-cache")], _asset(name)
        raise HTTPError(404, f"no page {path}")

    def _read(self, path: str, environ: Environ) -> tuple[int, list[tuple[str, str]], bytes]:
        obs = self.observer
        kind = [_JSON]
        if path == "/api/state":
            state = obs.status()
            state["can_act"] = self.can_act
            state["auth"] = "token" if self.tokens else "app" if self.auth else None
            return 200, kind, _json(state)
        if path == "/api/entries":
            body, tag = obs.entries_body()
            if environ.get("HTTP_IF_NONE_MATCH") == tag:
                return 304, [("ETag", tag)], b""
            return 200, [*kind, ("ETag", tag)], body
        if path == "/api/entry":
            names = parse_qs(environ.get("QUERY_STRING") or "").get("name")
            if not names:
                raise HTTPError(400, "which entry? api/entry?name=NAME")
            return 200, kind, _json(obs.entry(names[0]))
        if path == "/api/whoami":
            actor = self._actor(environ)
            return 200, kind, _json({"actor": actor, "can_act": self.can_act})
        raise HTTPError(404, f"no API {path}")

    # -- actions -----------------------------------------------------------------------------

    def _act(self, environ: Environ) -> tuple[int, list[tuple[str, str]], bytes]:
        if not self.can_act:
            raise HTTPError(
                403,
                f"read-only: start `election web` with --token (or {TOKEN_ENV}), or pass "
                f"token= or auth= to make_app, to act from this page",
            )
        self._check_csrf(environ)
        actor = self._actor(environ)
        if actor is None:
            raise HTTPError(403, "a valid token is needed to act (Authorization: Bearer ...)")
        body = _body(environ)
        name, action = body.get("name"), body.get("action")
        if not isinstance(name, str) or not name:
            raise HTTPError(400, "which entry? give name")
        if action not in ACTIONS:
            raise HTTPError(400, f"action must be one of {', '.join(ACTIONS)}: got {action!r}")
        obs = self.observer
        s = Schedule(obs.app, namespace=obs.namespace, actor=actor, backend=obs.backend)
        try:
            result: dict[str, Any] = {"ok": True, "actor": actor}
            if action == "run_now":
                result["requested"] = s.run_now(name)
            elif action == "resume":
                missed = body.get("missed", "skip")
                if missed not in RESUME:
                    raise HTTPError(400, f"missed must be one of {', '.join(RESUME)}")
                s.resume(name, missed=missed)
            elif action == "edit":
                _update(s, name, _edits(s, name, body.get("changes")))
            else:
                getattr(s, action)(name)
        finally:
            obs.changed()
        log.info("celery-election web: %s %s by %s", action, name, actor)
        return 200, [_JSON], _json(result)

    def _check_csrf(self, environ: Environ) -> None:
        given = environ.get("HTTP_X_CSRF_TOKEN") or ""
        if not hmac.compare_digest(given.encode(), self.csrf.encode()):
            raise HTTPError(403, "CSRF check failed: send the page's X-CSRF-Token header")
        origin = environ.get("HTTP_ORIGIN")
        if origin is None and environ.get("HTTP_REFERER"):
            parts = urlsplit(environ["HTTP_REFERER"])
            origin = f"{parts.scheme}://{parts.netloc}"
        if origin is None:
            return  # not a browser (a browser sends Origin with every POST of fetch())
        mine = {f"{environ.get('wsgi.url_scheme', 'http')}://{_host(environ)}".lower()}
        if origin.rstrip("/").lower() not in mine | self.allowed_origins:
            raise HTTPError(403, f"CSRF check failed: origin {origin} is not this page's")

    def _actor(self, environ: Environ) -> str | None:
        """Who acts (``web:<name>``), or None if neither the token nor the host's check says."""
        remote = environ.get("REMOTE_ADDR") or "?"
        if self.auth is not None:
            who = self.auth(environ)
            if who:
                return f"web:{who if isinstance(who, str) else remote}"
        given = environ.get("HTTP_AUTHORIZATION") or ""
        scheme, _, secret = given.partition(" ")
        if scheme.lower() != "bearer" or not secret.strip():
            return None
        for known, name in self.tokens.items():
            if hmac.compare_digest(secret.strip().encode(), known.encode()):
                return f"web:{name or remote}"
        return None


def _update(s: Schedule, name: str, changes: dict[str, Any]) -> None:
    """``Schedule.update``; for a static entry no operator has touched yet, its first overlay.

    ``Schedule.update`` refuses a static entry without an overlay row ("no schedule
    entry"), though pause or run now would create one: the page writes that first overlay
    itself, in the store's one audited transaction, with the same check.
    """
    static = name in (s.app.conf.beat_schedule or {})
    if not static or s.store.get(s.namespace, name) is not None:
        s.update(name, **changes)
        return
    unknown = set(changes) - set(POLICY_DEFAULTS)
    if unknown:
        raise ConfigurationError(
            f"{name!r} is a static beat_schedule entry: only its policies "
            f"({', '.join(POLICY_DEFAULTS)}) can change here, not {', '.join(sorted(unknown))}"
        )

    def work(current: EntryRow | None, now: int) -> tuple[dict[str, Any], dict[str, Any]]:
        spec = {**(current.spec if current is not None else {}), **changes}
        check_policies(spec)
        return {"spec": json.dumps(spec, sort_keys=True)}, changes

    s.store.change(s.namespace, name, "edit", s.actor, work)


def _edits(s: Schedule, name: str, changes: Any) -> dict[str, Any]:
    """The page's edit form as ``Schedule.update`` arguments."""
    if not isinstance(changes, dict) or not changes:
        raise HTTPError(400, "nothing to change: give changes {schedule, tz, policies}")
    unknown = set(changes) - set(EDITABLE)
    if unknown:
        raise HTTPError(400, f"the page edits {', '.join(EDITABLE)}: not {', '.join(unknown)}")
    out: dict[str, Any] = {}
    for key, value in changes.items():
        if isinstance(value, str):
            value = value.strip()
        if key in ("grace", "catch_up_max", "overlap_timeout") and value in ("", None):
            value = None if key == "grace" else POLICY_DEFAULTS[key]
        out[key] = value
    if out.get("tz") == "":
        out["tz"] = None
    if "tz" in out and "schedule" not in out:
        # a stored spec is re-read without its new zone: re-state the schedule as text
        entry = s.get(name)
        if not entry.static:
            out["schedule"] = _schedule_input(entry.spec)
    if out.get("tz") is None:
        out.pop("tz", None)
    return out


def _host(environ: Environ) -> str:
    host = environ.get("HTTP_HOST")
    if host:
        return str(host)
    port = str(environ.get("SERVER_PORT", ""))
    default = "443" if environ.get("wsgi.url_scheme") == "https" else "80"
    return str(environ.get("SERVER_NAME", "")) + ("" if port == default else f":{port}")


def _body(environ: Environ) -> dict[str, Any]:
    try:
        size = int(environ.get("CONTENT_LENGTH") or 0)
    except ValueError:
        size = 0
    if size > 64 * 1024:
        raise HTTPError(413, "an action is under 64 KiB of JSON")
    raw = environ["wsgi.input"].read(size) if size else b""
    try:
        body = json.loads(raw or b"{}")
    except ValueError as exc:
        raise HTTPError(400, f"not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise HTTPError(400, "an action is a JSON object")
    return body


def _json(value: Any) -> bytes:
    return json.dumps(value, default=str).encode()


_ASSETS: dict[str, bytes] = {}


def _asset(name: str) -> bytes:
    if name not in _ASSETS:
        _ASSETS[name] = (
            resources.files("celery_election").joinpath("webpage").joinpath(name).read_bytes()
        )
    return _ASSETS[name]


def make_app(
    app: Celery,
    token: str | Iterable[str] | Mapping[str, str] | None = None,
    *,
    auth: AuthCheck | None = None,
    protect_reads: bool = False,
    namespace: str | None = None,
    allowed_origins: Iterable[str] = (),
) -> WebApp:
    """The schedule page of ``app``'s election database as a WSGI application.

    ``token``: the secret(s) that allow actions (``"name:secret"`` records ``name`` as the
    actor; a mapping name -> secret too); without it, and without ``auth``, the page is
    read-only. ``auth(environ)``: the host app's own check, returning who acts (or None).
    ``protect_reads``: the API answers reads only to those too. ``allowed_origins``: the
    public origins (``https://ops.example``) a proxy serves this page from, when its
    ``Host`` header is not the one the browser used.
    """
    return WebApp(app, token=token, auth=auth, protect_reads=protect_reads,
                  namespace=namespace, allowed_origins=allowed_origins)  # fmt: skip


# -- the command's server ----------------------------------------------------------------------


def server(web: WebApp, *, bind: str = "127.0.0.1", port: int = 8080) -> Any:
    """The standard library's WSGI server for ``web``, one thread a request (not started).

    ``serve_forever()`` serves, ``shutdown()`` (from another thread) stops; its
    ``server_address`` says the port (``port=0``: a free one).
    """
    from socketserver import ThreadingMixIn
    from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

    class Server(ThreadingMixIn, WSGIServer):
        daemon_threads = True
        allow_reuse_address = True

    class Quiet(WSGIRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            log.debug("%s %s", self.address_string(), format % args)

    return make_server(bind, port, web, server_class=Server, handler_class=Quiet)
