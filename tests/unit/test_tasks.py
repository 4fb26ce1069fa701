"""LeaderTask and leader_task: options, the leader queue, the term, followers' modes."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from celery import Celery, states
from celery.exceptions import Ignore
from celery.result import EagerResult

from celery_election import init_app, leader_task
from celery_election.core.clock import boottime
from celery_election.election import shared_state
from celery_election.election.shared_state import ENV_VAR, SharedLeadership
from celery_election.errors import ConfigurationError, NotLeaderError
from celery_election.integration.tasks import LeaderTask, current_term

from ..support.apps import new_app


@pytest.mark.parametrize("mode", ["ignore", "Skip", None, 1])
def test_leader_task_bad_on_follower_is_refused_at_decoration(mode: object) -> None:
    with pytest.raises(ConfigurationError) as info:
        leader_task(on_follower=mode)
    assert "on_follower" in str(info.value)
    assert repr(mode) in str(info.value)


def test_base_form_bad_on_follower_is_refused_at_declaration() -> None:
    """@app.task(base=LeaderTask, on_follower=...) is public too: a typo must not wait
    for a follower to run the task (and fail it) to show up."""
    app = new_app()
    app.finalize(auto=True)  # a finalized app builds the task class at decoration
    with pytest.raises(ConfigurationError):
        # shared=False: a shared task's constructor is kept for every later app
        @app.task(base=LeaderTask, shared=False, on_follower="requeu")
        def typo() -> None:
            pass


def test_leader_task_rejects_positional_options() -> None:
    with pytest.raises(TypeError):
        leader_task("name")


def test_bare_leader_task_uses_the_leader_queue_of_the_namespace() -> None:
    app = init_app(new_app(election_namespace="bare-ns"))

    @leader_task
    def bare_leader_noop() -> None:
        pass

    task = app.tasks[bare_leader_noop.name]
    assert isinstance(task, LeaderTask)
    assert task.on_follower == "requeue"  # the default: never lost
    assert task.leader_queue == "election-leader.bare-ns"
    assert bare_leader_noop.leader_queue == "election-leader.bare-ns"


# Celery 5.7 warns that the ``queue`` task attribute is deprecated (no effect in 6.0).
@pytest.mark.filterwarnings("ignore::celery.exceptions.CDeprecationWarning")
def test_leader_task_with_options() -> None:
    app = init_app(new_app(election_namespace="opt-ns"))

    @leader_task(
        app=app, shared=False, on_follower="raise", name="unit.with_options", requeue_delay=2.5
    )
    def with_options() -> None:
        pass

    @leader_task(app=app, shared=False, queue="explicit", name="unit.explicit_queue")
    def explicit_queue() -> None:
        pass

    task = app.tasks["unit.with_options"]
    assert isinstance(task, LeaderTask)
    assert (task.on_follower, task.requeue_delay) == ("raise", 2.5)
    assert task.leader_queue == "election-leader.opt-ns"
    assert app.tasks["unit.explicit_queue"].leader_queue == "explicit"


def test_shared_leader_task_with_options_and_leader_queue_setting() -> None:
    app = init_app(new_app(election_namespace="ns2", election_leader_queue="only-leaders"))

    @leader_task(on_follower="requeue")
    def shared_with_options() -> None:
        pass

    task = app.tasks[shared_with_options.name]
    assert isinstance(task, LeaderTask)
    assert task.on_follower == "requeue"
    assert task.leader_queue == "only-leaders"


@pytest.mark.filterwarnings("error::celery.exceptions.CDeprecationWarning")
def test_default_leader_queue_is_not_a_deprecated_task_attribute() -> None:
    """The leader queue comes from LeaderTask, not from a ``queue`` attribute on each task
    class (which Celery 5.7 deprecates): declaring and binding one must not warn."""
    app = init_app(new_app(election_namespace="nowarn"))

    @leader_task(app=app, shared=False, name="unit.no_warning")
    def no_warning() -> None:
        pass

    assert app.tasks["unit.no_warning"].leader_queue == "election-leader.nowarn"
    assert getattr(app.tasks["unit.no_warning"], "queue", None) is None  # no task attribute


def test_base_form_registers_a_leader_task(app: Celery) -> None:
    @app.task(base=LeaderTask, shared=False, on_follower="raise", name="unit.base_form")
    def base_form() -> None:
        pass

    task = app.tasks["unit.base_form"]
    assert isinstance(task, LeaderTask)
    assert task.leader_queue == "election-leader.unit"
    assert task.on_follower == "raise"


def test_leader_queue_reaches_the_message(app: Celery) -> None:
    """apply_async routes a leader task to the leader queue (memory broker, in process)."""

    @leader_task(app=app, shared=False, name="unit.routed")
    def routed() -> None:
        pass

    seen: list[dict[str, Any]] = []

    def before_publish(sender: str, routing_key: str, **kwargs: Any) -> None:
        seen.append({"task": sender, "routing_key": routing_key})

    from celery.signals import before_task_publish

    before_task_publish.connect(before_publish, weak=False)
    try:
        routed.apply_async()
    finally:
        before_task_publish.disconnect(before_publish)
    assert seen == [{"task": "unit.routed", "routing_key": "election-leader.unit"}]


def test_current_term_is_none_without_a_record(clean_env: None) -> None:
    assert shared_state.current() is None
    assert current_term() is None


def test_current_term_is_none_with_a_stale_path(
    clean_env: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "gone"))
    assert current_term() is None


def _make_tasks(app: Celery) -> dict[str, Any]:
    """One bound leader task per mode; each records its runs and returns its term."""
    runs: list[tuple[str, int | None, int | None]] = []
    tasks: dict[str, Any] = {"runs": runs}
    for mode in ("skip", "requeue", "raise"):

        def body(self: LeaderTask, _mode: str = mode) -> int | None:
            runs.append((_mode, self.election_term, current_term()))
            return self.election_term

        tasks[mode] = leader_task(
            app=app,
            shared=False,
            bind=True,
            on_follower=mode,
            name=f"unit.mode_{mode}",
            requeue_delay=0.01,
        )(body)
    return tasks


def test_leader_runs_the_body_with_its_term(app: Celery, record: SharedLeadership) -> None:
    tasks = _make_tasks(app)
    record.write(4242, boottime() + 10)
    for mode in ("skip", "requeue", "raise"):
        result = tasks[mode].apply()
        assert isinstance(result, EagerResult)
        assert result.state == states.SUCCESS, result.traceback
        assert result.result == 4242
    assert tasks["runs"] == [(m, 4242, 4242) for m in ("skip", "requeue", "raise")]


def test_term_changes_are_seen_by_the_next_run(app: Celery, record: SharedLeadership) -> None:
    tasks = _make_tasks(app)
    record.write(1, boottime() + 10)
    assert tasks["skip"].apply().result == 1
    record.write(2, boottime() + 10)
    assert tasks["skip"].apply().result == 2


def _follower_cases() -> list[Callable[[SharedLeadership], None]]:
    return [
        lambda rec: rec.write(None, None),  # the record says: not leader
        lambda rec: rec.write(7, boottime() - 0.001),  # leader, but trust has run out
        lambda rec: None,  # a fresh record: not leader
    ]


FOLLOWER_IDS = ["not-leader", "trust-expired", "fresh-record"]


@pytest.mark.parametrize("make_follower", _follower_cases(), ids=FOLLOWER_IDS)
def test_follower_skip_is_ignored(
    app: Celery, record: SharedLeadership, make_follower: Callable[[SharedLeadership], None]
) -> None:
    tasks = _make_tasks(app)
    make_follower(record)
    assert current_term() is None
    result = tasks["skip"].apply()
    # Celery reports Ignore raised by before_start as the IGNORED state.
    assert result.state == states.IGNORED
    assert tasks["runs"] == []


@pytest.mark.parametrize("make_follower", _follower_cases(), ids=FOLLOWER_IDS)
def test_follower_raise_fails_with_not_leader(
    app: Celery, record: SharedLeadership, make_follower: Callable[[SharedLeadership], None]
) -> None:
    tasks = _make_tasks(app)
    make_follower(record)
    result = tasks["raise"].apply()
    assert result.state == states.FAILURE
    assert isinstance(result.result, NotLeaderError)
    assert "unit.mode_raise" in str(result.result)
    with pytest.raises(NotLeaderError):
        result.get()
    with pytest.raises(NotLeaderError):
        tasks["raise"].apply(throw=True).get()
    assert tasks["runs"] == []


def test_follower_requeue_in_eager_mode(app: Celery, record: SharedLeadership) -> None:
    """In eager mode (apply(), task_always_eager) Celery runs a retry again at once: apply()
    re-applies the retry signature (countdown ignored) and returns the last attempt's
    result. So a follower never runs the body, and apply() must come back (no endless
    recursion). Observed with celery 5.7 and the current library: after max_retries (3)
    eager re-runs the result is FAILURE with MaxRetriesExceededError; the worker-side
    contract (never lost, never spinning) is tested in the next test."""
    tasks = _make_tasks(app)
    record.write(None, None)
    result = tasks["requeue"].apply()
    assert isinstance(result, EagerResult)
    assert result.state in {states.RETRY, states.FAILURE, states.IGNORED}
    assert result.state != states.SUCCESS
    assert tasks["runs"] == []


@pytest.mark.parametrize("retries", [0, 1, 3, 10, 1000])
def test_follower_requeue_in_a_worker_retries_forever(
    app: Celery, record: SharedLeadership, retries: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As a worker runs it (not eager): each requeue publishes the same request again to
    the leader queue with countdown requeue_delay and acks this copy (Ignore), however
    often it was requeued before: 'never lost', and the retry count is left alone."""
    from celery.canvas import Signature

    sent: list[Signature] = []
    monkeypatch.setattr(Signature, "apply_async", lambda sig, *a, **kw: sent.append(sig))
    tasks = _make_tasks(app)
    task = tasks["requeue"]
    record.write(None, None)
    task_id = uuid.uuid4().hex
    task.push_request(
        id=task_id,
        args=(),
        kwargs={},
        retries=retries,
        is_eager=False,
        called_directly=False,
        delivery_info={"routing_key": "election-leader.unit"},
    )
    try:
        with pytest.raises(Ignore):
            task.before_start(task_id, (), {})
    finally:
        task.pop_request()
    assert len(sent) == 1
    again = sent[0]
    assert again.options["queue"] == "election-leader.unit"
    assert again.options["countdown"] == pytest.approx(0.01)
    assert again.options["task_id"] == task_id  # the same request, not a new task
    assert again.options.get("retries", retries) == retries  # its retry budget untouched
    assert tasks["runs"] == []


def test_requeue_leaves_the_tasks_own_retry_limits_alone(
    app: Celery, record: SharedLeadership
) -> None:
    """A requeue on a follower must not change how the task retries its own errors later
    (Celery keeps retry(max_retries=...) on the task object as override_max_retries, which
    autoretry_for then uses for every later run in that process)."""
    calls: list[int] = []

    @leader_task(
        app=app,
        shared=False,
        bind=True,
        name="unit.autoretry",
        on_follower="requeue",
        autoretry_for=(ValueError,),
        max_retries=2,
        default_retry_delay=0,
    )
    def flaky(self: LeaderTask) -> None:
        calls.append(self.request.retries)
        raise ValueError("boom")

    task = app.tasks["unit.autoretry"]
    record.write(None, None)  # a follower requeues one message ...
    task.push_request(id="r", args=(), kwargs={}, retries=0, is_eager=False, called_directly=False)
    try:
        with pytest.raises(Ignore):  # republished to the leader queue, this copy acked
            task.before_start("r", (), {})
    finally:
        task.pop_request()
    record.write(1, boottime() + 10)  # ... then leads: its own retries stop at max_retries
    task.push_request(id="s", args=(), kwargs={}, retries=2, is_eager=False, called_directly=False)
    try:
        with pytest.raises(ValueError):
            task.run()
    finally:
        task.pop_request()
    assert calls == [2]


def test_leader_task_sets_no_term_for_a_follower(app: Celery, record: SharedLeadership) -> None:
    tasks = _make_tasks(app)
    record.write(3, boottime() + 10)
    task = tasks["skip"]
    task.push_request(id="x", args=(), kwargs={})
    try:
        task.before_start("x", (), {})
        assert task.election_term == 3
        record.write(None, None)  # the next run, on a follower, runs under no term
        with pytest.raises(Ignore):
            task.before_start("x", (), {})
        assert task.election_term is None
    finally:
        task.pop_request()
