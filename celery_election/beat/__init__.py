"""Leader-only beat: run ``celery beat -S celery_election.beat:LeaderScheduler`` everywhere.

The Celery side of the election for beat (docs/design.md, Layers)::

    scheduler.py  LeaderSchedulerMixin and LeaderScheduler: leadership gates the tick,
                  the shared run state is adopted at promotion, each send is fenced
    fence.py      BeatFence: what the scheduler asks of the election database
                  (leadership, promotion, claims, the database clock); Claim
    policy.py     RunPolicy: what a schedule kept beside Celery's adds (default: none)
    election.py   BeatElection: the elector a beat runs (or its worker's, under -B);
                  BeatTerm (term, token)
    rows.py       DjangoRowsMixin: model rows (django-celery-beat) written by the leader
    ops.py        the operable schedule served beside the static one: dynamic entries,
                  pauses, run-now requests, catch-up and overlap policies, run history
                  (ScheduleOps, LeaderScheduler's RunPolicy)
    spec.py       an entry's schedule as stored data (to_spec/from_spec) and its policies

``LeaderSchedulerMixin`` gives the same to another scheduler class, e.g. django-celery-beat's::

    class LeaderDatabaseScheduler(LeaderSchedulerMixin, DatabaseScheduler):
        pass
"""

from __future__ import annotations

from .scheduler import LeaderScheduler, LeaderSchedulerMixin

__all__ = ["LeaderScheduler", "LeaderSchedulerMixin"]
