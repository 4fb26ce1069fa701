"""Leader-only beat: run ``celery beat -S celery_election.beat:LeaderScheduler`` everywhere.

The Celery side of the election for beat (docs/design.md, Layers)::

    scheduler.py  LeaderSchedulerMixin, the one class over Celery's scheduler: the
                  send path due -> reserve -> claim -> send -> settle, calling the
                  collaborators below with values
    persistent.py LeaderScheduler: the mixin over PersistentScheduler, with the
                  operable schedule beside the static one
    runs.py       the values of the send path: Run (its stages), Claim
    fence.py      BeatFence: what the scheduler asks of the election database
                  (leadership, promotion, claims, the database clock)
    matching.py   Matching: entries matched with the shared run state, and given it
    guards.py     the runaway guard, and when the schedule need not be compared
    sender.py     Sender: the fence at each send, the publish, what a send leaves
    publish.py    the burst's router and the publisher processes
    policy.py     RunPolicy: what a schedule kept beside Celery's adds (default: none)
    ops.py        ScheduleOps, LeaderScheduler's RunPolicy: the operable schedule
                  served beside the static one (dynamic entries, pauses, run-now
                  requests, policies); catchup.py its rules, history.py its writer
    election.py   BeatElection: the elector a beat runs (or its worker's, under -B);
                  BeatTerm (term, token)
    rows.py       django-celery-beat's model rows, written by the leader only

``LeaderSchedulerMixin`` gives the same to another scheduler class, e.g. django-celery-beat's::

    class LeaderDatabaseScheduler(LeaderSchedulerMixin, DatabaseScheduler):
        pass
"""

from __future__ import annotations

from .persistent import LeaderScheduler
from .scheduler import LeaderSchedulerMixin

__all__ = ["LeaderScheduler", "LeaderSchedulerMixin"]
