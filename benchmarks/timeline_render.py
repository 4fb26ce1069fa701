"""How fast the schedule page's timeline draws 1,000 entries and a day of their runs.

    .venv/bin/python benchmarks/timeline_render.py            # ~110,000 runs, 7 terms
    .venv/bin/python benchmarks/timeline_render.py --repeat 5

A SQLite election database gets 1,000 dynamic entries (one every 1 to 60 minutes, so a
day is about 110,000 history rows, some late, missed, skipped, run now or failed) and a
day of leadership history (a failover every few hours). The page is served by
``make_app`` on loopback and opened in Debian's headless Chromium (Selenium, as
tests/e2e/test_web.py). Each repetition selects "last day" on the page and reports what
the page itself measures (``window.electionTimeline``):

* api/timeline fetched and parsed (the server reads the window, one mark per entry and
  pixel column, and answers JSON),
* the render: the SVG built and put in the page (``lastRenderMs``),
* on screen: from the selection to the second animation frame after the render (layout
  and paint done).

Printed, and written to ``results/timeline_render.json``; the target is under a second on
screen, measured, not asserted (see RESULTS.md). Each repetition then fetches the runs
behind a failed mark (``api/mark``, what hovering it asks) and reports that time too.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import _root  # noqa: F401  (the repository root on sys.path)
import sqlalchemy as sa
from _machine import machine_info
from celery import Celery

from celery_election.schedule import Schedule
from celery_election.schedule.records import history_row
from celery_election.web import make_app, server

HERE = Path(__file__).resolve().parent


def fill(app: Celery, entries: int) -> tuple[int, int]:
    """Entries, a day of runs and of terms; (runs, terms) written."""
    rng = random.Random(7)
    with Schedule(app, actor="bench") as s:
        s.backend.install()
        for i in range(entries):
            s.add(
                f"entry-{i:04d}",
                f"proj.task{i % 17}",
                f"every {60 * (1 + i % 60)}s",
                check_task=False,
            )
        store = s.store
        now = store.db_now()
        day = 86_400_000_000
        terms = sorted(now - day + rng.randrange(day) for _ in range(6))
        starts = [now - day - 600_000_000, *terms]
        t = store.term_table
        rows: list[dict[str, Any]] = []
        for k, start in enumerate(starts):
            end = starts[k + 1] - rng.randrange(500_000, 3_000_000) if k + 1 < len(starts) else now
            rows.append(
                {
                    "namespace": s.namespace,
                    "term": start,
                    "leader_id": f"beat@host{k % 3}:{100 + k}",
                    "started_at": start,
                    "seen_at": end,
                    "ended_at": end if k % 2 else None,
                }
            )
        with s.backend.engine.begin() as conn:
            conn.execute(sa.insert(t), rows)
        runs: list[dict[str, Any]] = []
        for i in range(entries):
            every = 60_000_000 * (1 + i % 60)
            at = now - day + rng.randrange(every)
            while at < now:
                term = max(x for x in starts if x <= at)
                roll = rng.random()
                kind = (
                    "missed"
                    if roll < 0.01
                    else "skipped"
                    if roll < 0.015
                    else ("run_now" if roll < 0.02 else "run")
                )
                late = (
                    rng.randrange(2_000_000, 30_000_000) if roll > 0.97 else rng.randrange(20_000)
                )
                row = history_row(
                    s.namespace,
                    f"entry-{i:04d}",
                    kind,
                    run_key=at - every,
                    term=term,
                    due_at=at,
                    sent_at=at + late,
                    task_id=None if kind in ("missed", "skipped") else f"t-{i}-{at}",
                )
                ran = kind in ("run", "run_now")
                row.update(
                    finished_at=at + late + 50_000 if ran else None,
                    duration_us=50_000 if ran else None,
                    outcome=None if not ran else "FAILURE" if roll > 0.995 else "SUCCESS",
                )
                runs.append(row)
                at += every
        for chunk in range(0, len(runs), 5000):
            with s.backend.engine.begin() as conn:
                conn.execute(sa.insert(store.run), runs[chunk : chunk + 5000])
        return len(runs), len(rows)


def browser(profile: Path) -> Any:
    from selenium import webdriver

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "chromium"
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        f"--user-data-dir={profile}",
        "--window-size=1400,1000",
    ):
        options.add_argument(arg)
    service = webdriver.ChromeService(executable_path=shutil.which("chromedriver"))
    b = webdriver.Chrome(options=options, service=service)
    b.set_script_timeout(60)
    return b


MEASURE = """
const done = arguments[arguments.length - 1];
const T = window.electionTimeline;
const before = T.renders;
const started = performance.now();
const live = document.querySelector('#tl-live');
live.checked = false;  // the page's own polls stay out of the measurement
const s = document.querySelector('#tl-window');
s.value = '86400000';
const origFetch = window.fetch;
let fetched = null;
window.fetch = (...a) => origFetch(...a).then((r) => { fetched = performance.now(); return r; });
s.dispatchEvent(new Event('change'));
(function wait() {
  if (T.renders === before) { setTimeout(wait, 1); return; }
  const rendered = performance.now();
  requestAnimationFrame(() => requestAnimationFrame(() => {
    window.fetch = origFetch;
    const screenMs = performance.now() - started;
    const got = performance.getEntriesByType('resource')
      .filter((e) => e.name.includes('api/timeline')).pop();
    // pointing at a mark: the runs behind the worst one drawn, from api/mark
    const bad = T.flagged.filter((m) => m.kind === 'failed').pop() || T.flagged.pop();
    const result = {fetchMs: (fetched || rendered) - started, renderMs: T.lastRenderMs,
          screenMs, runs: T.runs, entries: T.entries, columns: T.columns,
          bands: T.bands.length, gaps: T.gaps.length, marks: T.marks,
          nodes: document.querySelectorAll('#tl-body svg *').length,
          url: got && got.name, bytes: got && got.encodedBodySize};
    if (!bad) { done(result); return; }
    const t0 = performance.now();
    origFetch(`api/mark?key=${bad.key}&from_ms=${bad.from_ms}&to_ms=${bad.to_ms}`)
      .then((r) => r.json()).then((b) => {
        result.markMs = performance.now() - t0;
        result.mark = {entry: b.entry, runs: b.runs, counts: b.counts,
                       task_id: b.run && b.run.task_id, outcome: b.run && b.run.outcome};
        done(result);
      });
  }));
})();
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--entries", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="timeline-bench-"))
    app = Celery("timeline-bench", broker="memory://", set_as_current=False)
    app.conf.update(election_url=f"sqlite:///{tmp}/election.db", election_namespace="bench")
    started = time.perf_counter()
    runs, terms = fill(app, args.entries)
    print(
        f"{args.entries} entries, {runs} runs and {terms} terms in a day, written in "
        f"{time.perf_counter() - started:.1f}s"
    )
    web = make_app(app)
    httpd = server(web, port=0)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}/"
    b = browser(tmp / "profile")
    results = []
    try:
        b.get(url)
        deadline = time.monotonic() + 60
        while not b.execute_script("return window.electionTimeline.renders > 0"):
            if time.monotonic() > deadline:
                raise SystemExit("the page drew no timeline in 60 s")
            time.sleep(0.1)
        for i in range(args.repeat):
            b.execute_script("window.electionTimeline.renders += 0")
            r = b.execute_async_script(MEASURE)
            results.append(r)
            print(
                f"run {i + 1}: api/timeline {r['fetchMs']:.0f} ms, render {r['renderMs']:.0f} ms, "
                f"on screen {r['screenMs']:.0f} ms ({r['runs']} runs of {r['entries']} entries "
                f"in {r.get('columns')} marks, {(r.get('bytes') or 0) / 1e6:.2f} MB; "
                f"{r['bands']} terms, {r['gaps']} gaps, {r['nodes']} SVG nodes)"
            )
            if "markMs" in r:
                print(f"  pointing at a mark: api/mark in {r['markMs']:.0f} ms: {r['mark']}")
            b.execute_script(
                "document.querySelector('#tl-window').value = '3600000';"
                "document.querySelector('#tl-window').dispatchEvent(new Event('change'))"
            )
            time.sleep(1.0)
        with_size = time.perf_counter()
        import urllib.request

        page = results[-1].get("url") or f"{url}api/timeline?from_ms=0"
        with urllib.request.urlopen(page) as resp:
            size = len(resp.read())
        served = (time.perf_counter() - with_size) * 1000
    finally:
        b.quit()
        httpd.shutdown()
        web.close()
    summary = {
        "entries": args.entries,
        "runs": runs,
        "terms": terms,
        "api_timeline_bytes": size,
        "api_timeline_ms_from_python": round(served),
        "api_timeline_url": page,
        "fetch_ms_p50": statistics.median(r["fetchMs"] for r in results),
        "api_mark_ms_p50": statistics.median(r.get("markMs", 0) for r in results),
        "render_ms_p50": statistics.median(r["renderMs"] for r in results),
        "on_screen_ms_p50": statistics.median(r["screenMs"] for r in results),
        "on_screen_ms_max": max(r["screenMs"] for r in results),
        "runs_detail": results,
        "machine": machine_info(),
    }
    print(
        f"a day of {runs} runs of {args.entries} entries: on screen in "
        f"{summary['on_screen_ms_p50']:.0f} ms (p50 of {args.repeat}; max "
        f"{summary['on_screen_ms_max']:.0f}); render {summary['render_ms_p50']:.0f} ms; "
        f"api/timeline {size / 1e6:.2f} MB in {served:.0f} ms (from Python, again); api/mark "
        f"{summary['api_mark_ms_p50']:.0f} ms"
    )
    out = HERE / "results" / "timeline_render.json"
    out.write_text(json.dumps(summary, indent=1, default=str) + "\n")
    print(f"written: {out}")
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
