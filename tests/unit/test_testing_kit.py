"""The test kit (celery_election.testing) and its pytest plugin, as a user writes tests.

The plugin's fixtures (``election``, ``election_follower``, ``election_protocol``,
``election_worker``) come from the ``celery_election`` pytest11 entry point; Celery's own
fixtures (``celery_app``, ``celery_worker``) from ``celery.contrib.pytest``, loaded below
(pytest-celery is not installed here; where it is, its ``celery_worker`` needs Docker and
``election_worker`` is the in-process one).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery, states
from celery.contrib.testing.app import setup_default_app

from celery_election import leader_task
from celery_election.election import shared_state
from celery_election.election.shared_state import ENV_VAR
from celery_election.errors import ElectionError, NotLeaderError
from celery_election.integration.tasks import current_term
from celery_election.testing import ElectedLeadership, Leadership, leader_queues

from ..support.postrun import Postrun

pytest_plugins = ("celery.contrib.pytest",)

REPO = Path(__file__).resolve().parents[2]

# -- the tasks under test: declared as users declare them (shared, module level) -----------

RUNS: list[tuple[str, int | None]] = []


@leader_task(bind=True, on_follower="skip")
def kit_skip(self: Any) -> int | None:
    RUNS.append(("skip", self.election_term))
    return self.election_term


@leader_task(bind=True, on_follower="raise")
def kit_raise(self: Any) -> int | None:
    RUNS.append(("raise", self.election_term))
    return self.election_term


@leader_task(bind=True, requeue_delay=0.05)  # on_follower="requeue", the default
def kit_requeue(self: Any) -> int | None:
    RUNS.append(("requeue", self.election_term))
    return self.election_term


@pytest.fixture(autouse=True)
def _runs() -> Iterator[None]:
    RUNS.clear()
    yield
    RUNS.clear()


@pytest.fixture
def eager_app() -> Iterator[Celery]:
    """An app with task_always_eager, current for the test (the previous one after)."""
    app = Celery("kit-eager", broker="memory://", set_as_current=False)
    app.conf.update(task_always_eager=True)
    with setup_default_app(app):
        app.set_current()
        yield app
    app.close()


# -- eager: apply() and task_always_eager ---------------------------------------------------


def test_a_leader_task_runs_as_leader_with_apply(election: Leadership) -> None:
    assert election.term == 1
    result = kit_skip.apply()
    assert result.state == states.SUCCESS
    assert result.get() == 1 == election.term
    assert current_term() == 1
    assert RUNS == [("skip", 1)]


def test_a_leader_task_runs_as_leader_with_task_always_eager(
    election: Leadership, eager_app: Celery
) -> None:
    assert kit_raise.delay().get() == election.term == 1
    assert kit_requeue.delay().get() == 1
    assert RUNS == [("raise", 1), ("requeue", 1)]


def test_without_the_kit_an_eager_leader_task_is_a_follower(
    eager_app: Celery, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the kit is for: with no record installed, the process is a follower."""
    monkeypatch.delenv(ENV_VAR, raising=False)
    monkeypatch.setattr(shared_state, "_current", None)
    assert current_term() is None
    assert kit_skip.delay().state == states.IGNORED
    assert RUNS == []


def test_a_follower_skips(election_follower: Leadership) -> None:
    assert election_follower.term is None
    assert not election_follower.leading
    assert kit_skip.apply().state == states.IGNORED
    assert RUNS == []


def test_a_follower_raises_not_leader(election_follower: Leadership) -> None:
    result = kit_raise.apply()
    assert result.state == states.FAILURE
    with pytest.raises(NotLeaderError):
        result.get()
    assert RUNS == []


def test_a_follower_requeue_never_runs_the_body_eagerly(election_follower: Leadership) -> None:
    # Eagerly, Celery re-runs the retry at once in this same (follower) process, until
    # max_retries: the body never runs (in a worker it is requeued; see below).
    assert kit_requeue.apply().state != states.SUCCESS
    assert RUNS == []


def test_failover_gives_a_greater_term_and_fences_the_old_one(election: Leadership) -> None:
    """A task started under term 1 keeps it through a failover; its write is refused."""
    store: dict[str, Any] = {"term": 0, "value": None}

    def write(term: int | None, value: str) -> bool:
        assert term is not None
        if term < store["term"]:
            return False  # fenced: a newer leader has written
        store.update(term=term, value=value)
        return True

    paused, resume = threading.Event(), threading.Event()
    outcome: dict[str, Any] = {}

    app = Celery("kit-fencing", set_as_current=False)

    @leader_task(bind=True, on_follower="skip", shared=False, app=app)
    def slow(self: Any, value: str) -> bool:
        term = self.election_term  # the fencing token, read at the start
        if value == "old":
            paused.set()
            resume.wait(5)
            outcome["current_term_after"] = current_term()
        outcome[value] = term
        return write(term, value)

    old = threading.Thread(target=lambda: outcome.setdefault("r", slow.apply(("old",)).get()))
    old.start()
    assert paused.wait(5)
    assert election.failover() == 2  # the old leader's task is still running
    assert election.term == election.latest_term == 2
    assert slow.apply(("new",)).get() is True  # the new leader's write
    resume.set()
    old.join(5)
    assert outcome["old"] == 1 and outcome["new"] == 2
    assert outcome["current_term_after"] == 2  # a live check sees the move
    assert outcome["r"] is False  # the old term's write is refused
    assert store == {"term": 2, "value": "new"}
    app.close()


def test_failover_elsewhere_makes_this_process_follow(election: Leadership) -> None:
    assert election.failover(elsewhere=True) == 2
    assert election.term is None and election.latest_term == 2
    assert kit_skip.apply().state == states.IGNORED
    assert election.lead() == 3
    assert kit_skip.apply().get() == 3
    assert election.history == [(1, "this"), (2, "other"), (3, "this")]


def test_expire_ends_trust_and_lead_takes_a_new_term(election: Leadership) -> None:
    election.expire()
    reading = election.record.read()
    assert reading.leader and reading.term == 1 and not reading.trusted()
    assert election.term is None
    assert kit_skip.apply().state == states.IGNORED
    assert election.lead() == 2


def test_explicit_terms_only_grow(election: Leadership) -> None:
    assert election.lead() == 1  # already leading: same term
    assert election.lead(1) == 1
    assert election.lead(41) == 41
    assert kit_skip.apply().get() == 41
    with pytest.raises(ValueError, match="only grow"):
        election.lead(7)
    with pytest.raises(ValueError, match="positive int"):
        election.lead(True)
    assert election.failover() == 42


def test_as_leader_and_as_follower_restore(election: Leadership) -> None:
    with election.as_follower():
        assert kit_skip.apply().state == states.IGNORED
    assert election.term == 2  # leads again, under a new term
    election.follow()
    with election.as_leader(10) as term:
        assert term == 10 and kit_skip.apply().get() == 10
    assert election.term is None


def test_the_controller_restores_the_previous_record(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)
    monkeypatch.setattr(shared_state, "_current", None)
    with Leadership() as outer:
        outer.lead(5)
        outer_path = os.environ[ENV_VAR]
        with Leadership() as inner:
            assert inner.term is None  # a fresh record: not leader
            assert current_term() is None
            inner.lead()
            assert current_term() == 1
            inner_path = inner.record.path
        assert shared_state.current() is outer.record
        assert os.environ[ENV_VAR] == outer_path
        assert current_term() == 5
        assert not os.path.exists(inner_path)
    assert shared_state.in_use() is None
    assert ENV_VAR not in os.environ
    assert not os.path.exists(outer_path)


def test_a_controller_must_be_installed() -> None:
    leadership = Leadership()
    with pytest.raises(ElectionError, match="not installed"):
        leadership.lead()
    assert leadership.term is None
    leadership.close()  # harmless


@pytest.mark.slow
def test_spawned_children_find_the_record(election: Leadership) -> None:
    """The record's path is in the environment: a spawned pool child attaches to it."""
    code = "from celery_election.integration.tasks import current_term; print(current_term())"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "1"


# -- the real protocol: Electors on a MemoryBackend with a FakeClock ------------------------


def test_protocol_leader_runs_the_task_with_the_backend_term(
    election_protocol: ElectedLeadership,
) -> None:
    e = election_protocol
    lease = e.backend.current(e.namespace)
    assert lease is not None and e.elector is not None
    assert lease.leader_id == e.elector.candidate_id
    assert e.term == lease.term == e.latest_term == e.elector.term
    assert kit_skip.apply().get() == lease.term
    with pytest.raises(ValueError, match="cannot choose"):
        e.lead(5)


def test_protocol_failover_expires_the_lease_while_the_leader_lives(
    election_protocol: ElectedLeadership,
) -> None:
    e = election_protocol
    first = e.term
    assert first is not None
    second = e.failover()  # fake time jumps past ttl: trust ends, renewal fails, re-elected
    assert second > first and e.term == second
    assert kit_skip.apply().get() == second
    third = e.failover(elsewhere=True)  # this worker resigns while running; the rival wins
    assert third > second and e.term is None
    assert e.rival is not None and e.rival.term == third
    assert e.elector is not None and e.elector.state.value == "follower"  # alive
    assert kit_skip.apply().state == states.IGNORED
    fourth = e.failover()  # the rival resigns; this worker wins
    assert fourth > third and kit_skip.apply().get() == fourth


def test_protocol_follow_and_lead(election_protocol: ElectedLeadership) -> None:
    e = election_protocol
    first = e.term
    assert first is not None
    e.follow()
    assert e.term is None and e.rival is not None and e.rival.is_leader
    assert kit_raise.apply().state == states.FAILURE
    again = e.lead()
    assert again > first and kit_raise.apply().get() == again


def test_protocol_controller_stops_its_threads() -> None:
    before = set(threading.enumerate())
    with ElectedLeadership() as e:
        e.lead()
        e.failover(elsewhere=True)
        assert len(set(threading.enumerate()) - before) >= 4
    assert set(threading.enumerate()) - before == set()


# -- a real in-process worker ---------------------------------------------------------------


@pytest.fixture
def celery_config() -> dict[str, Any]:
    # memory broker polled every 10 ms (the default second makes each round trip ~1 s)
    return {"broker_transport_options": {"polling_interval": 0.01}}


class TestCeleryWorkerFixture:
    """Celery's classic ``celery_worker``: it consumes only the default queue, so the
    leader queue is added by overriding ``celery_worker_parameters``."""

    @pytest.fixture
    def celery_worker_parameters(self, celery_app: Celery) -> dict[str, Any]:
        return {"queues": [celery_app.conf.task_default_queue, *leader_queues(celery_app)]}

    def test_runs_as_leader_and_skips_as_follower(
        self, election: Leadership, celery_app: Celery, celery_worker: Any, postrun: Postrun
    ) -> None:
        """The record is this process's, and the solo pool runs tasks in this process."""
        assert kit_skip.delay().get(timeout=10, interval=0.01) == 1
        election.follow()
        skipped = kit_skip.delay()
        assert postrun.wait(skipped.id) == states.IGNORED
        failed = kit_raise.delay()
        with pytest.raises(NotLeaderError):
            failed.get(timeout=10, interval=0.01)
        assert RUNS == [("skip", 1)]


def test_election_worker_requeues_until_this_process_leads(
    election: Leadership, election_worker: Any, celery_app: Celery, postrun: Postrun
) -> None:
    """The plugin's worker: a follower requeues the task; once leading, it runs it."""
    election.follow()
    result = kit_requeue.delay()
    assert postrun.wait(result.id) == states.IGNORED  # requeued (acked, sent again)
    assert RUNS == []
    term = election.lead()
    assert result.get(timeout=10, interval=0.01) == term == 2
    assert RUNS == [("requeue", 2)]


@pytest.mark.slow
def test_the_plugin_is_registered_by_its_entry_point(tmp_path: Path) -> None:
    """Any pytest run has the fixtures; ``-p no:celery_election`` removes them, and a run
    that uses none of them is unaffected."""
    (tmp_path / "test_user.py").write_text(
        textwrap.dedent(
            """
            import os
            from celery_election.election import shared_state

            def test_untouched():
                assert shared_state.in_use() is None
                assert "CELERY_ELECTION_SHM" not in os.environ

            def test_fixture(election):
                assert election.term == 1
            """
        )
    )
    env = {k: v for k, v in os.environ.items() if k != ENV_VAR}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args, "test_user.py"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )

    ok = run()
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "2 passed" in ok.stdout
    off = run("-p", "no:celery_election")
    assert off.returncode == 1, off.stdout + off.stderr
    assert "fixture 'election' not found" in off.stdout
    assert "1 passed" in off.stdout


@pytest.mark.slow
def test_the_quickstart_tests_pass() -> None:
    """examples/quickstart/tests use the kit as a project would (run in their own pytest)."""
    env = {k: v for k, v in os.environ.items() if k != ENV_VAR}
    suite = "examples/quickstart/tests"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", suite],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "8 passed" in done.stdout


def test_a_nested_eager_leader_task_leaves_the_outer_term_alone() -> None:
    """Regression: the term ContextVar was never reset after a run, so an eager leader
    task inside another changed the outer task's ``self.election_term``."""
    from celery import Celery

    from celery_election import leader_task
    from celery_election.testing import Leadership

    app = Celery("nested", broker="memory://", set_as_current=False)
    seen: list[tuple[str, int | None]] = []

    @leader_task(app=app, bind=True, shared=False)
    def inner(self: Any) -> None:
        seen.append(("inner", self.election_term))

    @leader_task(app=app, bind=True, shared=False)
    def outer(self: Any, election: Any) -> None:
        seen.append(("outer", self.election_term))
        election.failover()
        inner.apply()
        seen.append(("outer", self.election_term))

    with Leadership() as election:
        election.lead(1)
        outer.apply(args=(election,))
    assert seen == [("outer", 1), ("inner", 2), ("outer", 1)]
