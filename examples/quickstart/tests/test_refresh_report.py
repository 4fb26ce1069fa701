"""refresh_report is a leader task: the kit makes this process the leader, or not."""

import sqlalchemy as sa
from celery import states
from proj.tasks import add, engine, refresh_report, reports


def written_terms() -> list[int]:
    with engine().connect() as conn:
        return list(conn.scalars(sa.select(reports.c.term).order_by(reports.c.id)))


def test_the_leader_refreshes_the_report_under_its_term(election):
    assert refresh_report.apply().get() == election.term == 1
    assert written_terms() == [1]


def test_a_follower_never_writes_the_report(election_follower):
    # refresh_report requeues on a follower; eagerly, Celery retries it at once in this
    # same follower process until max_retries: the body never runs
    assert refresh_report.apply().state != states.SUCCESS
    assert written_terms() == []


def test_task_always_eager(election, celery_app, monkeypatch):
    monkeypatch.setitem(celery_app.conf, "task_always_eager", True)
    assert refresh_report.delay().get() == 1
    election.follow()
    assert add.delay(2, 3).get() == 5  # a plain task runs on any worker
    assert written_terms() == [1]


def test_each_snapshot_carries_the_term_of_its_leader(election):
    refresh_report.apply().get()
    new_term = election.failover()  # the lease moves on while this process lives
    assert new_term == 2
    assert refresh_report.apply().get() == 2
    assert written_terms() == [1, 2]  # a reader keeps the rows of the greatest term


def test_a_worker_runs_it_only_while_it_leads(election, election_worker):
    assert refresh_report.delay().get(timeout=10, interval=0.01) == 1
    election.follow()
    pending = refresh_report.delay()  # requeued every second while this worker follows
    assert add.delay(2, 3).get(timeout=10, interval=0.01) == 5
    assert written_terms() == [1]
    assert election.lead() == 2
    assert pending.get(timeout=10, interval=0.01) == 2
    assert written_terms() == [1, 2]
