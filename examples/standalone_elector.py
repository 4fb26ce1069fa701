"""Leader election in a plain Python service: no Celery, just the Elector and a database.

    python examples/standalone_elector.py [--url URL] [--seconds N]

Start it twice (two terminals): one prints LEADER lines and does the work, the other
prints FOLLOWER lines. Stop the leader (Ctrl-C or SIGTERM: it resigns on the way out) and
the other one leads within a poll interval; kill it with SIGKILL and the other one leads
when the lease ends (--ttl). Every line is ``WHAT key=value ...``, easy to grep.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import tempfile
import threading
import time

from celery_election import Elector, RevokeReason, backend_from_url

_print_lock = threading.Lock()


def say(what: str, **fields: object) -> None:
    """One line per event; the callbacks run on the elector's event thread."""
    line = " ".join([what, *(f"{k}={v}" for k, v in fields.items())])
    with _print_lock:
        sys.stdout.write(f"{line} at={time.time():.3f}\n")
        sys.stdout.flush()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default_url = f"sqlite:///{os.path.join(tempfile.gettempdir(), 'standalone-elector.db')}"
    parser.add_argument("--url", default=default_url, help=f"database (default {default_url})")
    parser.add_argument("--namespace", default="standalone", help="who competes with whom")
    parser.add_argument("--name", default=f"{socket.gethostname()}:{os.getpid()}")
    parser.add_argument("--ttl", type=float, default=5.0, help="lease length, seconds")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between work")
    parser.add_argument("--seconds", type=float, default=None, help="stop after this long")
    args = parser.parse_args()

    stopping = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: stopping.set())

    backend = backend_from_url(args.url)
    backend.install()  # idempotent; a real service would do this at deploy time

    def on_elected(term: int) -> None:
        say("ELECTED", name=args.name, term=term)

    def on_revoked(term: int, reason: RevokeReason) -> None:
        say("REVOKED", name=args.name, term=term, reason=reason.value)

    def on_error(exc: BaseException) -> None:
        say("ERROR", name=args.name, error=type(exc).__name__)

    elector = Elector(
        backend,
        args.namespace,
        args.name,
        ttl=args.ttl,
        poll_interval=min(1.0, args.ttl / 5),
        on_elected=on_elected,
        on_revoked=on_revoked,
        on_error=on_error,
    )
    say("STARTED", name=args.name, database=backend.description)
    deadline = None if args.seconds is None else time.monotonic() + args.seconds
    done = 0
    with elector:  # start() here; stop() on the way out resigns, so another leads at once
        while not stopping.is_set() and (deadline is None or time.monotonic() < deadline):
            # is_leader and term cost no I/O: read them as often as you like. Read the term
            # once per unit of work and write it with the work (see examples/fencing.py).
            term = elector.term
            if term is not None:
                done += 1
                say("LEADER", name=args.name, term=term, work=done)
            else:
                say("FOLLOWER", name=args.name, leader=elector.leader_id or "-")
            wait = args.interval
            if deadline is not None:
                wait = max(0.0, min(wait, deadline - time.monotonic()))
            stopping.wait(wait)
    backend.close()
    say("STOPPED", name=args.name, work=done)
    return 0


if __name__ == "__main__":
    sys.exit(main())
