"""Tasks that run one at a time per key: ``@singleton_task`` and the ``SingletonTask`` base.

Before the body runs, the task holds its key in the election database (``KeyHolder``,
one per process: one session lock and one connection for all the process's keys). The
key is the task's name and the arguments named by ``unique_on`` (default: all of them,
bound to the signature, so ``f(1, b=2)`` and ``f(1, 2)`` are one key). While another
worker holds the key, the task, by ``on_busy``:

* ``requeue`` (the default): is published again after ``requeue_delay`` seconds (same
  request, this copy acked: never lost, never spinning hot);
* ``skip``: ends as ignored;
* ``raise``: fails with KeyBusyError.

A holder that died frees its keys within about its liveness delta (its session closed);
the running task's ``self.singleton_term`` grows each time the key changes hands: store it
with the task's writes and refuse writes with an older one (a paused holder whose key was
taken over finds its term superseded). The key is released when the task returns.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from typing import Any

from celery import Task
from celery.exceptions import Ignore

from .. import metrics
from ..backends import backend_from_url
from ..election.holder import Held, KeyHolder
from ..errors import BackendUnavailableError, ConfigurationError, ElectionError
from ..runs import once, runonce
from ..runs.once import check_choice, task_decorator
from ..settings import ElectionSettings

__all__ = [
    "ON_BUSY",
    "KeyBusyError",
    "SingletonTask",
    "key_holder",
    "set_key_holder",
    "singleton_key",
    "singleton_task",
]

log = logging.getLogger(__name__)

ON_BUSY = ("requeue", "skip", "raise")
#: The header of a requeued request that holds its key's waiting slot: the slot's term.
WAITING = "election_waiting"
_OUTCOME = {"skip": "skipped", "requeue": "requeued", "raise": "raised"}

#: The hold of the singleton task running in this thread / greenlet.
_HELD: ContextVar[Held | None] = ContextVar("celery_election_singleton", default=None)
_HOLDERS: dict[int, KeyHolder] = {}
_HOLDERS_LOCK = threading.Lock()


class KeyBusyError(ElectionError):
    """Another worker runs this singleton task's key now (``on_busy="raise"``)."""


def _count(task: str, what: str, n: int = 1) -> None:
    """Count a singleton task's ``what`` (metrics.KEY; the exporter's ``singleton_*``)."""
    metrics.count(metrics.key(metrics.KEY, task, what), n)


def set_key_holder(app: Any, holder: KeyHolder | None) -> None:
    """Use ``holder`` for ``app``'s singleton tasks in this process (tests, own set-ups).

    ``app=None``: for every app's, ahead of their own (the test kit, ``testing_keys``);
    None again ends that and gives each app its own back. The replaced holder is closed.
    """
    with _HOLDERS_LOCK:
        old = _HOLDERS.pop(_slot(app), None)
        if holder is not None:
            _HOLDERS[_slot(app)] = holder
    if old is not None and old is not holder:
        old.close()


def _slot(app: Any) -> int:
    return 0 if app is None else id(app)


def key_holder(app: Any) -> KeyHolder:
    """The key holder of ``app`` in this process (made from its ``election_*`` settings once).

    Its holds last ``election_ttl`` and free ``election_liveness`` after a crash, as the
    lease does (a paused holder's: delta after the server ends its session; on SQLite, whose
    file lock a paused process keeps, when the hold's ttl ends).
    """
    with _HOLDERS_LOCK:
        holder = _HOLDERS.get(0) or _HOLDERS.get(id(app))
        if holder is None:
            settings = ElectionSettings.from_app(app)
            backend = backend_from_url(settings.url, **settings.backend_options(listen=False))
            cfg = settings.config  # the lease's timings: election_ttl, _safety_margin, _liveness
            holder = _HOLDERS[id(app)] = KeyHolder(
                backend, settings.namespace, ttl=cfg.ttl, safety_margin=cfg.safety_margin,
                liveness=cfg.liveness,
            )  # fmt: skip
        return holder


def waiting_key(key: str) -> str:
    """The key of ``key``'s waiting slot (``one_waiting``); no task's own key ends so."""
    return f"{key} (waiting)"


def singleton_key(
    name: str, fun: Callable[..., Any], unique_on: Sequence[str] | None, args: Any, kwargs: Any
) -> str:
    """The key of one call: the task name and the chosen arguments, bound to the signature."""
    try:
        bound = inspect.signature(fun).bind(*(args or ()), **(kwargs or {}))
        bound.apply_defaults()
        values = dict(bound.arguments)
    except (TypeError, ValueError):  # a signature we cannot bind: all of it, as given
        values = {"args": list(args or ()), "kwargs": dict(kwargs or {})}
    if unique_on is not None:
        values = {k: values.get(k) for k in unique_on}
    text = json.dumps(values, sort_keys=True, default=repr, separators=(",", ":"))
    if len(name) + len(text) + 1 <= 200:
        return f"{name}:{text}"
    return f"{name}:sha1:{hashlib.sha1(text.encode()).hexdigest()}"


class SingletonTask(Task):
    """Base class of tasks that run one at a time per key (see the module docstring)."""

    #: The argument names that form the key (None: all of them).
    unique_on: Sequence[str] | None = None
    #: What a second instance does while the key is held: "requeue", "skip" or "raise".
    on_busy = "requeue"
    #: Seconds before a requeued task is delivered again.
    requeue_delay = 1.0
    #: "requeue" only: one running plus at most one waiting per key; a third is dropped.
    one_waiting = False
    throws = (KeyBusyError,)
    #: A beat run is checked once the key is held (in the call), not before (runs/once.py): a
    #: start recorded before a busy key's requeue made the requeued copy a duplicate.
    election_check_in_call = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        mode = check_choice("on_busy", cls.__dict__.get("on_busy", cls.on_busy), ON_BUSY)
        if cls.__dict__.get("one_waiting", cls.one_waiting) and mode != "requeue":
            raise ConfigurationError(f"one_waiting needs on_busy='requeue': got {mode!r}")

    @property
    def singleton_term(self) -> int | None:
        """The running task's term on its key: its fencing token (None: not running)."""
        held = _HELD.get()
        return None if held is None else held.term

    def singleton_trusted(self) -> bool:
        """Whether this process may still believe it holds the running task's key."""
        held = _HELD.get()
        return held is not None and key_holder(self.app).trusted(held)

    def key_for(self, args: Any, kwargs: Any) -> str:
        """The key a call with ``args`` and ``kwargs`` holds."""
        return singleton_key(self.name, self.run, self.unique_on, args, kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Hold the key around the body; busy: ``on_busy`` decides."""
        holder = key_holder(self.app)
        key = self.key_for(args, kwargs)
        try:
            held = holder.acquire(key)
        except BackendUnavailableError as exc:  # never lost: as busy, unless it should raise
            if self.on_busy == "raise":
                raise
            log.warning("%s: cannot hold key %s now (%s): as if busy", self.name, key, exc)
            held = None
        if held is None:
            return self._busy(key)
        try:  # a beat run's check, once the key is held: a busy key has started nothing
            once.guard(self, self.request.id, always=False)
        except BaseException:
            holder.release(held)
            raise
        self._free_waiting(holder, key)
        _count(self.name, "run")
        if held.waited:  # a dead holder's key, taken after its delta
            _count(self.name, "waited")
            _count(self.name, "wait_ms", round(held.waited * 1000))
        started = time.monotonic()
        saved = _HELD.set(held)
        try:
            return super().__call__(*args, **kwargs)
        finally:
            _HELD.reset(saved)
            holder.release(held)
            _count(self.name, "hold_ms", round((time.monotonic() - started) * 1000))
            _count(self.name, "ended")

    def _busy(self, key: str) -> Any:
        mode = check_choice("on_busy", self.on_busy, ON_BUSY)
        task_id = self.request.id
        if mode != "requeue":
            _count(self.name, _OUTCOME[mode])
        if mode == "skip":
            log.warning("%s[%s] skipped: key %s is held elsewhere", self.name, task_id, key)
            raise Ignore()
        if mode == "raise":
            raise KeyBusyError(f"{self.name}[{task_id}]: key {key} is held by another worker")
        headers = dict(self.request.headers or {})
        if self.one_waiting and not self.request.is_eager:
            slot = self._waiting_slot(key)
            if slot is None:
                log.info("%s[%s] dropped: key %s runs and has one waiting", self.name, task_id, key)
                _count(self.name, "skipped")
                raise Ignore()
            headers[WAITING] = slot
        _count(self.name, "requeued")
        log.info("%s[%s] requeued: key %s is held elsewhere", self.name, task_id, key)
        if self.request.is_eager:
            # an eager retry re-runs at once in this process: Celery's retry limit ends it
            raise self.retry(countdown=self.requeue_delay)
        sig = self.signature_from_request(countdown=self.requeue_delay, headers=headers)
        try:
            sig.apply_async()
        except Exception:  # not sent: its waiting slot must not stay taken for nobody
            if WAITING in headers:
                self._free_slot(key_holder(self.app), key, headers[WAITING])
            raise
        runonce.not_run(self.request)  # the copy runs it: its history row stays open
        raise Ignore()

    def _waiting_slot(self, key: str) -> int | None:
        """The request's term on the key's waiting slot, held now if need be (None: taken).

        The slot is a key of its own, held by this worker process until the request runs
        (its run frees it, fenced by the term its header carries) or the process dies.
        """
        slot = getattr(self.request, WAITING, None)
        if isinstance(slot, int):
            return slot  # delivered again, still waiting: it keeps its slot
        held = key_holder(self.app).acquire(waiting_key(key), wait=False)
        return None if held is None else held.term

    def _free_waiting(self, holder: KeyHolder, key: str) -> None:
        """Running now: give back the waiting slot this request held (only its term)."""
        slot = getattr(self.request, WAITING, None)
        if isinstance(slot, int):
            self._free_slot(holder, key, slot)

    def _free_slot(self, holder: KeyHolder, key: str, slot: int) -> None:
        try:
            holder.backend.keys.force_release(holder.namespace, waiting_key(key), slot)
        except BackendUnavailableError as exc:  # it frees when its holder's hold ends
            log.warning("could not free the waiting slot of key %s (%s)", key, exc)


def singleton_task(
    *args: Any,
    unique_on: Sequence[str] | None = None,
    on_busy: str = "requeue",
    **options: Any,
) -> Any:
    """Declare a task that runs one at a time per key: ``@singleton_task`` or ``(...)``.

    Takes the options of ``@shared_task`` (and ``app=`` to bind to one app), plus
    ``unique_on``, ``on_busy`` and ``requeue_delay``.
    """
    check_choice("on_busy", on_busy, ON_BUSY)
    if isinstance(unique_on, str):
        unique_on = (unique_on,)
    options.setdefault("base", SingletonTask)
    return task_decorator("singleton_task", args, {**options, "unique_on": unique_on,
                                                   "on_busy": on_busy})  # fmt: skip
