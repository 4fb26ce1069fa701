"""LeaderRouter: a leader task goes to the leader queue however it is sent."""

from __future__ import annotations

import uuid
from typing import Any

from celery import Celery

from celery_election import init_app
from celery_election.integration.tasks import LeaderRouter, LeaderTask

from ..support.apps import new_app


def _queue_for(app: Celery, name: str, **options: Any) -> str:
    """Where Celery's router sends ``name`` (what send_task and `celery call` use)."""
    routed = app.amqp.router.route(options, name, (), {})
    return str(routed["queue"].name)


def test_leader_tasks_sent_by_name_go_to_the_leader_queue() -> None:
    app = init_app(new_app(election_namespace="routed"))

    @app.task(base=LeaderTask, shared=False, name="proj.nightly")
    def nightly() -> None:
        pass

    @app.task(shared=False, name="proj.plain")
    def plain() -> None:
        pass

    assert _queue_for(app, "proj.nightly") == "election-leader.routed"
    assert _queue_for(app, "proj.plain") == "celery"  # untouched
    assert _queue_for(app, "proj.nightly", queue="elsewhere") == "elsewhere"  # the call wins
    # send_task by name publishes there too (no apply_async of ours involved)
    with app.connection_for_write() as conn:
        result = app.send_task("proj.nightly", connection=conn)
        assert result.id


def test_the_apps_own_routes_win_and_are_kept() -> None:
    app = new_app(election_namespace="own", task_routes={"proj.nightly": {"queue": "mine"}})
    init_app(app)
    init_app(app)  # idempotent: one router

    @app.task(base=LeaderTask, shared=False, name="proj.nightly")
    def nightly() -> None:
        pass

    @app.task(base=LeaderTask, shared=False, name="proj.other")
    def other() -> None:
        pass

    assert _queue_for(app, "proj.nightly") == "mine"
    assert _queue_for(app, "proj.other") == "election-leader.own"
    routers = [r for r in app.conf.task_routes if isinstance(r, LeaderRouter)]
    assert len(routers) == 1


def test_the_router_arrives_with_a_configuration_loaded_after_init_app() -> None:
    app = Celery(f"t{uuid.uuid4().hex[:8]}", set_as_current=False)
    init_app(app)  # before config_from_object: must not load the configuration early
    assert not app.configured
    app.config_from_object({"broker_url": "memory://", "election_namespace": "late"})

    @app.task(base=LeaderTask, shared=False, name="proj.late")
    def late() -> None:
        pass

    assert _queue_for(app, "proj.late") == "election-leader.late"
