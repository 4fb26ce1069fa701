"""A follower in a monkey-patched process, as in a ``-P eventlet`` / ``-P gevent`` worker.

``python -m tests.integration.green_child HUB URL PREFIX NAMESPACE``

Patches the process first (as Celery does before it imports the app), then starts an
elector that follows (another process leads) and a green ticker that prints ``tick N``
every 50 ms. It waits (green) to lead, prints ``leads True|False``, stops the elector and
prints ``stopped``. (No stdin: reading it would block the hub itself.)
"""

from __future__ import annotations

import sys

HUB = sys.argv[1]
if HUB == "eventlet":
    import eventlet

    eventlet.monkey_patch()
    spawn, sleep = eventlet.spawn, eventlet.sleep
elif HUB == "gevent":
    from gevent import monkey

    monkey.patch_all()
    import gevent

    spawn, sleep = gevent.spawn, gevent.sleep
else:
    raise SystemExit(f"unknown hub {HUB}")

from celery_election import Elector, backend_from_url  # noqa: E402
from celery_election.backends import green  # noqa: E402


def main(url: str, prefix: str, namespace: str) -> None:
    assert green.hub() == HUB, green.hub()
    elector = Elector(backend_from_url(url, table_prefix=prefix), namespace, candidate_id="green")
    elector.start()
    print("started", flush=True)

    def ticker() -> None:
        n = 0
        while True:
            n += 1
            print(f"tick {n}", flush=True)
            sleep(0.05)

    spawn(ticker)
    print(f"leads {elector.wait_for_leadership(60)}", flush=True)
    elector.stop()
    print("stopped", flush=True)


if __name__ == "__main__":
    main(*sys.argv[2:5])
