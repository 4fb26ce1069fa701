"""Singleton tasks: one run at a time per key, the key held as a lease.

``singleton`` (``@singleton_task``, ``SingletonTask``), ``cli`` (``celery election
keys`` and ``release``), ``testing`` (the test kit's keys). The holds themselves are
``election.holder``'s, on the backend's key store: the lease's own steps, keyed.
"""
