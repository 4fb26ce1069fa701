"""Each beat run once under faults, with real processes (second tier: about two and a half minutes).

400 entries due at every 16-second boundary: the two workers here run about 50 a
second (four processes each on two cores, a run 0.05 s and its records), so a burst's runs
take half the time between two. At 1,000 every 20 s they took all of it (50 a second with
no pause from the first boundary on), a fault's delay (the broker's 13 s) carried into the
next boundaries, and one's first runs began more than 20 s late: the test's wait for them
failed (CI on 2720397, and again on an idle machine). Three standalone ``celery beat -S
celery_election.beat:LeaderScheduler`` on PostgreSQL and RabbitMQ, each behind TCP
proxies of its own; two ``celery worker --election`` recording every execution in the
database (``harness/beat_faults.py``). One fault per boundary, in one cluster: the
leading beat SIGKILLed mid-burst, the next one SIGSTOPped mid-burst past its lease and
resumed, the broker refused to the beats from 1 s before a boundary to 8 s after, the
election database cut mid-burst, a worker SIGKILLed mid-burst (its runs redelivered,
``acks_late``), and every finished run of a boundary delivered again. Each boundary's
runs, counted from the workers' records by the run key each carries: each finished
exactly once. On 426ad25 (before the
run ledger) the same faults lost 265, 293 and 12 runs (``benchmarks/results/beat_faults.md``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.beat_faults import Run, Settings

from ..conftest import server_url

pytestmark = [pytest.mark.tier2, pytest.mark.timeout(600)]


def test_each_run_is_executed_once_whatever_fails(tmp_path: Path) -> None:
    server_url("postgresql"), server_url("amqp")  # required: skipped or failed loudly
    run = Run(tmp_path, Settings(entries=400, every=16.0, after=25))
    try:
        run.start()
        rows = run.several(["kill", "stop", "broker", "db", "worker", "redeliver"])
    except BaseException:
        print(run.cluster.logs())
        raise
    finally:
        run.close()
    for row in rows:
        print(f"{row['fault']}: {row['what']}: {row['runs']} runs, {row['lost']} lost, "
              f"{row['twice']} run twice, {row['interrupted']} interrupted, "
              f"{row['again_after_kill']} ran again after the kill, the last started "
              f"{row['late_s']:.1f} s late")  # fmt: skip
    kinds = ["none", "kill", "stop", "broker", "db", "worker", "redeliver"]
    assert [r["fault"] for r in rows] == kinds
    by = {r["fault"]: r for r in rows}
    assert by["worker"]["interrupted"] > 0  # the kill landed mid-task: those ran again
    assert run.skips() >= 400  # every redelivered copy skipped (and any other second one)
    assert [(r["fault"], r["lost"], r["twice"]) for r in rows if r["lost"] or r["twice"]] == []
