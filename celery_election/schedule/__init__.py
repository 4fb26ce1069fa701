"""The operable schedule: entries changed at runtime, pause, run now, policies, history.

One room of its own, on the Celery side; the election core never imports it
(``tests/unit/test_layers.py``). Where things are:

- ``api.py``: ``Schedule``, what operators and code call (re-exported here).
- ``store.py``: its tables in the election database (``schedule_store(backend)``);
  ``records.py``: the rows it hands out; ``marks.py``: the timeline's marks and queries.
- ``spec.py``: the schedule language ("every 10s", crontabs with a time zone, one-offs)
  and the policies; ``cron.py``: cron's own daylight-saving rules.
- ``cli.py`` and ``cli_web.py``: ``celery election schedule ...`` and ``election web``.
- ``web.py``, ``observer.py`` and ``webpage/``: the page (a WSGI app, no framework).

The leading beat serves it: ``celery_election/beat/ops.py``.
"""

from __future__ import annotations

from .api import Entry, Schedule

__all__ = ["Entry", "Schedule"]
