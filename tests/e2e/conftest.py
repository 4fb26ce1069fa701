"""The e2e ``cluster`` fixture: real ``celery worker`` / ``celery beat`` processes.

RabbitMQ + PostgreSQL by default. A module or test picks another set-up with
``@pytest.mark.parametrize("cluster", [{"kind": "sqla+sqlite"}], indirect=True)``
(``rabbitmq+mariadb`` too); the keys are ``kind`` and Cluster's own options (``beat=True``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.cluster import Cluster

from ..conftest import failed, server_url

KINDS = ("rabbitmq+postgresql", "sqla+sqlite")


@pytest.fixture
def cluster(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Cluster]:
    options: dict[str, Any] = dict(getattr(request, "param", {}))
    kind = options.pop("kind", KINDS[0])
    if kind in ("rabbitmq+postgresql", "rabbitmq+mariadb"):
        server = "postgresql" if kind == "rabbitmq+postgresql" else "mysql"
        broker, db = server_url("amqp"), server_url(server)
        results = f"db+{db}"
    else:
        broker = f"sqla+sqlite:///{tmp_path}/broker.db"
        db = f"sqlite:///{tmp_path}/election.db"
        results = f"db+sqlite:///{tmp_path}/results.db"
    c = Cluster(tmp_path, broker, db, results, **options)
    c.kind = kind  # type: ignore[attr-defined]
    try:
        yield c
    finally:
        if failed(request):
            print(c.logs(stacks=True))
        c.close()
