"""A beat run on the workers: the run's row decides whether a delivery runs it.

``runonce`` (the check and the end, on the run store; no Celery) and ``once`` (the
Celery side: the task hooks, ``OnceTask``, the decorator factory every kind of task
uses). The beat that claims and sends the runs is ``beat``, a wing above this one.
"""
