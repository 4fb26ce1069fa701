"""The one harness for what runs processes against the election: e2e tests, the chaos
matrix and the benchmarks.

* ``processes``: a child in a session of its own; start, signal, pause, resume, kill
  (its whole group: a worker's pool children too), wait, and stop many at once.
* ``events``: children that report JSON lines, collected in order and timed
  (failover.py, peers.py).
* ``chaos``: the fault driver, the faults, and the processes it runs.
* ``proxy``: a TCP proxy that can stall, cut or slow one process's database link.
* ``checker``: reads the histories the package's ``Recorder`` writes, and judges them.
* ``stats``: the one percentile.

Not part of the package (it is not installed): tests import it from the repository root,
benchmarks through ``benchmarks/_root.py``. It may import the package, never ``tests``.
"""
