"""The election: the Elector and the threads and holds it keeps, on a backend.

``elector`` (the facade; its docstring is the protocol), ``loop`` (the election thread)
and ``steps`` (its calls), ``belief`` (the one owner of belief), ``lock_thread`` (the
liveness lock), ``announce`` (the dispatcher), ``aio`` (``AsyncElector``), ``holder``
(one process's key holds, for the singleton tasks and the workers' runs),
``shared_state`` (the leadership a worker shares with its pool children).
Imports ``core`` and ``backends``; never Celery.
"""
