"""One bare elector process for the chaos runs: elects, records, and acts while trusted.

    python -m harness.chaos.node URL NAMESPACE HISTORY [--ttl S] [--prefix P] [--no-listen]
        [--direct-url URL] [--ineligible]

It acts as leader every 20 ms: read the clock, check ``elector.term`` (trust, no I/O), and
record the act under that term with the reading taken *before* the check. A paused process
that wakes up past its trust window fails the check; one that acted anyway would show up in
the history as an act inside another term's window.
"""

from __future__ import annotations

import argparse
import signal
import threading

from celery_election import Elector
from celery_election.backends import backend_from_url
from celery_election.core.clock import boottime
from celery_election.history import Recorder


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("namespace")
    parser.add_argument("history")
    parser.add_argument("--ttl", type=float, default=2.0)
    parser.add_argument("--prefix", default="celery_election_")
    parser.add_argument("--no-listen", action="store_true")
    parser.add_argument("--direct-url", default=None)
    parser.add_argument("--ineligible", action="store_true", help="election_eligible=False")
    args = parser.parse_args()

    options: dict[str, object] = {"table_prefix": args.prefix}
    if args.direct_url:
        options["direct_url"] = args.direct_url
    if args.url.startswith("postgresql"):
        options["listen"] = not args.no_listen
    backend = backend_from_url(args.url, **options)
    elector = Elector(backend, args.namespace, ttl=args.ttl, eligible=not args.ineligible)
    recorder = Recorder(args.history, role="elector").attach(elector)
    if args.ineligible:  # the checker's list: this candidate must never hold a term
        recorder.record("ineligible", ns=args.namespace, cand=elector.candidate_id)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    elector.start()
    while not done.wait(0.02):
        checked = boottime()
        term = elector.term
        if term is not None:
            recorder.act(args.namespace, term, checked)
    elector.stop()
    backend.close()


if __name__ == "__main__":
    main()
