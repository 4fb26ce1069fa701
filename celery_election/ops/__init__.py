"""The command line: ``celery election ...`` and ``celery-election ...``, and the demo.

``cli`` (the commands; the schedule's and the keys' own live in their wings) and
``demo`` (three real workers, failover and handoff).
"""
