"""Two LeaderDatabaseSchedulers on one database: only the leader sends, each tick once.

Prints a JSON report; used by tests/integration/test_examples.py.
"""

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "proj.settings")

import django

django.setup()

from django.core.management import call_command  # noqa: E402
from django_celery_beat.models import IntervalSchedule, PeriodicTask  # noqa: E402
from proj.celery import app  # noqa: E402
from proj.schedulers import LeaderDatabaseScheduler  # noqa: E402

call_command("migrate", verbosity=0)
every, _ = IntervalSchedule.objects.get_or_create(every=1, period=IntervalSchedule.SECONDS)
PeriodicTask.objects.get_or_create(name="job", task="proj.celery.job", interval=every)


class Recording(LeaderDatabaseScheduler):
    def apply_async(self, entry, producer=None, advance=True, **kwargs):
        if entry.name == "job":
            self.sent.append((entry.options.get("headers") or {}).get("election_due"))
        return None


schedulers = []
for _ in range(2):
    s = Recording(app=app)
    s.sent = []
    schedulers.append(s)
deadline = time.monotonic() + float(sys.argv[1] if len(sys.argv) > 1 else 5)
while time.monotonic() < deadline:
    for s in schedulers:
        s.tick()
    time.sleep(0.05)
report = {
    "leaders": [s._election.leadership() is not None for s in schedulers],
    "sent": [s.sent for s in schedulers],
}
for s in schedulers:
    s.close()
print(json.dumps(report))
