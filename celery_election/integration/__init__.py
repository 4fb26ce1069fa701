"""The worker side of Celery: ``init_app``, the bootstep, leader tasks, remote control.

``app`` (``init_app``: options, bootstep, router, signals), ``bootstep`` (one Elector per
worker, the shared record, the leader queue), ``tasks`` (``@leader_task``,
``LeaderTask``), ``control`` (``celery inspect election``, ``election_resign``).
The top of the Celery side: it may import every wing but ``ops``.
"""
