"""The run ledger in the beat (in process, the memory backend): owed, recovered, one id.

A run a leader claimed is a claimed row in the store until the broker took it; a send that
raised is owed and sent again, under the same task id, once its back-off passed; a run
an earlier term left pending is sent by the next leader before its own claims; the tick
confirms what went out. The store's side, on every backend: tests/integration/test_run_ledger.py.
"""

from __future__ import annotations

import time
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from celery.schedules import crontab

from celery_election.backends import MemoryBackend
from celery_election.beat.ledger import run_task_id
from celery_election.core.clock import boottime
from celery_election.core.lease import Bid
from celery_election.errors import BackendUnavailableError
from celery_election.runs.once import RESENT

from ..conftest import claim_run
from .test_beat import NS, IsDueOnly, Recording, make_app, seed, shared, started

__all__ = ["shared", "started"]  # the fixtures, imported for this module's tests


class Flaky(Recording):
    """Records each send's task id and headers; the first ``fail`` sends raise."""

    fail: int
    ids: list[str | None]
    headers: list[dict[str, Any]]

    def send_task(self, name: str, *args: Any, **kwargs: Any) -> None:
        self.ids.append(kwargs.get("task_id"))
        self.headers.append(dict(kwargs.get("headers") or {}))
        if self.fail:
            self.fail -= 1
            raise ConnectionResetError("Connection reset by peer")
        super().send_task(name, *args, **kwargs)


def flaky(
    started: list[Any], fail: int, conf: dict[str, Any] | None = None, **schedule: Any
) -> Flaky:
    default = {"job": {"task": "t.job", "schedule": IsDueOnly()}}
    s = Flaky(app=make_app(schedule or default, **(conf or {})))
    started.append(s)
    s.sent, s.ids, s.headers, s.fail = [], [], [], fail
    assert s.wait_for_leadership(5)
    return s


def tick_until(s: Flaky, done: Any, seconds: float = 10.0) -> None:
    """Tick as ``celery beat`` does until ``done()`` (the owed send waits its back-off)."""
    deadline = boottime() + seconds
    while not done():
        assert boottime() < deadline, "not done in time"
        s.tick()


def test_a_failed_send_is_owed_and_sent_again_under_the_same_task_id(
    shared: MemoryBackend, started: list[Any]
) -> None:
    s = flaky(started, fail=2)
    s.tick()  # the run is claimed; its send raises: owed, still pending in the store
    assert s.sent == [] and s._sender.ledger.owing == 1
    assert {p.entry_name for p in shared.beat.pending_runs(NS)} == {"job"}
    s.tick()
    assert len(s.ids) == 1, "sent again before its back-off"
    tick_until(s, lambda: s.sent)
    assert s.sent == ["t.job"] and len(s.ids) == 3  # two failures, one send
    assert len(set(s.ids)) == 1 and s.ids[0] is not None
    assert len({h["election_run"] for h in s.headers}) == 1  # one run, one key
    # each send after the first says it is one (a worker skips it while the first runs)
    assert [h.get(RESENT) for h in s.headers] == [None, 2, 3]
    assert shared.beat.pending_runs(NS) == []  # the tick marked it sent
    assert s._sender.ledger.owing == 0
    assert shared.beat.load_runs(NS)["job"].total_run_count == 1


def test_the_task_id_names_the_run(shared: MemoryBackend, started: list[Any]) -> None:
    s = flaky(started, fail=0)
    s.tick()
    assert s.sent == ["t.job"]
    state = shared.beat.load_runs(NS)["job"]
    assert s.ids == [run_task_id(NS, "job", state.last_run_us)]
    assert run_task_id(NS, "job", state.last_run_us) != run_task_id(
        NS, "job", state.last_run_us + 1
    )
    assert run_task_id(NS, "job", 1) != run_task_id("other", "job", 1)
    uuid.UUID(s.ids[0] or "")


def test_a_new_leader_sends_the_runs_a_dead_one_claimed_first(
    shared: MemoryBackend, started: list[Any]
) -> None:
    """The dead leader claimed two runs (pending) and sent neither: the next leader sends
    both at its promotion, under their task ids, before it claims anything; an entry
    whose run expired is marked, not sent."""
    from datetime import datetime, timezone

    past = datetime(2026, 1, 1, tzinfo=timezone.utc)
    seed(shared, "job", past)  # a run before: sent
    token = uuid.uuid4().hex
    dead = shared.elect(Bid(NS, token, "dead", 30.0)).lease
    assert dead is not None
    job = shared.beat.load_runs(NS)["job"]
    assert claim_run(shared.beat, NS, token, dead.term, "job", job, 5_000_000, pending=True).won
    assert claim_run(shared.beat, NS, token, dead.term, "new", None, 6_000_000, pending=True).won
    assert claim_run(shared.beat, NS, token, dead.term, "old", None, 7_000_000, pending=True).won
    assert shared.resign(NS, token, dead.term)
    s = flaky(
        started, fail=0,
        job={"task": "t.job", "schedule": IsDueOnly()},
        new={"task": "t.new", "schedule": IsDueOnly()},
        old={"task": "t.old", "schedule": IsDueOnly(), "options": {"expires": past}},
    )  # fmt: skip
    s.tick()
    recovered = dict(zip(s.sent, s.ids, strict=True))
    assert recovered == {
        "t.job": run_task_id(NS, "job", 5_000_000),
        "t.new": run_task_id(NS, "new", 6_000_000),
    }  # "old" expired (its expires has passed): marked, not sent
    keys = {h["election_run"] for h in s.headers}
    assert keys == {job.last_run_us, 0}  # each the key it was claimed with
    assert [h[RESENT] for h in s.headers] == [1, 1]  # the dead leader's may have gone out
    assert shared.beat.pending_runs(NS) == []
    s.tick()
    assert len(s.sent) == 2  # nothing claimed twice


def test_a_run_whose_confirm_changed_nothing_is_sent_again_by_the_same_term(
    shared: MemoryBackend, started: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A confirm that met a lock timeout and changed nothing (window 3 of issue 52): the
    run stays claimed in the store, the ledger forgot it. The leader's recheck of the store
    sends it again under its task id, then confirms it; at 50bbd93 only a failover did."""
    from celery_election.beat import sender

    monkeypatch.setattr(sender, "RECHECK_AGE", 0.0)  # here: the next settle's recheck
    monkeypatch.setattr(sender, "RECHECK_EVERY", 0.0)
    real = shared.runs.confirm
    calls: list[int] = []

    def first_changes_nothing(*args: Any, **kwargs: Any) -> int:
        calls.append(1)
        return 0 if len(calls) == 1 else real(*args, **kwargs)

    monkeypatch.setattr(shared.runs, "confirm", first_changes_nothing)
    s = flaky(started, fail=0)
    s.tick()  # claimed, sent, and the confirm changed nothing
    assert len(s.sent) == 1 and {p.entry_name for p in shared.beat.pending_runs(NS)} == {"job"}
    election = s._fence.election
    assert election is not None and election.elector is not None
    term = election.elector.term
    s.tick()  # the recheck: pending in the store, unknown to the ledger: sent again
    assert s.ids[1] == s.ids[0] and s.headers[1][RESENT] == 1
    assert shared.beat.pending_runs(NS) == []  # and confirmed
    assert election.elector.term == term  # by the same term: no failover needed


def test_the_recheck_leaves_an_owed_run_to_its_back_off(
    shared: MemoryBackend, started: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An owed run is pending in the store too: the recheck (here at every settle) does
    not send it again before its back-off, the ledger does after."""
    from celery_election.beat import sender

    monkeypatch.setattr(sender, "RECHECK_AGE", 0.0)
    monkeypatch.setattr(sender, "RECHECK_EVERY", 0.0)
    s = flaky(started, fail=1)
    s.tick()  # its send raised: owed
    s.tick()  # the recheck finds it pending
    assert len(s.ids) == 1, "sent again by the recheck, before its back-off"
    tick_until(s, lambda: s.sent)
    assert len(s.ids) == 2 and len(set(s.ids)) == 1


def test_a_run_the_broker_took_is_not_sent_again_when_its_leader_wins_a_new_term(
    shared: MemoryBackend, started: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sent, its confirm failed (kept for the next flush), and then this beat's term ended
    and it won the next (a lapse under load): the promotion sends what earlier terms left
    pending, but not a run this process already handed to the broker; the flush confirms it."""
    real, calls = shared.runs.confirm, []

    def first_fails(*args: Any, **kwargs: Any) -> int:
        calls.append(1)
        if len(calls) == 1:
            raise BackendUnavailableError("database is locked")
        return real(*args, **kwargs)

    monkeypatch.setattr(shared.runs, "confirm", first_fails)
    s = flaky(started, fail=0, conf={"election_resign_backoff": 0.01})  # back at once
    s.tick()  # claimed, sent; the confirm failed
    assert len(s.ids) == 1 and {p.entry_name for p in shared.beat.pending_runs(NS)} == {"job"}
    election = s._fence.election
    assert election is not None and election.elector is not None
    term = election.elector.term
    election.elector.resign()
    shared.clock.advance(1.0)  # past its back-off: it stands again, the only candidate
    assert s.wait_for_leadership(5) and election.elector.term != term
    s.tick()  # promoted in the new term
    assert s._fence.loaded_term == election.elector.term
    assert len(s.ids) == 1, "sent again at the promotion"
    assert shared.beat.pending_runs(NS) == []  # the flush confirmed it


@pytest.mark.parametrize("fail", [1])
def test_a_leader_that_stops_leading_drops_what_it_owes(
    shared: MemoryBackend, started: list[Any], fail: int
) -> None:
    """Owed sends are this term's: after it ends they are the next leader's (pending)."""
    s = flaky(started, fail=fail)
    s.tick()
    assert s._sender.ledger.owing == 1
    election = s._fence.election
    assert election is not None and election.elector is not None
    election.elector.resign()
    s._sender.settle(None, lambda: None, dict)
    assert s._sender.ledger.owing == 0
    assert {p.entry_name for p in shared.beat.pending_runs(NS)} == {"job"}


def test_a_beat_stopped_cleanly_marks_what_it_sent(
    shared: MemoryBackend, started: list[Any]
) -> None:
    """Sent but not yet marked when the beat stops: marked by its close, so the next
    leader has nothing to send again."""
    s = flaky(started, fail=0)
    entry = s.schedule["job"]
    s.reserve(entry)  # as Celery's tick: reserve, then send (the tick's end would mark)
    s.apply_async(entry, advance=False)
    assert s.sent == ["t.job"] and {p.entry_name for p in shared.beat.pending_runs(NS)} == {"job"}
    s.close()
    assert shared.beat.pending_runs(NS) == []


def test_a_run_refused_while_the_last_one_is_pending_is_not_sent(
    shared: MemoryBackend, started: list[Any]
) -> None:
    """A claim refused in a term that still leads (here: the entry's last run is still
    pending) is not sent: the fence at the send asks whether the claim won, not only
    whether its term leads."""
    s = flaky(started, fail=0)
    entry = s.schedule["job"]
    s.reserve(entry)  # run 1: claimed, pending; its send waits in Celery's ledger...
    assert s._ledger.pop("job", None) is not None  # ... and never comes
    s.reserve(entry)  # run 2: refused while run 1 is pending
    assert s.apply_async(entry, advance=False) is None  # Celery's tick sends it now
    assert s.sent == [] and {p.entry_name for p in shared.beat.pending_runs(NS)} == {"job"}


def test_expires_is_counted_on_the_database_clock(
    shared: MemoryBackend, started: list[Any]
) -> None:
    """A beat whose clock is an hour slow sends ``expires`` seconds from the database's
    now, not from its own: by its own clock the run was sent expired."""
    s = flaky(started, 0, job={"task": "t.job", "schedule": IsDueOnly(),
                               "options": {"expires": 300}})  # fmt: skip
    tick_until(s, lambda: s.sent)  # leading, its first run sent
    s._fence._offset_us = 3600 * 1_000_000  # as measured: the database an hour ahead
    send = s._sender.prepare(s.schedule["job"], None)
    assert send is not None
    when = send.options["expires"]
    db_now = time.time() + 3600
    assert isinstance(when, datetime) and when.tzinfo is not None
    assert db_now + 290 < when.timestamp() < db_now + 310
    assert s.schedule["job"].options["expires"] == 300  # the entry itself unchanged


def fence_clock(s: Flaky, monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The fence's clock, moved only by its sleeps between a claim's tries (their deadline)."""
    from celery_election.beat import fence as fence_module

    clock = [0.0]
    monkeypatch.setattr(fence_module, "boottime", lambda: clock[0])
    monkeypatch.setattr(s._fence, "sleep", lambda seconds: clock.__setitem__(0, clock[0] + seconds))
    return clock


def test_a_claim_the_database_keeps_failing_is_given_up_after_a_renew_interval(
    shared: MemoryBackend, started: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A claim is retried for one renew interval (on the fence's clock), then its run is
    not sent and the beat leads on, its store as it was. The entry is due again at once:
    it went back on Celery's heap at its next check, an hour away here (an hourly crontab
    then sent one run for two), and the next tick, the database back, sends it once."""
    s = flaky(started, fail=0)
    fence, clock, tries = s._fence, fence_clock(s, monkeypatch), []
    assert fence.election is not None
    store, renew = fence.election.store, fence.election.settings.config.renew_interval

    def down(*args: Any, **kwargs: Any) -> Any:
        tries.append(clock[0])
        assert len(tries) < 100, "still retried long past its renew interval"
        raise BackendUnavailableError("the database is down")

    monkeypatch.setattr(store, "claim_runs", down)
    s.tick()
    assert s.sent == [] and len(tries) > 2 and renew - 0.5 <= tries[-1] - tries[0] <= renew
    assert fence.leadership() is not None and shared.beat.pending_runs(NS) == []
    monkeypatch.undo()
    s.tick()
    assert s.sent == ["t.job"] and shared.beat.load_runs(NS)["job"].total_run_count == 1


def test_a_claim_is_not_retried_once_its_term_no_longer_leads(
    shared: MemoryBackend, started: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The retries serve a leader whose database blinked; a term that ended meanwhile
    has nothing left to claim (the next leader claims), so the first failure is the last."""
    s = flaky(started, fail=0)
    election, tries = s._fence.election, []
    assert election is not None
    s._fence.sleep = lambda seconds: None

    def demoted(*args: Any, **kwargs: Any) -> Any:
        tries.append(1)
        monkeypatch.setattr(election, "leadership", lambda: None)
        raise BackendUnavailableError("the database is down")

    monkeypatch.setattr(election.store, "claim_runs", demoted)
    s.tick()
    assert s.sent == [] and tries == [1]


def test_an_hourly_run_due_while_the_database_is_down_goes_out_when_it_is_back(
    shared: MemoryBackend, started: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Celery's crontab on a clock the test moves (5 s a step), the database down from
    12:00:00 to 12:00:10, past the claim's retries: the 12:00 run goes out at 12:00:10.
    Before, it waited for its entry's next check and went out with 13:00's, one for two."""
    now = [datetime(2026, 1, 1, 11, 59, 55, tzinfo=timezone.utc)]
    back = datetime(2026, 1, 1, 12, 0, 10, tzinfo=timezone.utc)
    hourly = crontab(minute=0, nowfun=lambda: now[0])
    s, sent_at = flaky(started, 0, job={"task": "t.job", "schedule": hourly}), []
    record = type(s).send_task

    def send_task(self: Any, *args: Any, **kwargs: Any) -> None:
        sent_at.append(now[0])
        record(self, *args, **kwargs)

    monkeypatch.setattr(type(s), "send_task", send_task)
    fence_clock(s, monkeypatch)  # the claim's retries move it, not the crontab's
    assert s._fence.election is not None
    store = s._fence.election.store
    real = store.claim_runs

    def cut(*args: Any, **kwargs: Any) -> Any:
        if now[0] < back:
            raise BackendUnavailableError("the database is down")
        return real(*args, **kwargs)

    monkeypatch.setattr(store, "claim_runs", cut)
    while now[0] < datetime(2026, 1, 1, 13, 0, 5, tzinfo=timezone.utc):
        s.tick()
        now[0] += timedelta(seconds=5)
    assert [t.strftime("%H:%M:%S") for t in sent_at] == ["12:00:10", "13:00:00"]
