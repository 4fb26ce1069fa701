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
* ``api/timeline?from_ms=&to_ms=&width=``: who led when (the leadership history the leading
  beat records in the database, exact) and each entry's runs in the window (default: the
  last hour) as ``width`` pixel columns show them: per column, the worst mark and how many
  runs it stands for (``Observer.timeline``).
* ``api/mark?key=&from_ms=&to_ms=``: the runs behind one mark (task id, term, outcome,
  duration), fetched when the mark is pointed at.
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

import functools
import hashlib
import hmac
import json
import logging
import re
import secrets
from collections.abc import Callable, Iterable, Mapping
from importlib import resources
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

from ..errors import ConfigurationError, ElectionError
from .api import Schedule
from .observer import Observer
from .spec import POLICY_DEFAULTS

if TYPE_CHECKING:  # the Celery side's types; nothing from Celery is loaded here
    from celery import Celery

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
_KEY = re.compile(r"[0-9a-f]{40}")  # an entry's key (schema.entry_key)


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
        query = parse_qs(environ.get("QUERY_STRING") or "")
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
            names = query.get("name")
            if not names:
                raise HTTPError(400, "which entry? api/entry?name=NAME")
            return 200, kind, _json(obs.entry(names[0]))
        if path == "/api/timeline":
            window = [_int(query, "from_ms"), _int(query, "to_ms"), _int(query, "width")]
            return 200, kind, _json(obs.timeline(*window))
        if path == "/api/mark":
            key = (query.get("key") or [""])[0]
            start, end = _int(query, "from_ms"), _int(query, "to_ms")
            if not _KEY.fullmatch(key) or start is None or end is None:
                raise HTTPError(400, "which mark? api/mark?key=ENTRY_KEY&from_ms=&to_ms=")
            return 200, kind, _json(obs.mark(key, start, end))
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
            elif action == "resume":  # Schedule.resume refuses another missed (400)
                s.resume(name, missed=body.get("missed", "skip"))
            elif action == "edit":
                s.update(name, **_edits(body.get("changes")))
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


def _edits(changes: Any) -> dict[str, Any]:
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
    if out.get("tz") is None:
        out.pop("tz", None)
    return out


def _int(query: dict[str, list[str]], name: str) -> int | None:
    """An integer query parameter, or None when absent; 400 when not a number."""
    values = query.get(name)
    if not values or values[0] == "":
        return None
    try:
        return int(float(values[0]))
    except ValueError:
        raise HTTPError(400, f"{name} is epoch milliseconds: got {values[0]!r}") from None


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


@functools.cache  # the page's few files (index.html and _STATIC), read once
def _asset(name: str) -> bytes:
    return (
        resources.files("celery_election.schedule").joinpath("webpage").joinpath(name).read_bytes()
    )


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
