"""The run's life under a seeded simulation (harness/runsim.py): 100,000 schedules a run.

Beats, a broker, workers and faults on one virtual clock, on the real transitions
(core/runstate.py) and the memory store (backends/memory_runs.py). The seeds change every UTC
day (``CELERY_ELECTION_SIM_SEED`` replays a day's first seed); a failure prints the
command that replays its schedule step by step.
"""

from __future__ import annotations

import datetime
import json
import os
from collections import Counter

import pytest

from harness import runsim

# Ten chunks: each a tenth of the CPU-bound work, well inside the hang guard (pytest-timeout,
# 120 s) on a loaded machine, where four of 25,000 each ran past it beside two CPU hogs.
SCHEDULES, CHUNKS = 100_000, 10
#: what 100,000 schedules must have met at least once: else the simulation proves less
#: than it says (a fault never drawn, a verdict never reached)
MET = [
    "statement failed", "answer lost", "message dropped", "message nacked", "confirm lost",
    "message twice", "ran unchecked",
    "beat killed", "beat paused", "worker killed (body)", "worker killed (ended)",
    "worker killed (received)", "worker paused", "worker lapsed (body)",
    "worker lapsed (busy)", "busy key", "excused",
    "run: started", "run: own", "run: taken over", "defer: running", "skip: started",
    "skip: finished",
]  # fmt: skip


def first_seed() -> int:
    given = os.environ.get("CELERY_ELECTION_SIM_SEED")
    if given:
        return int(given)
    return datetime.datetime.now(datetime.timezone.utc).date().toordinal() * SCHEDULES


# A hang guard above the default: the chunk is bounded CPU work (a fixed number of steps
# per schedule) whose time follows the machine's speed, 16 s alone and 95 s beside two CPU
# hogs; under coverage's tracing one ran past 120 s.
@pytest.mark.timeout(600)
@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_every_schedule_keeps_each_run_once(
    chunk: int, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Each chunk its schedules; the chunk that ends last checks what all of them met.

    The chunks run in any order, in any pytest-xdist worker: each writes what it met
    beside the others' (the workers share the base temporary directory's parent), then
    reads them; the last to write sees every chunk's (some faults are met a few times in
    100,000 schedules, not in each tenth).
    """
    size = SCHEDULES // CHUNKS
    start = first_seed() + chunk * size
    seen: Counter[str] = Counter()
    found = runsim.explore(range(start, start + size), seen=seen)
    if found is not None:
        seed, broke = found
        pytest.fail(f"seed {seed}: {broke}\nreplay: {runsim.replay_command(seed)}")
    assert seen["runs"] > size  # runs did execute: more than one per schedule
    base = tmp_path_factory.getbasetemp()  # under xdist, each worker's: its parent is shared
    shared = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "runsim-met"
    shared.mkdir(exist_ok=True)
    (shared / f"{chunk}.json").write_text(json.dumps(seen))
    chunks = [json.loads(f.read_text()) for f in sorted(shared.glob("*.json"))]
    if len(chunks) == CHUNKS:
        met = sum((Counter(c) for c in chunks), Counter())
        missing = [what for what in MET if not met[what]]
        assert not missing, f"{SCHEDULES} schedules never met: {missing}"


@pytest.mark.parametrize("window", sorted(runsim.REVERTS))
def test_each_window_is_found_when_its_fix_is_reverted(window: int) -> None:
    """Each window's 50bbd93 behaviour put back: a schedule breaks, and replays."""
    revert = frozenset({window})
    found = runsim.explore(range(20_000), revert)
    assert found is not None, f"window {window} ({runsim.REVERTS[window]}) not found"
    seed, broke = found
    assert runsim.check(seed, revert) == broke  # the seed replays it
    assert runsim.check(seed) is None  # and with the fix, that schedule holds


@pytest.mark.parametrize("seed", [123, 1299, 2951])
def test_a_schedule_replays_from_its_seed(capsys: pytest.CaptureFixture[str], seed: int) -> None:
    traces = []
    for _ in range(2):
        runsim.check(seed, trace=True)
        traces.append(capsys.readouterr().out)
    assert traces[0] == traces[1] and traces[0].count("\n") > 10
