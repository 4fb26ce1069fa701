"""Run once on the workers, the Celery side: the check before a run, and its end.

What a run's row means, and what ``acks_late`` changes: ``runs/runonce.py`` (the core).
Here, how a task gets the check:

* every task the beat sends, in a worker started with ``--election``: its message carries
  the run (the ``election_run`` header), and the worker step wraps each registered task
  class's ``before_start`` once, before the pool starts (``guard_registered``). Celery's
  tracer calls ``before_start`` right before the body in every pool (prefork, threads,
  solo, gevent); a delivery without the header passes untouched;
* any task, opt-in: ``@once_task`` / ``base=OnceTask``, and ``@leader_task(once=True)``,
  keyed by task id, with or without ``--election``.

A duplicate is acknowledged and skipped (``Ignore``), logged at WARNING and counted as
the task's outcome "duplicate". When the database cannot say (down, or tables missing)
the delivery is neither run nor dropped: it is published again after ``DEFER`` seconds
(the same request: same id and retry number) and this copy is acknowledged. The run's
end (success, failure, retry) is recorded from Celery's ``task_postrun`` signal.
"""

from __future__ import annotations

import functools
import logging
import os
import socket
import uuid
import weakref
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from celery import Task, shared_task
from celery.exceptions import Ignore
from celery.signals import task_postrun, worker_process_shutdown

from .. import metrics
from ..errors import BackendUnavailableError, ConfigurationError, SchemaMissingError
from ..settings import ElectionSettings
from . import runonce
from .runonce import RunGuard, Verdict, not_run

__all__ = [
    "DEFERRED_BY",
    "HEADER",
    "RESENT",
    "ROWS",
    "OnceTask",
    "guard",
    "guard_for",
    "guard_registered",
    "once_task",
    "warn_unchecked",
]

log = logging.getLogger("celery_election.runs.once")

#: The header the beat puts on a run it sends (beat/sender.py).
HEADER = "election_run"
#: The header the beat adds when it sends a run again (the attempt): not a redelivery.
RESENT = "election_resent"
#: The header that names where a beat run's row is: the namespace of the beat whose claim
#: wrote it (a standalone beat's is not its workers').
ROWS = "election_rows"
#: The header of a delivery put off (:func:`_defer`): the tries that may have started it.
DEFERRED_BY = "election_deferred_by"
#: Seconds before a delivery the database could not judge is delivered again.
DEFER = 1.0
#: A request attribute: the verdict of this delivery's start, so its end can be recorded.
_MARK = "election_start"
#: Outcomes that end a run (REJECTED requeues it: not an end).
_ENDS = frozenset({"SUCCESS", "FAILURE", "RETRY", "IGNORED"})


def guard_for(app: Any) -> RunGuard:
    """The run guard of this process for ``app``: the worker's, or the app's own."""
    current = runonce.current()
    if current is not None:
        return current
    guard: RunGuard | None = getattr(app, "_celery_election_run_guard", None)
    if guard is None:
        guard = RunGuard.from_settings(ElectionSettings.from_app(app))
        app._celery_election_run_guard = guard
    return guard


def guard(task: Any, task_id: str, *, always: bool) -> None:
    """Record this delivery's start, or skip it (``Ignore``); see the module.

    ``always=False``: only a delivery that carries the beat's run header is checked.
    """
    request = task.request
    if getattr(request, _MARK, None) is not None:
        return  # checked once already (a once task in a worker that checks beat runs)
    if not always and _header(request, HEADER) is None:
        return
    hostname = request.hostname or socket.gethostname()
    named = _header(request, DEFERRED_BY) or ()
    put_off = (named,) if isinstance(named, str) else tuple(named)  # a 0.2 copy's: one name
    token = uuid.uuid4().hex
    try:
        verdict = guard_for(task.app).enter(
            task_id, int(request.retries or 0), task.name, hostname,
            acks_late=bool(task.acks_late), delivery=token, put_off=put_off,
            namespace=_header(request, ROWS),
        )  # fmt: skip
    except (BackendUnavailableError, SchemaMissingError) as exc:
        # this try may have started the run: the copy names it, and finds that row its own
        _defer(task, task_id, (*put_off, token), "its start could not be recorded", exc)
    if verdict.run:
        if not _listening:
            _listen()
        setattr(request, _MARK, verdict)
        return
    if verdict.verdict == "defer":  # another live process runs it (acks_late)
        _defer(task, task_id, put_off, "another worker runs it now")
    metrics.count(metrics.key(metrics.TASK, task.name, "duplicate"))
    not_run(request)
    log.warning(
        "%s[%s] skipped: this run was delivered before (%s, attempt %d)",
        task.name,
        task_id,
        "it finished" if verdict.reason in ("finished", "dropped") else "it started",
        verdict.attempt,
    )
    raise Ignore()


_unchecked_warned: set[str] = set()


def warn_unchecked(task: Any, **_: Any) -> None:
    """A beat run reaching a task nothing checks here: say so once per task and process.

    Without the check a run the beat sends again, or the broker redelivers, runs again,
    silently (window 11 of issue 52): a worker without ``--election``, a pool child
    started by spawn (it does not inherit the check), a task registered after the worker
    step wrapped the others. Called before every task starts (a ``task_prerun`` receiver).
    """
    cls = type(task)
    if task.name in _unchecked_warned or _header(task.request, HEADER) is None:
        return
    if cls.__dict__.get("_election_once_wrapped") or isinstance(task, OnceTask):
        return
    if getattr(cls, "election_check_in_call", False):
        return
    _unchecked_warned.add(task.name)
    log.warning(
        "celery-election: beat runs of %s are not checked for duplicates in this process "
        "(pid %d): a run sent or delivered twice runs twice, and its end is not recorded "
        "(the overlap policy and the overdue alarm wait for it). Start the worker with "
        "--election, with the default fork pool start method, and its tasks imported "
        "before it starts",
        task.name,
        os.getpid(),
    )


def _header(request: Any, name: str) -> Any:
    """A message header: a worker's request has it as an attribute, ``apply()`` not."""
    value = getattr(request, name, None)
    return value if value is not None else (getattr(request, "headers", None) or {}).get(name)


def _defer(
    task: Any, task_id: str, put_off: tuple[str, ...], why: str, exc: BaseException | None = None
) -> NoReturn:
    """Neither run nor drop this delivery now: publish it again later, acknowledge this one.

    The copy names ``put_off``, the tries whose start may have written the run's row: a
    row one of them started is the copy's own (the write committed, its answer was lost).
    """
    metrics.count(metrics.key(metrics.TASK, task.name, "deferred"))
    request = task.request
    if request.is_eager:
        if exc is not None:
            raise exc
        raise Ignore()
    # a database that cannot answer is a warning; a copy waiting for a live run is routine
    # (at INFO: it comes back every DEFER seconds while that run lasts)
    log.log(logging.INFO if exc is None else logging.WARNING, "%s[%s] delayed %.0fs: %s%s",
            task.name, task_id, DEFER, why, "" if exc is None else f" ({exc})")  # fmt: skip
    headers = dict(getattr(request, "headers", None) or {})
    for name in (HEADER, RESENT, ROWS):
        value = _header(request, name)
        if value is not None:
            headers[name] = value
    headers[DEFERRED_BY] = list(put_off)
    task.signature_from_request(countdown=DEFER, headers=headers).apply_async()
    not_run(request)
    raise Ignore() from exc


def _finished(sender: Any = None, task: Any = None, state: str | None = None, **kw: Any) -> None:
    """The run's end: close its row, if this delivery still runs it (never raises)."""
    request = getattr(task, "request", None)
    verdict = getattr(request, _MARK, None) if request is not None else None
    if isinstance(verdict, Verdict) and state in _ENDS:
        setattr(request, _MARK, None)
        ending = guard_for(task.app)
        _ending.add(ending)
        ending.finish(verdict, str(state))


#: The guards that ended runs in this process: their waiting ends are written at its exit.
_ending: weakref.WeakSet[RunGuard] = weakref.WeakSet()


def _exiting(**_: Any) -> None:
    """A pool process exits (``worker_process_shutdown``): write the ends still waiting."""
    for ending in list(_ending):
        ending.flush()


_listening = False


def _listen() -> None:
    """Hear runs end from the first recorded start on (no cost to a process without one)."""
    global _listening
    task_postrun.connect(_finished, weak=False, dispatch_uid="celery_election.runs.once")
    worker_process_shutdown.connect(_exiting, weak=False, dispatch_uid="celery_election.runs.once")
    _listening = True


def _wrap(cls: type) -> None:
    """Put the beat-run check after ``cls``'s own ``before_start`` (once per class).

    Not for a class that checks in its call (``election_check_in_call``: a singleton task
    checks once it holds its key, so a busy key's requeue has started nothing).
    """
    if cls.__dict__.get("_election_once_wrapped") or getattr(cls, "election_check_in_call", False):
        return
    original: Callable[..., Any] = cls.before_start  # type: ignore[attr-defined]

    @functools.wraps(original)
    def before_start(self: Any, task_id: str, args: Any, kwargs: Any) -> None:
        original(self, task_id, args, kwargs)  # a leader task's leadership check first
        guard(self, task_id, always=False)

    cls.before_start = before_start  # type: ignore[attr-defined]
    cls._election_once_wrapped = True  # type: ignore[attr-defined]


def guard_registered(app: Any) -> int:
    """Check the beat's runs in every task of ``app`` (not Celery's own); how many.

    Called by the worker step before the pool starts: forked children inherit the
    wrapped classes. Each task has a class of its own, so nothing else changes.
    """
    wrapped = 0
    for name, task in list(app.tasks.items()):
        if not name.startswith("celery."):
            _wrap(type(task))
            wrapped += 1
    return wrapped


class OnceTask(Task):  # type: ignore[misc]
    """Base class of tasks that run once per task id (see the module docstring)."""

    def before_start(self, task_id: str, args: Any, kwargs: Any) -> None:
        """Record the start, or skip a delivery of a run that started before."""
        guard(self, task_id, always=True)


def once_task(*args: Any, **options: Any) -> Any:
    """Declare a task that runs once per task id: ``@once_task`` or ``@once_task(...)``.

    Takes the options of ``@shared_task`` (and ``app=`` to bind to one app).
    """
    options.setdefault("base", OnceTask)
    return task_decorator("once_task", args, options)


def task_decorator(kind: str, args: tuple[Any, ...], options: dict[str, Any]) -> Any:
    """``@kind`` or ``@kind(...)``: ``@shared_task(**options)``, or ``app=``'s ``app.task``.

    How each of the package's task decorators (once, leader, singleton) declares a task.
    """
    app = options.pop("app", None)

    def decorate(fun: Callable[..., Any]) -> Any:
        factory = app.task if app is not None else shared_task
        return factory(**options)(fun)

    if len(args) == 1 and callable(args[0]) and not options.get("name"):
        return decorate(args[0])
    if args:
        raise TypeError(f"{kind} takes keyword options only")
    return decorate


def check_choice(what: str, value: object, choices: Sequence[str]) -> str:
    """``value`` if one of ``choices``, else one line naming them (a task's option)."""
    if value not in choices:
        raise ConfigurationError(f"{what} must be one of {', '.join(choices)}: got {value!r}")
    return str(value)
