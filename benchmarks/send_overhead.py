"""What sending a ``@leader_task`` costs beside a plain task: publishing included.

    .venv/bin/python benchmarks/send_overhead.py                  # memory broker and RabbitMQ
    .venv/bin/python benchmarks/send_overhead.py --n 2000 --repeat 9

``task_overhead.py`` times the worker side and leaves publishing out; this is the sender's
side. In one process, one app with ``init_app`` (so its ``LeaderRouter`` is in
``task_routes``, as in every real app), a plain task and a ``@leader_task``: each
repetition sends ``--n`` messages of each kind by ``apply_async`` and ``--n`` by
``send_task`` (by name), in alternating chunks of 100 (P L L P ...), so load from other
processes falls on both kinds alike. Reported per broker and way of sending: sends/s of
each kind (p50 over repetitions) and the ratio leader / plain. Target: >= 0.98. The memory
broker shows the library's own cost; RabbitMQ, what a user sees.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
import uuid
from collections.abc import Callable
from typing import Any

import _root  # noqa: F401  (puts the repository on sys.path)
from celery import Celery

from celery_election import init_app, leader_task

CHUNK = 100


def make_app(broker: str) -> tuple[Celery, Any, Any]:
    app = Celery(f"send{uuid.uuid4().hex[:6]}", broker=broker, set_as_current=False)
    app.conf.update(task_ignore_result=True, election_namespace=f"send{uuid.uuid4().hex[:6]}")
    init_app(app)

    @app.task(name="bench.plain", shared=False)
    def plain() -> None:
        pass

    @leader_task(app=app, name="bench.leader", shared=False)
    def leader() -> None:
        pass

    return app, plain, leader


def rate(send: Callable[[], Any], n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        send()
    return n / (time.perf_counter() - start)


def measure(broker: str, n: int, repeat: int) -> dict[str, tuple[float, float, float]]:
    """way -> (plain sends/s p50, leader sends/s p50, ratio p50)."""
    app, plain, leader = make_app(broker)
    results: dict[str, tuple[float, float, float]] = {}
    with app.producer_or_acquire() as producer:
        ways = {
            "apply_async": (
                lambda: plain.apply_async(producer=producer),
                lambda: leader.apply_async(producer=producer),
            ),
            "send_task": (
                lambda: app.send_task("bench.plain", producer=producer),
                lambda: app.send_task("bench.leader", producer=producer),
            ),
        }
        for way, (send_plain, send_leader) in ways.items():
            rate(send_plain, CHUNK)  # warm-up: connections, routes, the queue declared
            rate(send_leader, CHUNK)
            plains, leaders, ratios = [], [], []
            for _ in range(repeat):
                p_time = l_time = 0.0
                for i in range(n // CHUNK):
                    order = (send_plain, send_leader) if i % 2 == 0 else (send_leader, send_plain)
                    for send in order:
                        t = CHUNK / rate(send, CHUNK)
                        if send is send_plain:
                            p_time += t
                        else:
                            l_time += t
                plains.append(n / p_time)
                leaders.append(n / l_time)
                ratios.append(p_time / l_time)
            results[way] = (
                statistics.median(plains),
                statistics.median(leaders),
                statistics.median(ratios),
            )
    with app.connection_for_write() as conn:  # leave nothing behind on a real broker
        for queue in ("celery", f"election-leader.{app.conf.election_namespace}"):
            with contextlib.suppress(Exception):
                conn.default_channel.queue_delete(queue)
    app.close()
    return results


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=2000, help="sends of each kind per repetition")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--amqp", default="amqp://guest:guest@127.0.0.1:5672//")
    args = p.parse_args()
    print("| broker | way | plain sends/s | leader sends/s | leader / plain (p50) |")
    print("| --- | --- | --- | --- | --- |")
    for name, broker in (("memory", "memory://"), ("RabbitMQ", args.amqp)):
        for way, (plain, leader, ratio) in measure(broker, args.n, args.repeat).items():
            print(f"| {name} | {way} | {plain:,.0f} | {leader:,.0f} | {ratio:.3f} |")


if __name__ == "__main__":
    main()
