"""A leader in a process of its own, for the liveness tests: prints each transition.

``python -m tests.integration.liveness_child URL PREFIX NAMESPACE HISTORY TTL [OPTIONS [ID]]``

OPTIONS: the backend's constructor options as JSON (e.g. ``{"direct_url": ...}``); ID:
the candidate id (default "child").
"""

from __future__ import annotations

import json
import sys
import threading

from celery_election import Elector, backend_from_url
from celery_election.history import Recorder


def main(argv: list[str]) -> None:
    url, prefix, namespace, history, ttl = argv[:5]
    options = json.loads(argv[5]) if len(argv) > 5 else {}
    backend = backend_from_url(url, table_prefix=prefix, **options)
    name = argv[6] if len(argv) > 6 else "child"
    elector = Elector(backend, namespace, candidate_id=name, ttl=float(ttl))
    Recorder(history, role="child").attach(elector)
    sub = elector.subscribe()
    elector.start()
    print("started", flush=True)
    for t in sub:
        print(t.kind, t.term, flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main(sys.argv[1:])
