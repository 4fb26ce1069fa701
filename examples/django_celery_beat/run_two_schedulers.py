"""Two LeaderDatabaseSchedulers on one database: only the leader sends, each run once, and
django-celery-beat's own rules hold (start_time, expires, clocked one-off tasks).

Prints a JSON report; used by tests/integration/test_examples.py.
"""

import datetime
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "proj.settings")

import django

django.setup()

from django.core.management import call_command  # noqa: E402
from django.utils import timezone  # noqa: E402
from django_celery_beat.models import (  # noqa: E402
    ClockedSchedule,
    IntervalSchedule,
    PeriodicTask,
)
from proj.celery import app  # noqa: E402
from proj.schedulers import LeaderDatabaseScheduler  # noqa: E402

call_command("migrate", verbosity=0)
now = timezone.now()
seconds = float(sys.argv[1] if len(sys.argv) > 1 else 5)
every, _ = IntervalSchedule.objects.get_or_create(every=1, period=IntervalSchedule.SECONDS)
# Tasks named here are not registered in this process, so beat sends them by name.
PeriodicTask.objects.create(name="job", task="remote.job", interval=every)
starts = now + datetime.timedelta(seconds=seconds / 2)
PeriodicTask.objects.create(name="later", task="remote.later", interval=every, start_time=starts)
PeriodicTask.objects.create(
    name="expired", task="remote.expired", interval=every, expires=now - datetime.timedelta(1)
)
at = ClockedSchedule.objects.create(clocked_time=now + datetime.timedelta(seconds=1))
PeriodicTask.objects.create(name="once", task="remote.once", clocked=at, one_off=True)


class Recording(LeaderDatabaseScheduler):
    """Records what it really sends: (task, run key, when)."""

    def send_task(self, name, args=None, kwargs=None, **options):
        run = (options.get("headers") or {}).get("election_run")
        self.sent.append((name, run, time.time()))


schedulers = []
for _ in range(2):
    s = Recording(app=app)
    s.sent = []
    schedulers.append(s)
deadline = time.monotonic() + seconds
while time.monotonic() < deadline:
    for s in schedulers:
        s.tick()
    time.sleep(0.05)
report = {
    "leaders": [s._election.leadership() is not None for s in schedulers],
    "sent": [s.sent for s in schedulers],
    "starts": starts.timestamp(),
    "clocked": at.clocked_time.timestamp(),
}
for s in schedulers:
    s.close()
print(json.dumps(report))
