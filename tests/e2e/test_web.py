"""The schedule page in a real Chromium: two real beats, a worker, ``election web``.

Debian's ``chromium`` and ``chromium-driver`` (scripts/services-up installs them), driven by
Selenium. Every wait waits on the page's DOM or on the database with a deadline. The
leading beat is SIGKILLed and the page must show the new leader and term within 3 s, and
its timeline the handover (the two leaders' bands and the gap between them, from the
leadership history in the database) within 3 s too, with a run the handover made late or
missed marked so (its screenshot goes with the others; ``CELERY_ELECTION_DOCS_SHOTS=1``
also writes it to docs/timeline.png, the docs' picture: a run never changes the repository);
a pause made on the page stops the entry's runs (the executions the worker records), a
"run now" made on the page runs once, an action without the token is refused (403).
Screenshots go to $CELERY_ELECTION_ARTIFACTS (else the test's tmp_path) and their paths are
printed. With 1,000 entries the page's first table render is measured in the browser and
printed: a measurement, not an assertion.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from celery import Celery

from celery_election.backends import SQLBackend
from celery_election.schedule import Schedule
from celery_election.schedule.store import schedule_store
from celery_election.web import make_app, server
from harness.cluster import Cluster, wait_until
from harness.processes import Proc

from ..conftest import tool
from ..support.history import run_row

pytestmark = [pytest.mark.slow, pytest.mark.tier2]
webdriver = pytest.importorskip("selenium.webdriver")

TOKEN = "e2e-" + uuid.uuid4().hex
TICK = "tests.e2e.proj.tick"


# -- the browser ------------------------------------------------------------------------------


@pytest.fixture
def artifacts(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    base = os.environ.get("CELERY_ELECTION_ARTIFACTS")
    folder = Path(base) / "web" if base else tmp_path / "artifacts"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    chromium = tool("chromium", "apt-get install chromium chromium-driver (scripts/services-up)")
    driver = tool("chromedriver", "apt-get install chromium-driver (scripts/services-up)")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in (
        "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run",
        "--disable-dev-shm-usage", f"--user-data-dir={tmp_path / 'chromium-profile'}",
        "--window-size=1400,1000",
    ):  # fmt: skip
        options.add_argument(arg)
    service = webdriver.ChromeService(executable_path=driver, log_output=str(tmp_path / "cd.log"))
    b = webdriver.Chrome(options=options, service=service)
    b.set_script_timeout(10)
    try:
        yield b
    finally:
        b.quit()


def shot(browser: Any, folder: Path, name: str) -> Path:
    path = folder / f"{name}.png"
    browser.save_screenshot(str(path))
    print(f"screenshot: {path}")
    return path


def wait_dom(browser: Any, check: Callable[[], Any], timeout: float, what: str) -> Any:
    """Poll the page (20 times a second) until ``check`` is truthy; fail at the deadline."""
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException

    deadline = time.monotonic() + timeout
    while True:
        try:
            value = check()
        except (NoSuchElementException, StaleElementReferenceException):
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"the page did not show {what} within {timeout}s")
        time.sleep(0.05)


def css(browser: Any, selector: str) -> Any:
    return browser.find_element("css selector", selector)


def text(browser: Any, selector: str) -> str:
    return str(css(browser, selector).text)


# -- the cluster's side -----------------------------------------------------------------------


def cli(c: Cluster, *args: str) -> str:
    return c.schedule_cli(*args, actor="e2e-setup")


def executions(c: Cluster, entry: str) -> int:
    return sum(1 for r in c.rows(c.ticks) if r.entry == entry)


def history(c: Cluster, entry: str) -> list[Any]:
    backend = c.backend
    assert isinstance(backend, SQLBackend)
    return schedule_store(backend).history(f"{c.namespace}-beat", entry, limit=1000)


def cluster_app(c: Cluster) -> Celery:
    """An app on the cluster's election tables (the beats' namespace: ``<namespace>-beat``)."""
    app = Celery("e2e-web-check", set_as_current=False)
    app.conf.update(
        election_url=c.env["E2E_ELECTION"],
        election_table_prefix=c.prefix,
        election_namespace=c.namespace,
    )
    return app


def start_web(c: Cluster) -> str:
    """``celery -A tests.e2e.proj election web --port 0 --token e2e:...``; its URL."""
    log = c.tmp / "web.log"
    cmd = [sys.executable, "-m", "celery", "-A", "tests.e2e.proj", "election", "web",
           "--port", "0", "--token", f"e2e:{TOKEN}"]  # fmt: skip
    c.workers["web"] = Proc("web", cmd, env=c.env, cwd=c.tmp, log=log).start()

    def url() -> str | None:
        found = re.search(r"schedule page: (http://\S+/)", log.read_text() if log.exists() else "")
        return found.group(1) if found else None

    return wait_until(url, 60, "the web server's URL")


@pytest.mark.parametrize("cluster", [{"beat": True}], indirect=True, ids=["rabbitmq+postgresql"])
def test_the_page_follows_a_failover_and_acts_on_the_leader(
    cluster: Cluster, browser: Any, artifacts: Path
) -> None:
    c = cluster
    ns = f"{c.namespace}-beat"
    c.start(f"w{c.namespace}", election=False)  # a node name no other run on the broker has
    c.start_beat("b1")
    c.start_beat("b2")
    first = c.wait_beat_leader(30)
    second = "b2" if first == "b1" else "b1"
    cli(c, "add", "rare", TICK, "every 1h", "--args", '["rare"]')
    # due twice a second, missed when more than 0.2 s late: a beat dead for longer than
    # 0.7 s (a SIGKILL, then the liveness wait) drops at least one of its runs
    cli(c, "add", "tight", TICK, "every 0.5s", "--args", '["tight"]', "--grace", "0.2")
    url = start_web(c)
    print(f"page: {url}")

    browser.get(f"{url}#token={TOKEN}")
    row = f'#leaders tr[data-namespace="{ns}"]'
    pid = c.workers[first].pid
    wait_dom(browser, lambda: text(browser, f"{row} td.hostpid").endswith(f"/ {pid}"), 30,
             f"the leader {first} (pid {pid})")  # fmt: skip
    old_term = int(css(browser, row).get_attribute("data-term"))
    assert text(browser, f"{row} td.term").startswith("began ")  # a time, not the raw number
    wait_dom(browser, lambda: css(browser, '#entries tr[data-entry="every-second-a"]'), 10,
             "the static entries")  # fmt: skip
    shot(browser, artifacts, "1-leader")

    # the leader dies: the page shows the new one, with a new term, within 3 s
    new_pid = c.workers[second].pid
    c.signal(first, signal.SIGKILL)
    killed = time.monotonic()
    wait_dom(
        browser,
        lambda: (
            text(browser, f"{row} td.hostpid").endswith(f"/ {new_pid}")
            and int(css(browser, row).get_attribute("data-term")) > old_term
        ),
        3.0,
        f"the new leader {second} (pid {new_pid}) and a new term",
    )
    print(f"failover shown on the page {time.monotonic() - killed:.2f}s after the SIGKILL")
    # the timeline: the old leader's band, the gap, the new leader's band, within 3 s too
    left = max(0.1, 3.0 - (time.monotonic() - killed))
    handover = wait_dom(
        browser, lambda: handover_drawn(browser, ns, old_term), left, "the handover drawn"
    )
    gap = handover["gap"]
    print(
        f"handover on the timeline {time.monotonic() - killed:.2f}s after the SIGKILL: "
        f"no leader for {(gap['to_ms'] - gap['from_ms']) / 1000:.2f}s"
    )
    assert c.beat_leader() == second
    # a run the handover made late or missed is marked so (the history is written in batches)
    flagged = wait_dom(browser, lambda: flagged_after(browser, handover["gap"]["from_ms"]), 15,
                       "a late or missed run after the handover")  # fmt: skip
    print(f"marked after the handover: {flagged}")
    browser.execute_script(
        "const s = document.querySelector('#tl-window'); s.value = '60000';"
        "s.dispatchEvent(new Event('change'));"
    )
    span = "const s = document.querySelector('#tl-head svg'); return s.dataset.to - s.dataset.from"
    wait_dom(browser, lambda: browser.execute_script(span) < 61000, 5, "the last minute")
    ran = executions(c, "every-second-a")  # a few runs of the new leader, for the picture
    wait_dom(browser, lambda: executions(c, "every-second-a") >= ran + 3, 30, "new runs")
    css(browser, "#tl-live").click()  # hold the timeline still: point at a run
    time.sleep(0.3)
    # its mark on this window (a column of the last minute is ~50 ms, of the hour ~4 s)
    flagged = wait_dom(browser, lambda: flagged_after(browser, handover["gap"]["from_ms"]), 5,
                       "the late or missed run on the last minute")  # fmt: skip
    hover_a_mark(browser, flagged[0])
    webdriver.ActionChains(browser).move_to_element(css(browser, "#tl-range")).perform()
    picture = artifacts / "timeline.png"
    if os.environ.get("CELERY_ELECTION_DOCS_SHOTS") == "1":
        picture = Path(__file__).resolve().parents[2] / "docs" / "timeline.png"
    css(browser, "#timeline-section").screenshot(str(picture))
    print(f"screenshot: {picture}")
    css(browser, "#tl-live").click()
    shot(browser, artifacts, "2-failover")
    transitions = text(browser, "#transitions")
    assert str(new_pid) in transitions or second in transitions or "\u2192" in transitions

    # pause a static entry on the page: its runs stop (the worker's executions say so)
    entry_a = '#entries tr[data-entry="every-second-a"]'
    wait_dom(browser, lambda: executions(c, "every-second-a") >= 2, 30, "runs of every-second-a")
    css(browser, f'{entry_a} button[data-action="pause"]').click()
    wait_dom(browser, lambda: text(browser, f"{entry_a} td.state") == "paused", 5, "paused")
    base = executions(c, "every-second-a")
    goal = executions(c, "every-second-b") + 4
    wait_until(lambda: executions(c, "every-second-b") >= goal, 30, "4 more runs of the other")
    assert executions(c, "every-second-a") <= base + 1  # a run the leader had in hand
    audit = schedule_store(c.backend).audit(ns, limit=50)  # type: ignore[attr-defined]
    assert any(a.action == "pause" and a.actor == "web:e2e" for a in audit)
    shot(browser, artifacts, "3-paused")

    # run one now from the page: it runs once, and the page shows it
    rare = '#entries tr[data-entry="rare"]'
    assert executions(c, "rare") == 0
    css(browser, f'{rare} button[data-action="run_now"]').click()
    wait_until(lambda: executions(c, "rare") >= 1, 30, "the run now executed")
    wait_until(lambda: history(c, "rare"), 30, "its history row (written in batches)")
    assert [h.kind for h in history(c, "rare")] == ["run_now"]
    wait_dom(browser, lambda: text(browser, f"{rare} td.last") != "never", 10, "its last run")
    css(browser, f'{rare} button[data-action="detail"]').click()
    wait_dom(browser, lambda: "run_now" in text(browser, "#history"), 10, "the history")
    shot(browser, artifacts, "4-run-now-detail")
    # edit from the detail view: schedule text and a policy
    form = "#edit-form"
    wait_dom(browser, lambda: css(browser, f"{form} input[name=schedule]").get_attribute("value")
             == "every 1h", 5, "the form filled")  # fmt: skip
    css(browser, f"{form} input[name=schedule]").clear()
    css(browser, f"{form} input[name=schedule]").send_keys("every 2h")
    browser.execute_script(
        "const s = document.querySelector('#edit-form select[name=overlap]'); s.value = 'skip';"
    )
    css(browser, f"{form} button[type=submit]").click()
    wait_dom(browser, lambda: text(browser, f"{rare} td.schedule") == "every 2h", 5, "the edit")
    with Schedule(cluster_app(c)) as s:
        edited = s.get("rare")
    assert edited.spec == {"every": 7200.0} and edited.policies["overlap"] == "skip"
    assert edited.updated_by == "web:e2e"
    css(browser, "#detail-close").click()

    # without the token: 403, from the page's own button and from a bare fetch
    css(browser, "#forget").click()
    css(browser, f'{entry_a} button[data-action="resume"]').click()
    wait_dom(browser, lambda: "403" in text(browser, "#message"), 5, "the refusal")
    shot(browser, artifacts, "5-refused-without-token")
    status = browser.execute_async_script(
        """const done = arguments[arguments.length - 1];
        fetch("api/actions", {method: "POST", headers: {"Content-Type": "application/json",
          "X-CSRF-Token": document.querySelector("meta[name=csrf-token]").content},
          body: JSON.stringify({name: "every-second-a", action: "resume"})})
          .then((r) => done(r.status), (e) => done(String(e)));"""
    )
    assert status == 403
    with urllib.request.urlopen(f"{url}api/entries") as r:
        listed = {e["name"]: e for e in json.loads(r.read())["entries"]}
    assert listed["every-second-a"]["paused"] is True  # still: nothing acted


def handover_drawn(browser: Any, ns: str, old_term: int) -> dict[str, Any] | None:
    """The two bands of ``ns`` around the handover and the gap between them, once drawn."""
    t = browser.execute_script("return window.electionTimeline")
    if not t:
        return None
    bands = [b for b in t["bands"] if b["namespace"] == ns]
    old = [b for b in bands if b["term"] == old_term]
    new = [b for b in bands if b["term"] > old_term]
    gaps = [g for g in t["gaps"] if g["namespace"] == ns]
    if not old or not new or not gaps:
        return None
    gap = gaps[-1]
    assert old[0]["to_ms"] <= gap["from_ms"] < gap["to_ms"] == new[0]["from_ms"]
    return {"old": old[0], "new": new[0], "gap": gap}


def flagged_after(browser: Any, since_ms: int) -> list[dict[str, Any]] | None:
    """Late or missed marks of a column (a pixel's time) that ends after ``since_ms``."""
    t = browser.execute_script("return window.electionTimeline")
    found = [m for m in t["flagged"] if m["kind"] in ("late", "missed") and m["to_ms"] > since_ms]
    return found or None


def hover_a_mark(browser: Any, mark: dict[str, Any], *, says: tuple[str, ...] = ()) -> str:
    """Point at ``mark`` on the timeline: its tooltip tells the run, a click pins it.

    The tooltip first says what the mark is, then (api/mark) the worst run behind it.
    """
    where = browser.execute_script(
        """const [name, ms] = arguments;
        const svg = document.querySelector('#tl-body svg');
        const label = svg.querySelector(`text[data-entry="${name}"]`);
        const from = +document.querySelector('#tl-head svg').dataset.from;
        const to = +document.querySelector('#tl-head svg').dataset.to;
        label.scrollIntoView({block: 'center'});
        // from the middle of the rows' box (in view: WebDriver offsets from an element's
        // in-view centre, which for the tall SVG is not its middle)
        const r = svg.getBoundingClientRect(), W = +svg.getAttribute('width');
        const box = document.querySelector('#tl-scroll').getBoundingClientRect();
        const x = r.left + 190 + (ms - from) / (to - from) * (W - 198);
        const y = r.top + +label.getAttribute('y') - 4;
        return [x - (box.left + box.width / 2), y - (box.top + box.height / 2)];""",
        mark["entry"],
        mark["sent_ms"],
    )
    rows = css(browser, "#tl-scroll")
    chain = webdriver.ActionChains(browser).move_to_element_with_offset(
        rows, int(where[0]), int(where[1])
    )
    chain.click().perform()  # click pins the run's details under the timeline
    tip = wait_dom(
        browser,
        lambda: (
            css(browser, "#tl-tip").is_displayed()
            and "term began" in text(browser, "#tl-tip")
            and text(browser, "#tl-tip")
        ),
        5,
        "the run's tooltip with its details",
    )
    print(f"tooltip: {tip!r}")
    assert mark["entry"] in tip and "term began" in tip
    pinned = wait_dom(
        browser,
        lambda: "term began" in text(browser, "#tl-pinned") and text(browser, "#tl-pinned"),
        5,
        "the pinned details",
    )
    assert mark["entry"] in pinned
    for words in says or ():
        assert words in tip and words in pinned, (words, tip)
    if not says:
        assert ("late by" in tip) or ("missed" in tip)
        assert ("late by" in pinned) or ("missed" in pinned)
    return str(tip)


# -- 1,000 entries --------------------------------------------------------------------------


def test_a_thousand_entries_render_and_stay_usable(
    tmp_path: Path, browser: Any, artifacts: Path
) -> None:
    app = Celery("thousand", broker="memory://", set_as_current=False)
    app.conf.update(
        election_url=f"sqlite:///{tmp_path}/election.db",
        election_namespace="thousand",
        beat_schedule={"static-tick": {"task": "t.tick", "schedule": 1.0}},
    )
    with Schedule(app, actor="setup") as s:
        s.backend.install()
        for i in range(999):
            when = f"*/{1 + i % 30} * * * *" if i % 3 == 0 else f"every {10 + i}s"
            s.add(f"entry-{i:04d}", f"proj.task{i % 17}", when, check_task=False,
                  tz="Europe/Paris" if i % 3 == 0 else None, enabled=i % 10 != 0,
                  overlap="skip" if i % 7 == 0 else "allow")  # fmt: skip
        now = s.store.db_now()
        s.store.record_many([
            run_row(s.namespace, f"entry-{i:04d}", due=i, task_id=f"task-{i}",
                    sent_at=now - 40_000_000 + i) for i in range(0, 999, 3)
        ])  # fmt: skip
        # 300 runs on time over the last 30 s, one failed among them: on a timeline of the
        # last hour (a column is ~3 s) its column still shows failed, and pointing at it
        # gives that run
        s.store.record_many([
            run_row(s.namespace, "entry-0001", due=k, due_at=t, sent_at=t, task_id=f"busy-{k}",
                    outcome="FAILURE" if k == 150 else None, duration_us=2_500_000)
            for k, t in enumerate(range(now - 30_000_000, now, 100_000))
        ])  # fmt: skip
        with s.backend.engine.begin() as conn:
            conn.execute(sa.insert(s.store.term_table).values(
                namespace=s.namespace, term=1, leader_id="beat@here", started_at=now - 60_000_000,
                seen_at=now, ended_at=None))  # fmt: skip
    web = make_app(app, token=TOKEN)
    httpd = server(web, port=0)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}/"
    try:
        browser.get(url)  # a cold server: nothing read, nothing computed yet
        m = wait_dom(
            browser,
            lambda: browser.execute_script(
                "const m = window.electionPage; return m && m.firstTableRenderMs != null ? m : null"
            ),
            30,
            "the first table",
        )
        nav = browser.execute_script(
            "const n = performance.getEntriesByType('navigation')[0];"
            "return {dcl: n.domContentLoadedEventEnd, load: n.loadEventEnd};"
        )
        assert m["entries"] == 1000
        print(
            f"1,000 entries: table on screen {m['firstTableRenderMs']:.0f} ms after navigation "
            f"start (DOMContentLoaded {nav['dcl']:.0f} ms; api/entries fetched and parsed in "
            f"{m['entriesLoadMs']:.0f} ms; the render itself {m['firstTableRenderDurationMs']:.1f} "
            f"ms for 50 rows of 1,000 sorted)"
        )
        assert len(browser.find_elements("css selector", "#entries tbody tr")) == 50
        assert "1000 of 1000 entries" in text(browser, "#count")
        shot(browser, artifacts, "6-thousand-entries")

        # search, sort, pages: on the client
        css(browser, "#search").send_keys("entry-0999")
        wait_dom(browser, lambda: text(browser, "#count").startswith("0 of"), 5, "no match")
        css(browser, "#search").clear()
        css(browser, "#search").send_keys("entry-099")
        wait_dom(browser, lambda: text(browser, "#count").startswith("9 of"), 5, "9 matches")
        css(browser, "#search").clear()
        browser.execute_script(
            "const s = document.querySelector('#search'); s.value = '';"
            "s.dispatchEvent(new Event('input'));"
        )
        header = css(browser, '#entries th[data-sort="name"]')
        header.click()  # by name already: now descending
        wait_dom(
            browser,
            lambda: css(browser, "#entries tbody tr").get_attribute("data-entry") == "static-tick",
            5,
            "the last name first",
        )
        css(browser, "#next").click()
        wait_dom(browser, lambda: text(browser, "#page-info").startswith("51"), 5, "page 2")
        started = time.perf_counter()
        browser.execute_script(
            "const s = document.querySelector('#page-size'); s.value = '250';"
            "s.dispatchEvent(new Event('change'));"
        )
        wait_dom(
            browser,
            lambda: len(browser.find_elements("css selector", "#entries tbody tr")) == 250,
            5,
            "250 rows",
        )
        took = (time.perf_counter() - started) * 1000
        print(f"250 rows a page: shown in {took:.0f} ms (as the test saw it)")
        shot(browser, artifacts, "7-thousand-entries-sorted")
        web.observer.changed()  # read from the database again (next due times stay cached)
        started = time.perf_counter()
        with urllib.request.urlopen(f"{url}api/entries") as r:
            size = len(r.read())
        took = (time.perf_counter() - started) * 1000
        print(f"api/entries, 1,000 entries: {size / 1024:.0f} KiB in {took:.0f} ms (a re-read)")

        # the timeline (the last hour): the failed run among 300 on time is a failed mark
        t = wait_dom(
            browser,
            lambda: browser.execute_script(
                "const t = window.electionTimeline; return t.renders ? t : null"
            ),
            10,
            "the timeline",
        )
        css(browser, "#tl-live").click()  # hold it still
        failed = [m for m in t["flagged"] if m["entry"] == "entry-0001"]
        assert [m["kind"] for m in failed] == ["failed"], failed
        assert failed[0]["runs"] > 1  # a column of many runs
        assert t["runs"] == 333 + 300 and t["columns"] < t["runs"]
        tip = hover_a_mark(browser, failed[0], says=("run: failed", "busy-150", "FAILURE"))
        assert "2.5 seconds" in tip and "on-time" in tip  # its duration; the others in the column
    finally:
        httpd.shutdown()
        httpd.server_close()
        web.close()
