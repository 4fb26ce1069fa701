"""Tasks that only the leader runs: ``@leader_task`` and the ``LeaderTask`` base.

A leader task is routed to the namespace's leader queue, which only the leading worker
consumes, however it is sent: ``init_app`` installs ``LeaderRouter`` in Celery's
``task_routes`` (after the app's own routes, which win, as does a queue given to the
call), so ``send_task`` by name and ``celery call`` route it too. The check at the start
of each run is the safety net for messages that were prefetched before a handoff or
routed elsewhere: it reads the worker's shared leadership record (``shared_state``), so
it costs a clock reading and a few memory loads, never a query. On a follower (or a
leader past its trust window) the task:

* ``requeue`` (the default): goes back to the leader queue after ``requeue_delay``
  seconds (the same request republished with a countdown, this copy acked: never lost,
  never spinning hot, and the task's own retry count and limits untouched);
* ``skip``: ends as ignored;
* ``raise``: fails with NotLeaderError.

Each of them is logged at WARNING: a leader task on a follower means a handoff or a route
that misses the leader queue.

The check is made once, at start. A long task that writes somewhere should fence with the
term it runs under (``self.election_term``, or ``current_term()``): store it with the
write and refuse writes with an older one.
"""

from __future__ import annotations

import logging
from contextvars import ContextVar
from typing import Any

from celery import Task
from celery.exceptions import Ignore

from .. import metrics
from ..core import tracing
from ..election import shared_state
from ..errors import NotLeaderError
from ..metrics import counters
from ..runs.once import check_choice, task_decorator
from ..runs.once import guard as guard_once
from ..settings import ElectionSettings

__all__ = [
    "ON_FOLLOWER",
    "LeaderRouter",
    "LeaderTask",
    "current_term",
    "install_router",
    "leader_queues",
    "leader_task",
]

log = logging.getLogger(__name__)

ON_FOLLOWER = ("skip", "requeue", "raise")


# The term the current leader task started under (per thread / greenlet): cheaper to set
# than an attribute of Celery's request, which is a stack lookup.
_TERM: ContextVar[int | None] = ContextVar("celery_election_term", default=None)


def current_term() -> int | None:
    """The term this worker leads under right now, or None (no query: shared memory)."""
    record = shared_state.current()
    return record.leader_term() if record is not None else None


class LeaderTask(Task):
    """Base class of tasks that only the leader runs (see the module docstring)."""

    #: What a follower does with the task: "requeue" (never lost), "skip" or "raise".
    on_follower = "requeue"
    #: Seconds before a requeued task is delivered again.
    requeue_delay = 1.0
    throws = (NotLeaderError,)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # `@app.task(base=LeaderTask, on_follower=...)` creates a subclass: check it now,
        # not when the first message arrives on a follower.
        super().__init_subclass__(**kwargs)
        check_choice("on_follower", cls.__dict__.get("on_follower", cls.on_follower), ON_FOLLOWER)

    #: Route to this queue instead of the namespace's leader queue (``leader_task(queue=)``).
    election_queue: str | None = None
    #: Run once per task id (``leader_task(once=True)``): a second delivery is skipped.
    election_once = False

    @property
    def leader_queue(self) -> str:
        """Where this task is sent unless the caller routes it: the leader queue."""
        if self.election_queue:
            return self.election_queue
        return ElectionSettings.from_app(self.app).leader_queue

    def apply_async(self, args: Any = None, kwargs: Any = None, **options: Any) -> Any:
        """Send to the leader queue unless the caller or the app's routes route it.

        With ``init_app`` the router does this; without it (an app that never called
        ``init_app``), the task routes itself here.
        """
        routed = any(options.get(k) for k in ("queue", "exchange", "routing_key"))
        if not routed and not _has_router(self.app):
            options["queue"] = self.leader_queue
        return super().apply_async(args, kwargs, **options)

    @property
    def election_term(self) -> int | None:
        """The term the running task was started under (its fencing token)."""
        return _TERM.get()

    def apply(self, *args: Any, **kwargs: Any) -> Any:
        """Run eagerly; the caller's term comes back after (a leader task inside another)."""
        saved = _TERM.set(None)
        try:
            return super().apply(*args, **kwargs)
        finally:
            _TERM.reset(saved)

    def before_start(self, task_id: str, args: Any, kwargs: Any) -> None:
        """Check leadership before the body runs: one shared-memory read, no query.

        The hot path: no ``self.request`` (a thread-local stack lookup that cost more than
        the rest of the check). The term is left set after the run: a worker runs one
        task at a time per thread and the next run sets its own, and ``apply()`` puts the
        caller's back around an eager run nested in another.
        """
        record = shared_state.current()
        term = record.leader_term() if record is not None else None
        if term is not None:
            _TERM.set(term)
            if _TRACED:  # the otel extra: Celery's task span (instrumented) carries the term
                tracing.task_term(term)
            store = counters.in_use()
            if store is not None:  # metrics on: one dict lookup and one shared-memory add
                store.add(_RUN_KEYS.get(self.name) or _count_key(self.name, "run"))
            if self.election_once:  # after the leadership check: a requeue is no start
                guard_once(self, task_id, always=True)
            return
        _TERM.set(None)
        mode = check_choice("on_follower", self.on_follower, ON_FOLLOWER)
        tracing.task_not_leader(_OUTCOME[mode])
        if counters.in_use() is not None:
            metrics.count(_count_key(self.name, _OUTCOME[mode]))
        if mode == "skip":
            log.warning("%s[%s] skipped: this worker is not the leader", self.name, task_id)
            raise Ignore()
        if mode == "requeue":
            queue = self.leader_queue
            log.warning(
                "%s[%s] requeued to %s: this worker is not the leader", self.name, task_id, queue
            )
            if self.request.is_eager:
                # apply()/task_always_eager re-run a retry at once in this very process,
                # which can never lead: Celery's own retry, with its limit, ends it.
                raise self.retry(countdown=self.requeue_delay, queue=queue)
            # Publish the same request again (same id, same retry count, callbacks kept)
            # after requeue_delay, then ack this copy: never lost, never spinning, and the
            # task's own retry budget (retries, max_retries, autoretry_for) untouched.
            self.signature_from_request(countdown=self.requeue_delay, queue=queue).apply_async()
            raise Ignore()
        raise NotLeaderError(f"{self.name}[{task_id}] must run on the leader; this worker is not")


_OUTCOME = {"skip": "skipped", "requeue": "requeued", "raise": "raised"}
_TRACED = tracing.AVAILABLE  # a constant of the hot path
_RUN_KEYS: dict[str, str] = {}  # task name -> its "run" key (the hot path)


def _count_key(name: str, outcome: str) -> str:
    """The metrics key of a leader task's outcome: run, skipped, requeued or raised."""
    k = metrics.key(metrics.TASK, name, outcome)
    if outcome == "run":
        _RUN_KEYS[name] = k
    return k


def leader_task(
    *args: Any, on_follower: str = "requeue", once: bool = False, **options: Any
) -> Any:
    """Declare a task that only the leader runs: ``@leader_task`` or ``@leader_task(...)``.

    Takes the options of ``@shared_task`` (and ``app=`` to bind to one app), plus
    ``on_follower``, ``requeue_delay`` and ``once`` (run once per task id: runs/once.py).
    """
    check_choice("on_follower", on_follower, ON_FOLLOWER)
    options.setdefault("base", LeaderTask)
    if once:
        options["election_once"] = True
    if "queue" in options:  # Celery 5.7 deprecates the task attribute: ours routes
        options["election_queue"] = options.pop("queue")
    return task_decorator("leader_task", args, {**options, "on_follower": on_follower})


class LeaderRouter:
    """A Celery router: leader tasks go to their leader queue, however they are sent.

    ``init_app`` appends it to ``task_routes``: the app's own routes come first and win,
    and a queue given to the call wins over every route (Celery's rule).

    A task sent by name from a process that never imported it (``celery -A proj call``,
    a web process sending with ``send_task`` in an ``include=`` or
    ``autodiscover_tasks()`` layout) is found the way a worker finds it: the first name
    this process does not know makes the router import the app's task modules once
    (``app.loader.import_default_modules()``: ``include``, ``imports``, autodiscovery).
    """

    def __init__(self, app: Any) -> None:
        self.app = app
        self._imported = False

    def __call__(
        self, name: str, args: Any, kwargs: Any, options: Any, task: Any = None, **kw: Any
    ) -> dict[str, str] | None:
        if task is None:
            task = self.app.tasks.get(name)
            if task is None and not self._imported:
                task = self._import_and_find(name)
        if isinstance(task, LeaderTask):
            return {"queue": task.leader_queue}
        return None

    def _import_and_find(self, name: str) -> Any:
        """Import the app's task modules (once per process), then look ``name`` up again."""
        self._imported = True
        try:
            self.app.loader.import_default_modules()
        except Exception as exc:  # the send goes on: a worker would fail on this too
            log.warning(
                "celery-election: could not import the app's task modules to route %s "
                "(%s: %s): a leader task sent by name may miss the leader queue",
                name,
                type(exc).__name__,
                exc,
            )
        return self.app.tasks.get(name)

    def __repr__(self) -> str:
        return "<celery_election.integration.tasks.LeaderRouter>"


def install_router(app: Any) -> None:
    """Append a LeaderRouter to the app's ``task_routes`` (idempotent)."""
    routes = app.conf.task_routes
    if routes is None:
        current: list[Any] = []
    elif isinstance(routes, (list, tuple)):
        current = list(routes)
    else:
        current = [routes]  # a dict, a router, or a router's dotted name
    if not any(isinstance(r, LeaderRouter) for r in current):
        app.conf.task_routes = [*current, LeaderRouter(app)]
        app.amqp.flush_routes()


def _has_router(app: Any) -> bool:
    return any(isinstance(r, LeaderRouter) for r in app.amqp.routes)


def leader_queues(app: Any) -> list[str]:
    """Every queue the app's leader tasks are routed to (its namespace's leader queue first)."""
    names = [ElectionSettings.from_app(app).leader_queue]
    for task in app.tasks.values():
        if isinstance(task, LeaderTask) and task.leader_queue not in names:
            names.append(task.leader_queue)
    return names
