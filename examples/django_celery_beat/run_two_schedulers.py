"""Two LeaderDatabaseSchedulers, each in a process and a working directory of its own (two
"hosts"), on one database: only the leader sends, each run once, and django-celery-beat's
own rules hold (start_time, expires, clocked one-off tasks).

``python run_two_schedulers.py SECONDS`` creates the periodic tasks (one starts SECONDS/2
from now), starts two scheduler processes in two temporary working directories, lets them
tick until one has sent each kind of run, and prints a JSON report; used by
tests/integration/test_examples.py. Each process reads the election URL from Django's
settings (``CELERY_ELECTION_URL``, through ``namespace="CELERY"``): were it ignored, each
would elect itself in a default file of its own directory, and both would send.
"""

import datetime
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "proj.settings")

import django  # noqa: E402

django.setup()

from django.core.management import call_command  # noqa: E402
from django.utils import timezone  # noqa: E402
from django_celery_beat.models import (  # noqa: E402
    ClockedSchedule,
    IntervalSchedule,
    PeriodicTask,
)


def schedule(seconds: float) -> dict[str, float]:
    """The periodic tasks both schedulers serve."""
    call_command("migrate", verbosity=0)
    now = timezone.now()
    every, _ = IntervalSchedule.objects.get_or_create(every=1, period=IntervalSchedule.SECONDS)
    # Tasks named here are not registered anywhere, so beat sends them by name.
    PeriodicTask.objects.create(name="job", task="remote.job", interval=every)
    starts = now + datetime.timedelta(seconds=seconds / 2)
    PeriodicTask.objects.create(
        name="later", task="remote.later", interval=every, start_time=starts
    )
    PeriodicTask.objects.create(
        name="expired", task="remote.expired", interval=every, expires=now - datetime.timedelta(1)
    )
    at = ClockedSchedule.objects.create(clocked_time=now + datetime.timedelta(seconds=1))
    PeriodicTask.objects.create(name="once", task="remote.once", clocked=at, one_off=True)
    return {"starts": starts.timestamp(), "clocked": at.clocked_time.timestamp()}


def serve() -> None:
    """One scheduler, ticking until a line arrives on its standard input.

    After each tick it writes what it sent to ``sent.json`` in its working directory, for
    the parent to watch. On the first line it prints whether it led and what it sent, then
    keeps leading (or following) until its standard input closes: a scheduler that closed
    first would hand over to the other inside the window, and both would have led.
    """
    import threading

    from proj.celery import app
    from proj.schedulers import LeaderDatabaseScheduler

    class Recording(LeaderDatabaseScheduler):
        """Records what it really sends: (task, run key, when)."""

        sent: list[tuple[str, int, float]] = []

        def send_task(self, name, args=None, kwargs=None, **options):
            run = (options.get("headers") or {}).get("election_run")
            self.sent.append((name, run, time.time()))

    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.readline(), stop.set()), daemon=True).start()
    s = Recording(app=app)
    led, written = False, -1
    while not stop.is_set():
        s.tick()
        led = led or s._fence.leadership() is not None
        if len(s.sent) != written:
            written = len(s.sent)
            with open("sent.json.tmp", "w") as f:
                json.dump(s.sent, f)
            os.replace("sent.json.tmp", "sent.json")
        stop.wait(0.05)
    print(json.dumps({"led": led, "sent": s.sent, "cwd": os.getcwd()}), flush=True)
    sys.stdin.read()
    s.close()


def enough(sent: list[list[object]]) -> bool:
    """Whether one scheduler has sent what the report is about: three runs of the interval
    job, the task that starts later and the clocked one-off task."""
    tasks = [task for task, _run, _at in sent]
    return tasks.count("remote.job") >= 3 and {"remote.later", "remote.once"} <= set(tasks)


def sends(host: str) -> list[list[object]]:
    try:
        with open(os.path.join(host, "sent.json")) as f:
            return json.load(f)
    except FileNotFoundError:
        return []


def main() -> None:
    seconds = float(sys.argv[1] if len(sys.argv) > 1 else 5)
    report = schedule(seconds)
    hosts = [tempfile.mkdtemp(prefix=f"host{n}-") for n in (1, 2)]
    procs = [
        subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--serve"],
            cwd=cwd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for cwd in hosts
    ]
    # Both tick until one of them has sent enough (an event, not a wall-clock window: a
    # loaded machine took longer to start them than a fixed window left them to lead).
    deadline = time.monotonic() + 90
    while not any(enough(sends(h)) for h in hosts) and time.monotonic() < deadline:
        time.sleep(0.1)
    reports = []
    for p in procs:  # each reports when told, and lives on until its input closes
        assert p.stdin is not None and p.stdout is not None
        p.stdin.write("report\n")
        p.stdin.flush()
        reports.append(json.loads(p.stdout.readline()))
    for p in procs:
        p.communicate(timeout=60)
    report["leaders"] = [r["led"] for r in reports]
    report["sent"] = [r["sent"] for r in reports]
    report["hosts"] = hosts
    print(json.dumps(report))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        serve()
    else:
        main()
