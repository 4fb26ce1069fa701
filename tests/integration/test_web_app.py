"""The schedule page's WSGI app on SQLite: its JSON API, and who may act.

Called as a WSGI server calls it (an environ, a start_response), in this process: no
socket, except one test through the command's real server. Read-only without a token; an
action needs the CSRF header, a same-origin Origin and a valid token, else 403; no secret
(the database password, arguments behind argsrepr/kwargsrepr) leaves the server.
"""

from __future__ import annotations

import io
import json
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from wsgiref.util import setup_testing_defaults

import pytest
import sqlalchemy as sa
from celery import Celery
from click.testing import CliRunner

from celery_election import Elector
from celery_election.backends import SQLBackend, backend_from_url
from celery_election.backends.schema import entry_key
from celery_election.core.lease import Bid
from celery_election.ops.cli import election
from celery_election.schedule import Schedule
from celery_election.schedule.records import history_row
from celery_election.schedule.store import schedule_store
from celery_election.web import Observer, WebApp, make_app, server

from ..conftest import by_entry, claim_run
from ..support.history import claimed as sent_run
from ..support.history import ended, run_row

SECRET_ARG = "hunter2-arg"
DB_PASSWORD = "hunter2-db"
TOKEN = "s3cret-token-value"


@pytest.fixture
def app(tmp_path: Path) -> Iterator[Celery]:
    app = Celery("webtest", broker="memory://", set_as_current=False)
    app.conf.update(
        election_url=f"sqlite:///{tmp_path}/election.db",
        election_table_prefix=f"w{uuid.uuid4().hex[:8]}_",
        election_namespace="web",
        beat_schedule={
            "tick": {"task": "t.tick", "schedule": 1.0},
            "login": {
                "task": "t.login",
                "schedule": 60.0,
                "args": [SECRET_ARG],
                "kwargs": {"password": SECRET_ARG},
                "options": {"argsrepr": "('***',)", "kwargsrepr": "{'password': '***'}"},
            },
        },
    )
    with Schedule(app, actor="setup") as s:
        s.backend.install()
        s.add("report", "t.report", "*/5 * * * *", tz="Europe/Paris", check_task=False)
        s.add("often", "t.often", "every 10s", kwargs={"full": True}, overlap="skip",
              check_task=False)  # fmt: skip
    yield app


@pytest.fixture
def backend(app: Celery) -> Iterator[SQLBackend]:
    b = backend_from_url(app.conf.election_url, table_prefix=app.conf.election_table_prefix)
    assert isinstance(b, SQLBackend)
    yield b
    b.close()


@pytest.fixture
def web(app: Celery) -> Iterator[WebApp]:
    w = make_app(app, token=f"ops:{TOKEN}")
    yield w
    w.close()


@pytest.fixture
def readonly(app: Celery) -> Iterator[WebApp]:
    w = make_app(app)
    yield w
    w.close()


class Answer:
    def __init__(self, status: str, headers: list[tuple[str, str]], body: bytes) -> None:
        self.status = int(status.split()[0])
        self.headers = dict(headers)
        self.body = body

    def json(self) -> Any:
        return json.loads(self.body)


def call(web: Any, path: str, *, method: str = "GET", body: Any = None, **headers: str) -> Answer:
    """One request as a WSGI server makes it (headers as ``X_CSRF_TOKEN="..."``)."""
    path, _, query = path.partition("?")
    raw = b"" if body is None else json.dumps(body).encode()
    environ: dict[str, Any] = {
        "REQUEST_METHOD": method,
        "PATH_INFO": path,
        "QUERY_STRING": query,
        "CONTENT_LENGTH": str(len(raw)),
        "wsgi.input": io.BytesIO(raw),
        "REMOTE_ADDR": "10.9.8.7",
        "HTTP_HOST": "127.0.0.1:8080",
    }
    for key, value in headers.items():
        environ[f"HTTP_{key.upper()}"] = value
    setup_testing_defaults(environ)
    got: list[Any] = []
    chunks = web(environ, lambda status, hdrs, exc=None: got.extend([status, hdrs]))
    return Answer(got[0], got[1], b"".join(chunks))


def act(web: WebApp, name: str, action: str, token: str | None = TOKEN, **extra: Any) -> Answer:
    headers = {"X_CSRF_TOKEN": web.csrf, "ORIGIN": "http://127.0.0.1:8080"}
    if token is not None:
        headers["AUTHORIZATION"] = f"Bearer {token}"
    return call(web, "/api/actions", method="POST", body={"name": name, "action": action, **extra},
                **headers)  # fmt: skip


def entries(web: WebApp) -> dict[str, Any]:
    web.observer.changed()
    return {e["name"]: e for e in call(web, "/api/entries").json()["entries"]}


# -- reading ------------------------------------------------------------------------------------


def test_the_page_and_its_files_are_served_with_a_strict_policy(web: WebApp) -> None:
    page = call(web, "/")
    assert page.status == 200 and page.headers["Content-Type"].startswith("text/html")
    text = page.body.decode()
    assert f'name="csrf-token" content="{web.csrf}"' in text
    assert 'content="act"' in text and "{{" not in text
    assert "http" not in text.replace("http-equiv", "")  # nothing from elsewhere: works offline
    assert "default-src 'none'" in page.headers["Content-Security-Policy"]
    for name, kind in (("page.js", "text/javascript"), ("page.css", "text/css")):
        asset = call(web, f"/static/{name}")
        assert asset.status == 200 and asset.headers["Content-Type"].startswith(kind)
        # the SVG namespace is a name, not an address: nothing is fetched from it
        body = asset.body.replace(b'"http://www.w3.org/2000/svg"', b"")
        assert b"https://" not in body and b"http://" not in body
    assert call(web, "/static/../web.py").status == 404
    assert call(web, "/nothing").status == 404
    mounted = call(web, "")  # /prefix without its slash: relative links need it
    assert mounted.status == 308 and mounted.headers["Location"].endswith("/")


def test_state_shows_each_namespace_its_leader_and_the_changes_seen(
    web: WebApp, backend: SQLBackend
) -> None:
    obs = web.observer
    first = obs.look()
    assert first["namespaces"] == []
    e = Elector(backend, "web-beat", ttl=3)
    e.start()
    try:
        assert e.wait_for_leadership(10)
        obs.look()
        state = call(web, "/api/state").json()
        (ns,) = state["namespaces"]
        assert ns["namespace"] == "web-beat" and ns["leader"] == e.candidate_id
        assert ns["term"] == e.term and ns["pid"] is not None and ns["host"]
        assert ns["led_for"] is not None and ns["led_for"] >= 0 and ns["expires_in"] > 0
        assert [c["leading"] for c in ns["candidates"]] == [True]
        assert state["schedule_namespace"] == "web-beat"
        assert state["can_act"] is True and state["auth"] == "token"
        term = e.term
    finally:
        e.stop()
    obs.look()
    state = call(web, "/api/state").json()
    changes = [(t["leader"], t["previous_leader"]) for t in state["transitions"]]
    assert changes[-1] == (e.candidate_id, None)  # first seen
    assert changes[0] == (None, e.candidate_id)  # resigned: nobody leads
    assert state["transitions"][0]["previous_term"] == term


def test_state_lists_the_keys_singleton_tasks_hold(web: WebApp, backend: SQLBackend) -> None:
    from celery_election.election.holder import KeyHolder

    assert call(web, "/api/state").json()["keys"] == []
    holder = KeyHolder(backend, "web", holder_id="worker-7")  # the app's namespace
    try:
        held = holder.acquire("report:1")
        assert held is not None
        web.observer.look()
        state = call(web, "/api/state").json()
        assert state["keys_namespace"] == "web"
        ((k,),) = [state["keys"]]
        assert (k["key"], k["holder"], k["term"], k["liveness"]) == (
            "report:1", "worker-7", held.term, 1.0,
        )  # fmt: skip
        assert k["since_ms"] > 0 and k["held_for"] >= 0 and k["expires_in"] > 0
        holder.release(held)
        web.observer.look()
        assert call(web, "/api/state").json()["keys"] == []
    finally:
        holder.close()
    page = call(web, "/").body.decode()
    assert 'id="keys"' in page and "Held keys" in page


def test_entries_static_and_dynamic_with_schedule_zone_next_due_and_last_run(
    web: WebApp, backend: SQLBackend
) -> None:
    before = time.time() * 1000
    got = entries(web)
    assert set(got) == {"tick", "login", "report", "often"}
    report, often, tick = got["report"], got["often"], got["tick"]
    assert report["kind"] == "dynamic" and tick["kind"] == "static"
    assert report["schedule"] == "cron */5 * * * * (Europe/Paris)"
    assert report["tz"] == "Europe/Paris" and often["tz"] is None
    assert tick["tz"] is None and got["login"]["schedule"] == "every 1m"
    # never ran: due one period from now (as a beat that just loaded it)
    assert before + 9_000 <= often["next_due_ms"] <= time.time() * 1000 + 10_500
    assert before <= report["next_due_ms"] <= before + 5 * 60_000 + 1000
    assert often["policies"]["overlap"] == "skip" and often["state"] == "enabled"
    assert often["last"] is None and often["last_run_ms"] is None
    store = schedule_store(backend)
    sent_run(backend, "web-beat", "often", "t-1", term=3)
    skipped = history_row("web-beat", "often", "skipped", run_key=2, term=3, count=4,
                          sent_at=store.db_now() + 1)  # fmt: skip
    store.record_many([skipped])
    sent_run(backend, "web-beat", "tick", "t-2", due=7, term=3)
    ended(backend, "web-beat", "tick", "t-2")
    got = entries(web)
    # the last run is the last one sent (a run the overlap policy skipped is not a run)
    assert (got["often"]["last"]["kind"], got["often"]["last"]["task_id"]) == ("run", "t-1")
    assert got["often"]["last"]["outcome"] == "queued"  # the broker has it, no worker yet
    last = got["tick"]["last"]
    assert (last["task_id"], last["outcome"]) == ("t-2", "SUCCESS") and last["duration"] >= 0
    assert got["tick"]["last_run_ms"] == last["sent_ms"]
    # computed from the last run: one period after it
    assert got["tick"]["next_due_ms"] == pytest.approx(last["sent_ms"] + 1000, abs=5)
    # a run claimed and not yet taken by the broker (the run ledger) is shown unsent
    assert got["often"]["pending_since_ms"] is None
    me = uuid.uuid4().hex
    term = backend.elect(Bid("web-beat", me, "beat", 30.0)).lease.term
    assert claim_run(backend.beat, "web-beat", me, term, "often", None, 1_000, pending=True).won
    claimed = by_entry(backend.beat.pending_runs("web-beat"))["often"].claimed_us
    web.observer._entries = None  # read again now, not after the cache's interval
    assert entries(web)["often"]["pending_since_ms"] == claimed // 1000


def test_an_overdue_entry_is_marked_with_how_long_as_metrics_say(
    web: WebApp, backend: SQLBackend
) -> None:
    """Due and not sent within its grace (one period: 1 s for ``tick``): the page says by how
    much, in the list and in the entry's own view; an entry on time reads 0.

    The page reads the clock later than the test: by up to the seconds the test took (1.6 s
    once on a busy CI run, where a fixed 1.5 s tolerance failed)."""
    me = uuid.uuid4().hex
    lease = backend.elect(Bid("web-beat", me, "beat", 30.0)).lease
    start = schedule_store(backend).db_now()
    stale = start - 100_000_000  # ran 100 s ago
    assert claim_run(backend.beat, "web-beat", me, lease.term, "tick", None, stale).won
    got = entries(web)
    assert got["often"]["overdue"] == got["login"]["overdue"] == 0
    detail = call(web, "/api/entry?name=tick").json()["entry"]
    took = (schedule_store(backend).db_now() - start) / 1e6
    for overdue in (got["tick"]["overdue"], detail["overdue"]):
        assert 98 - 0.01 <= overdue <= 98 + took + 0.01  # due 99 s ago, 1 s grace


def test_one_entry_with_its_history_and_changes(web: WebApp, backend: SQLBackend) -> None:
    now = schedule_store(backend).db_now()
    rows = [run_row("web-beat", "often", due=key, sent_at=now + key, task_id=f"x{key}")
            for key in range(3)]  # fmt: skip
    schedule_store(backend).record_many(rows)
    detail = call(web, "/api/entry?name=often").json()
    assert detail["entry"]["name"] == "often"
    assert [h["task_id"] for h in detail["history"]] == ["x2", "x1", "x0"]
    assert [(c["action"], c["actor"]) for c in detail["changes"]] == [("add", "setup")]
    assert call(web, "/api/entry?name=nope").status == 400
    assert call(web, "/api/entry").status == 400


def marks_of(timeline: dict[str, Any]) -> dict[str, list[tuple[int, str, int, int | None]]]:
    """Each entry's marks in ``api/timeline``: (column, kind, runs, late ms), as the page reads."""
    assert timeline["row_fields"] == ["entry", "columns", "marks", "runs", "late_ms"]
    out = {}
    for index, steps, marks, many, late in timeline["rows"]:
        n = dict(zip(many[::2], many[1::2], strict=True))
        most = dict(zip(late[::2], late[1::2], strict=True))
        columns = [sum(steps[: i + 1]) for i in range(len(steps))]
        out[timeline["entries"][index]] = [
            (c, timeline["kinds"][int(m)], n.get(i, 1), most.get(i))
            for i, (c, m) in enumerate(zip(columns, marks, strict=True))
        ]
    return out


def test_the_timeline_shows_each_column_its_worst_run_and_hover_fetches_it(
    web: WebApp, backend: SQLBackend
) -> None:
    """Runs reduced to what pixels show: a failed run among a hundred on time stays failed."""
    store = schedule_store(backend)
    now_ms = store.db_now() // 1000
    base = (now_ms - 30_000) // 1000 * 1000  # a second's edge, 30 s ago
    rows = [
        run_row("web-beat", "often", due=k, term=3, sent_at=(base + k * 9) * 1000,
                due_at=(base + k * 9) * 1000, task_id=f"ok-{k}")
        for k in range(100)
    ]  # fmt: skip
    rows.append(run_row("web-beat", "often", due=500, term=3, sent_at=(base + 505) * 1000,
                        due_at=(base + 505) * 1000, task_id="the-failed-one",
                        outcome="FAILURE", duration_us=250_000))  # fmt: skip
    rows.append(run_row("web-beat", "report", due=1, term=3, sent_at=(base + 5_000) * 1000,
                        due_at=(base + 2_000) * 1000, task_id="late-one"))  # fmt: skip
    rows.append(history_row("web-beat", "report", "missed", run_key=2, term=3, count=3,
                            sent_at=(base + 9_000) * 1000))  # fmt: skip
    store.record_many(rows)
    with backend.engine.begin() as conn:  # a term that began before the window, still led
        conn.execute(sa.insert(store.term_table).values(
            namespace="web-beat", term=3, leader_id="beat@a", started_at=(base - 99_000) * 1000,
            seen_at=now_ms * 1000, ended_at=None))  # fmt: skip
    got = call(web, f"/api/timeline?from_ms={now_ms - 60_000}&to_ms={now_ms}&width=60").json()
    assert got["column_ms"] == 1000 and got["from_ms"] % 1000 == 0
    assert got["late_ms"] == 500 and got["runs"] == 103
    assert set(got["keys"]) == {entry_key("often"), entry_key("report")}
    column = (base - got["from_ms"]) // 1000
    marks = marks_of(got)
    # 101 runs in the second from base: one mark, failed, standing for all of them
    assert marks["often"] == [(column, "failed", 101, None)]
    assert marks["report"] == [(column + 5, "late", 1, 3000), (column + 9, "missed", 1, None)]
    # the leadership bands stay exact: the term as recorded, though it began before the window
    assert [(t["term"], t["started_ms"], t["leader"]) for t in got["terms"]] == [
        (3, base - 99_000, "beat@a")
    ]
    # a wider page: a column per 100 ms; the failed run is still its own column's worst
    fine = call(web, f"/api/timeline?from_ms={now_ms - 60_000}&to_ms={now_ms}&width=600").json()
    assert fine["column_ms"] == 100
    kinds = [m[1] for m in marks_of(fine)["often"]]
    assert kinds.count("failed") == 1 and len(kinds) == 9 and set(kinds) == {"on-time", "failed"}
    # pointing at the mark: the failed run itself, with its task id, term, outcome, duration
    start = got["from_ms"] + column * 1000
    detail = call(web, f"/api/mark?key={entry_key('often')}&from_ms={start}"
                       f"&to_ms={start + 1000}").json()  # fmt: skip
    assert detail["entry"] == "often" and detail["runs"] == 101
    assert detail["counts"] == {"failed": 1, "on-time": 100}
    run = detail["run"]
    assert (run["task_id"], run["term"], run["outcome"], run["duration"], run["mark"]) == (
        "the-failed-one",
        3,
        "FAILURE",
        0.25,
        "failed",
    )
    assert run["sent_ms"] == base + 505 and len(detail["shown"]) == 20
    late = call(web, f"/api/mark?key={entry_key('report')}&from_ms={start + 5000}"
                     f"&to_ms={start + 6000}").json()["run"]  # fmt: skip
    assert (late["mark"], late["sent_ms"] - late["due_ms"], late["task_id"]) == (
        "late",
        3000,
        "late-one",
    )
    assert call(web, "/api/mark?key=nope&from_ms=1&to_ms=2").status == 400
    assert call(web, f"/api/mark?key={entry_key('often')}").status == 400
    assert call(web, "/api/timeline?width=wide").status == 400
    # the default: the last hour, 1,000 columns
    default = call(web, "/api/timeline").json()
    assert default["column_ms"] == 3600 and default["runs"] == 103


def test_unchanged_entries_answer_304(web: WebApp) -> None:
    first = call(web, "/api/entries")
    tag = first.headers["ETag"]
    again = call(web, "/api/entries", IF_NONE_MATCH=tag)
    assert again.status == 304 and again.body == b""
    assert act(web, "often", "pause").status == 200
    assert call(web, "/api/entries", IF_NONE_MATCH=tag).status == 200


def test_no_secret_leaves_the_server(app: Celery, backend: SQLBackend, tmp_path: Path) -> None:
    app.conf.election_url = f"postgresql+psycopg://ops:{DB_PASSWORD}@127.0.0.1:1/app"
    observer = Observer(app, backend=backend)  # the page of that URL, read from SQLite
    w = WebApp(app, token=TOKEN, observer=observer)
    try:
        with Schedule(app, backend=backend, actor="setup") as s:
            s.add("hidden", "t.x", "every 1h", args=[SECRET_ARG], check_task=False,
                  options={"argsrepr": "('***',)"})  # fmt: skip
        bodies = [
            call(w, "/").body,
            call(w, "/api/state").body,
            call(w, "/api/entries").body,
            call(w, "/api/entry?name=login").body,
            call(w, "/api/entry?name=hidden").body,
        ]
        for body in bodies:
            assert DB_PASSWORD.encode() not in body and SECRET_ARG.encode() not in body
        state = json.loads(bodies[1])
        assert state["database"] == "postgresql+psycopg://ops:***@127.0.0.1:1/app"
        login = json.loads(bodies[3])["entry"]
        assert login["args"] == "('***',)" and login["kwargs"] == "{'password': '***'}"
        assert login["args_hidden"] is True
        hidden = json.loads(bodies[4])["entry"]
        assert hidden["args"] == "('***',)" and hidden["kwargs"] == {}
        assert json.loads(bodies[2])["entries"][0]["args_hidden"] in (True, False)
    finally:
        w.close()


# -- who may act --------------------------------------------------------------------------------


def test_read_only_without_a_token(readonly: WebApp, app: Celery) -> None:
    assert call(readonly, "/api/state").json()["can_act"] is False
    assert 'content="read-only"' in call(readonly, "/").body.decode()
    refused = act(readonly, "often", "pause", token="anything")
    assert refused.status == 403 and "read-only" in refused.json()["error"]
    with Schedule(app) as s:
        assert not s.get("often").paused


HERE = "http://127.0.0.1:8080"
BEARER = f"Bearer {TOKEN}"


@pytest.mark.parametrize(
    "headers, why",
    [
        ({"ORIGIN": HERE, "AUTHORIZATION": BEARER}, "CSRF"),  # no CSRF header
        ({"X_CSRF_TOKEN": "forged", "ORIGIN": HERE, "AUTHORIZATION": BEARER}, "CSRF"),
        ({"X_CSRF_TOKEN": "{csrf}", "ORIGIN": "https://evil.example", "AUTHORIZATION": BEARER},
         "origin https://evil.example"),
        ({"X_CSRF_TOKEN": "{csrf}", "REFERER": "https://evil.example/p", "AUTHORIZATION": BEARER},
         "origin https://evil.example"),
        ({"X_CSRF_TOKEN": "{csrf}", "ORIGIN": HERE}, "valid token"),
        ({"X_CSRF_TOKEN": "{csrf}", "ORIGIN": HERE, "AUTHORIZATION": "Bearer wrong"},
         "valid token"),
        ({"X_CSRF_TOKEN": "{csrf}", "ORIGIN": HERE, "AUTHORIZATION": f"Basic {TOKEN}"},
         "valid token"),
    ],
    ids=["no-csrf", "forged-csrf", "other-origin", "other-referer", "no-token", "wrong-token",
         "not-bearer"],
)  # fmt: skip
def test_an_action_is_refused_without_csrf_origin_and_token(
    web: WebApp, app: Celery, headers: dict[str, str], why: str
) -> None:
    headers = {k: v.replace("{csrf}", web.csrf) for k, v in headers.items()}
    body = {"name": "often", "action": "pause"}
    refused = call(web, "/api/actions", method="POST", body=body, **headers)
    assert refused.status == 403, refused.body
    assert why in refused.json()["error"]
    with Schedule(app) as s:
        assert not s.get("often").paused
    assert call(web, "/api/actions").status == 405  # a GET never acts


def test_each_action_through_the_schedule_with_who_and_when(web: WebApp, app: Celery) -> None:
    assert act(web, "often", "pause").json() == {"ok": True, "actor": "web:ops"}
    assert entries(web)["often"]["state"] == "paused"
    assert act(web, "often", "resume", missed="catch_up").status == 200
    assert act(web, "often", "resume", missed="bogus").status == 400
    assert act(web, "often", "run_now").json()["requested"] is True
    assert act(web, "often", "run_now").json()["requested"] is False  # two clicks: one run
    assert entries(web)["often"]["run_now_pending"] is True
    assert act(web, "tick", "disable").status == 200  # a static entry too
    assert entries(web)["tick"]["state"] == "disabled"
    assert act(web, "tick", "enable").status == 200
    assert act(web, "nope", "pause").status == 400
    assert act(web, "often", "explode").status == 400
    with Schedule(app) as s:
        audit = s.store.audit(s.namespace, limit=20)
    mine = [(a.action, a.name, a.actor) for a in reversed(audit) if a.actor != "setup"]
    assert mine == [
        ("pause", "often", "web:ops"), ("resume", "often", "web:ops"),
        ("run_now", "often", "web:ops"), ("run_now", "often", "web:ops"),
        ("disable", "tick", "web:ops"), ("enable", "tick", "web:ops"),
    ]  # fmt: skip
    assert all(a.at > 0 for a in audit)


def test_edit_schedule_zone_and_policies(web: WebApp) -> None:
    ok = act(
        web, "often", "edit", changes={"schedule": "every 2m", "grace": 30, "overlap": "allow"}
    )
    assert ok.status == 200, ok.body
    often = entries(web)["often"]
    assert often["schedule"] == "every 2m" and often["policies"]["grace"] == 30.0
    # the zone alone: the crontab is re-read in it
    assert act(web, "report", "edit", changes={"tz": "Asia/Tokyo"}).status == 200
    assert entries(web)["report"]["schedule"] == "cron */5 * * * * (Asia/Tokyo)"
    bad = act(web, "report", "edit", changes={"schedule": "every never"})
    assert bad.status == 400 and "cannot read the schedule" in bad.json()["error"]
    static = act(web, "tick", "edit", changes={"schedule": "every 5s"})
    assert static.status == 400 and "static" in static.json()["error"]
    assert act(web, "tick", "edit", changes={"catch_up": "skip", "grace": ""}).status == 200
    assert entries(web)["tick"]["policies"]["catch_up"] == "skip"
    assert act(web, "tick", "edit", changes={"task": "other"}).status == 400
    assert act(web, "tick", "edit", changes={}).status == 400


def test_the_host_apps_own_check_and_protected_reads(app: Celery) -> None:
    w = make_app(app, auth=lambda env: "alice" if env.get("HTTP_X_USER") == "alice" else None,
                 protect_reads=True)  # fmt: skip
    try:
        assert call(w, "/api/state").status == 403
        assert call(w, "/api/state", X_USER="alice").json()["auth"] == "app"
        headers = {"X_CSRF_TOKEN": w.csrf, "X_USER": "alice"}
        done = call(w, "/api/actions", method="POST", body={"name": "often", "action": "pause"},
                    **headers)  # fmt: skip
        assert done.status == 200 and done.json()["actor"] == "web:alice"
        nobody = call(w, "/api/actions", method="POST", body={"name": "often", "action": "resume"},
                      X_CSRF_TOKEN=w.csrf)  # fmt: skip
        assert nobody.status == 403
    finally:
        w.close()


def test_a_token_without_a_name_records_the_remote_address(app: Celery) -> None:
    w = make_app(app, token=TOKEN)
    try:
        assert act(w, "often", "pause").json()["actor"] == "web:10.9.8.7"
        assert call(w, "/api/whoami", AUTHORIZATION=f"Bearer {TOKEN}").json()["actor"] == (
            "web:10.9.8.7"
        )
    finally:
        w.close()
    with pytest.raises(ValueError, match="empty web token"):
        make_app(app, token="")


def test_the_commands_server_serves_the_page_and_takes_actions(web: WebApp) -> None:
    httpd = server(web, port=0)
    port = httpd.server_address[1]
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    try:
        with urllib.request.urlopen(f"{base}/") as r:
            assert web.csrf in r.read().decode()
        with urllib.request.urlopen(f"{base}/api/entries") as r:
            assert len(json.loads(r.read())["entries"]) == 4

        def post(token: str) -> int:
            req = urllib.request.Request(
                f"{base}/api/actions", method="POST",
                data=json.dumps({"name": "often", "action": "pause"}).encode(),
                headers={"X-CSRF-Token": web.csrf, "Origin": base,
                         "Authorization": f"Bearer {token}", "Content-Type": "application/json"},
            )  # fmt: skip
            try:
                with urllib.request.urlopen(req) as r:
                    return int(r.status)
            except urllib.error.HTTPError as exc:
                return int(exc.code)

        assert post("wrong") == 403
        assert post(TOKEN) == 200
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_the_command_is_registered(app: Celery) -> None:
    out = CliRunner().invoke(election, ["web", "--help"])
    assert out.exit_code == 0
    assert "--bind" in out.output and "--token" in out.output and "127.0.0.1" in out.output
    missing = CliRunner().invoke(election, ["web"], env={"CELERY_ELECTION_URL": ""})
    assert missing.exit_code != 0 and "--url" in missing.output


def test_mounted_in_an_asgi_app_through_asgiref(web: WebApp) -> None:
    """As README's ASGI example: under /ops, through asgiref's WsgiToAsgi."""
    import asyncio

    wsgi_to_asgi = pytest.importorskip("asgiref.wsgi").WsgiToAsgi
    asgi = wsgi_to_asgi(web)

    async def get(path: str) -> tuple[int, dict[bytes, bytes], bytes]:
        scope = {
            "type": "http", "http_version": "1.1", "method": "GET", "scheme": "http",
            "path": path, "raw_path": path.encode(), "root_path": "/ops", "query_string": b"",
            "headers": [(b"host", b"127.0.0.1:8080")], "client": ("127.0.0.1", 5),
            "server": ("127.0.0.1", 8080),
        }  # fmt: skip
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        await asgi(scope, receive, send)
        start = sent[0]
        body = b"".join(m.get("body", b"") for m in sent[1:])
        return start["status"], dict(start["headers"]), body

    status, headers, _ = asyncio.run(get("/ops"))
    assert status == 308 and headers[b"location"] == b"/ops/"
    status, _, body = asyncio.run(get("/ops/"))
    assert status == 200 and b'src="static/page.js"' in body  # relative: /ops/static/page.js
    status, _, body = asyncio.run(get("/ops/api/entries"))
    assert status == 200 and len(json.loads(body)["entries"]) == 4
