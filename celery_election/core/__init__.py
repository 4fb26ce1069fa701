"""The core: the election's values and pure rules, no database and no Celery.

``lease`` (the lease and the trust-window rule), ``config`` (timings, validated once),
``decisions`` (what the election thread does, as pure functions), ``transitions`` (what
an elector reports), ``clock`` (the boot-time clock, a fake one for tests), ``runstate``
(a beat run's life as one row), ``due`` (when a beat run falls due: Celery's answer),
``keys`` (singleton keys as stored), ``transfer``, ``identity``, ``url`` (the default
election database), ``stats``, ``tracing``, ``shm``.
Imports only ``errors``; every other wing stands on this one.
"""
