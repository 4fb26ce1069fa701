"""Operate the schedule: entries changed at runtime, pause / resume / run now, policies.

    from celery_election.schedule import Schedule

    with Schedule(app) as s:
        s.add("report", "proj.report", "every 10s", kwargs={"full": True}, overlap="skip")
        s.update("report", schedule="*/5 * * * *", tz="Europe/Paris")
        s.pause("report"); s.resume("report", missed="skip"); s.run_now("report")
        s.history("report")

Entries live in the election database (``election install`` creates the tables) under the
beats' namespace (``election_beat_namespace``), beside the static ``beat_schedule``; the
``LeaderScheduler`` serves both and picks up a change within a second, no restart. A static
entry can be paused, run now and given policies too (an *overlay* row); it cannot be
edited or removed here (the code defines it).

Each change is validated before it is stored (a bad crontab, an unknown time zone, a task
no module of the app registers: one line saying what to do) and recorded with who and
when. "Run now" and the runs themselves are fenced by the leader's term (see
``schedule/store.py``); pause, resume and edits are plain versioned writes that the
leader applies at its next look.

Policies, per entry:

* ``catch_up`` (runs that fell due while no beat led, or while paused and resumed with
  ``missed="catch_up"``): ``latest`` (default; Celery's: one run, however many were
  missed), ``skip`` (none: the entry waits for its next due time) or ``all`` (each missed
  run, the latest ``catch_up_max``). ``grace`` (seconds): a run due longer ago than this is
  missed, not sent (as ``beat_cron_starting_deadline``, per entry; ``skip`` uses 1 s when
  unset).
* ``overlap``: ``allow`` (default) or ``skip``: a due run is skipped while the entry's
  previous run has not finished (its row ended: workers with ``--election`` end it), unless
  that run was sent more than ``overlap_timeout`` seconds ago (default 3600: its worker
  may have died).
"""

from __future__ import annotations

import builtins
import contextlib
import getpass
import json
import logging
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

from ..backends import SQLBackend, backend_from_url
from ..backends.base import RunState
from ..errors import ConfigurationError
from ..settings import ElectionSettings
from .records import EntryRow, RunRecord
from .spec import POLICY_DEFAULTS, RESUME, check_policies, describe, instant, to_spec
from .store import SQLScheduleStore, schedule_store

if TYPE_CHECKING:  # the Celery side's types; nothing from Celery is loaded here
    from celery import Celery

__all__ = ["Entry", "Schedule"]

log = logging.getLogger("celery_election.schedule")

# -- entries ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Entry:
    """An entry as operators see it: static or dynamic, with its operator state."""

    name: str
    task: str
    spec: dict[str, Any]
    args: list[Any] = field(default_factory=list)
    kwargs: dict[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)
    policies: dict[str, Any] = field(default_factory=lambda: dict(POLICY_DEFAULTS))
    static: bool = False
    enabled: bool = True
    paused: bool = False
    run_now_pending: bool = False
    start_at: str | None = None
    expires_at: str | None = None
    last_run_us: int | None = None
    total_run_count: int = 0
    #: A run claimed and not yet accepted by the broker (the run ledger): since when, on
    #: the database's clock; the leading beat sends it until the broker takes it.
    pending_since_us: int | None = None
    updated_at: int | None = None
    updated_by: str | None = None

    @property
    def schedule_text(self) -> str:
        return describe(self.spec) if self.spec else "(static)"

    def as_dict(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in self.__dataclass_fields__}
        out["schedule"] = self.schedule_text
        return out


def merge(static: Mapping[str, Mapping[str, Any]], rows: Sequence[EntryRow]) -> dict[str, Entry]:
    """Static ``beat_schedule`` entries with their overlays, and the dynamic entries."""
    overlays = {r.name: r for r in rows if not r.deleted}
    out: dict[str, Entry] = {}
    for name, item in static.items():
        row = overlays.pop(name, None)
        if row is not None and row.task is not None:
            overlays[name] = row  # a dynamic entry shadows nothing: keep it apart below
            row = None
        spec: dict[str, Any] = {}
        with contextlib.suppress(ConfigurationError):
            spec = to_spec(item.get("schedule"))
        policies = check_policies({**(item.get("options") or {}).get("election", {}),
                                   **(row.spec if row is not None else {})})  # fmt: skip
        out[name] = Entry(
            name=name,
            task=str(item.get("task")),
            spec=spec,
            args=list(item.get("args") or ()),
            kwargs=dict(item.get("kwargs") or {}),
            options={k: v for k, v in (item.get("options") or {}).items() if k != "election"},
            policies=policies,
            static=True,
            enabled=row.enabled if row is not None else True,
            paused=row.paused if row is not None else False,
            run_now_pending=row is not None and row.run_now_at is not None,
            updated_at=None if row is None else row.updated_at,
            updated_by=None if row is None else row.updated_by,
        )
    for name, row in overlays.items():
        if row.task is None:
            continue  # an overlay whose static entry a deploy removed
        out[name] = dynamic_entry(row)
    return out


def dynamic_entry(row: EntryRow) -> Entry:
    spec = row.spec
    return Entry(
        name=row.name,
        task=str(row.task),
        spec=dict(spec.get("schedule") or {}),
        args=list(spec.get("args") or ()),
        kwargs=dict(spec.get("kwargs") or {}),
        options=dict(spec.get("options") or {}),
        policies=check_policies(spec),
        enabled=row.enabled,
        paused=row.paused,
        run_now_pending=row.run_now_at is not None,
        start_at=spec.get("start_at"),
        expires_at=spec.get("expires_at"),
        updated_at=row.updated_at,
        updated_by=row.updated_by,
    )


# -- the API ----------------------------------------------------------------------------------


def default_actor() -> str:
    try:
        user = getpass.getuser()
    except Exception:  # no user name (a container without one): the host says enough
        user = "?"
    return f"{user}@{socket.gethostname()}"


class Schedule:
    """The operable schedule of an app's beats, from any process.

    A worker, a shell, a web handler: each method is one short transaction; ``actor`` is
    recorded with each change.
    """

    def __init__(
        self,
        app: Celery,
        *,
        namespace: str | None = None,
        actor: str | None = None,
        backend: SQLBackend | None = None,
        check_tasks: bool = True,
    ) -> None:
        self.app = app
        #: Refuse task names the app's modules do not register (off: a process that does
        #: not load the app's modules, e.g. ``celery-election --url``).
        self.check_tasks = check_tasks
        settings = ElectionSettings.from_app(app)
        self.namespace = namespace or settings.beat_namespace
        #: Election namespaces whose beats may hold the run state (standalone, embedded).
        self.run_namespaces = (self.namespace, settings.namespace)
        self.actor = actor or default_actor()
        self._owned = backend is None
        if backend is None:
            made = backend_from_url(settings.url, **settings.backend_options(listen=False))
            if not isinstance(made, SQLBackend):
                made.close()
                raise ConfigurationError(
                    f"the operable schedule needs a SQL election database (election_url): "
                    f"{made.description} has no tables"
                )
            backend = made
        self.backend = backend
        store = schedule_store(backend)
        assert store is not None  # a SQL backend (checked above)
        self.store: SQLScheduleStore = store

    def close(self) -> None:
        if self._owned:
            self.backend.close()

    def __enter__(self) -> Schedule:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- reading ----------------------------------------------------------------------------

    def list(self) -> builtins.list[Entry]:
        """Every entry (static and dynamic), by name, with its last run."""
        entries = merge(self._static(), self.store.entries(self.namespace))
        runs = self._runs()
        pending = self._pending()
        out = []
        for name in sorted(entries):
            entry = entries[name]
            run = runs.get(name)
            if run is not None:
                entry = _with_run(entry, run)
            if name in pending:
                entry = replace(entry, pending_since_us=pending[name])
            out.append(entry)
        return out

    def get(self, name: str) -> Entry:
        for entry in self.list():
            if entry.name == name:
                return entry
        raise ConfigurationError(f"no schedule entry {name!r} in namespace {self.namespace!r}")

    def history(
        self, name: str, *, limit: int = 20, before: int | None = None
    ) -> builtins.list[RunRecord]:
        """The entry's runs, newest first (``before``: a run's ``sent_at``, the next page)."""
        return self.store.history(self.run_namespaces, name, limit=limit, before=before)

    def _static(self) -> dict[str, Mapping[str, Any]]:
        return dict(self.app.conf.beat_schedule or {})

    def _runs(self) -> dict[str, RunState]:
        runs: dict[str, RunState] = {}
        beat = self.backend.beat
        for ns in dict.fromkeys(self.run_namespaces):
            for name, state in beat.load_runs(ns).items():
                if name not in runs or state.last_run_us > runs[name].last_run_us:
                    runs[name] = state
        return runs

    def _pending(self) -> dict[str, int]:
        """Entries with a run claimed and not yet sent: since when (the earliest claim)."""
        out: dict[str, int] = {}
        for ns in dict.fromkeys(self.run_namespaces):
            for run in self.backend.beat.pending_runs(ns):
                name = run.entry_name
                out[name] = min(out.get(name, run.claimed_us), run.claimed_us)
        return out

    # -- changes ----------------------------------------------------------------------------

    def add(
        self,
        name: str,
        task: str,
        schedule: Any,
        *,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        options: Mapping[str, Any] | None = None,
        tz: str | None = None,
        enabled: bool = True,
        start_at: datetime | str | None = None,
        expires_at: datetime | str | None = None,
        check_task: bool = True,
        **policies: Any,
    ) -> Entry:
        """Add a dynamic entry (refused if an entry of that name exists)."""
        _check_name(name)
        if name in self._static():
            raise ConfigurationError(
                f"{name!r} is a static beat_schedule entry: pause it, run it or set its "
                f"policies here; change it in the code"
            )
        fields = {"args": args, "kwargs": kwargs, "options": options, "start_at": start_at,
                  "expires_at": expires_at, **policies}  # fmt: skip
        spec = self._spec(task, schedule, tz, fields, check_task)

        def work(current: EntryRow | None, now: int) -> tuple[dict[str, Any], dict[str, Any]]:
            if current is not None:
                raise ConfigurationError(
                    f"schedule entry {name!r} exists: edit it (update) or remove it first"
                )
            return {"task": task, "spec": _json(spec), "enabled": enabled, "deleted": False}, {
                "task": task, **spec, "enabled": enabled}  # fmt: skip

        return self._entry(self.store.change(self.namespace, name, "add", self.actor, work))

    def update(self, name: str, **changes: Any) -> Entry:
        """Edit a dynamic entry, or a static entry's policies.

        A dynamic entry's task, schedule, tz, args, kwargs, options, start_at, expires_at
        and policies can change.
        """
        check_task = changes.pop("check_task", True)
        static = name in self._static()

        def work(current: EntryRow | None, now: int) -> tuple[dict[str, Any], dict[str, Any]]:
            current = self._existing(name, current, static)
            if current.task is None or static:
                unknown = set(changes) - set(POLICY_DEFAULTS)
                if unknown:
                    raise ConfigurationError(
                        f"{name!r} is a static beat_schedule entry: only its policies "
                        f"({', '.join(POLICY_DEFAULTS)}) can change here, not "
                        f"{', '.join(sorted(unknown))}"
                    )
                spec = {**current.spec, **changes}
                check_policies(spec)
                return {"spec": _json(spec)}, changes
            spec = dict(current.spec)
            task = str(changes.get("task", current.task))
            schedule = changes.get("schedule", spec.get("schedule"))
            tz = changes.get("tz", (spec.get("schedule") or {}).get("tz"))
            if isinstance(schedule, dict) and "cron" in schedule:
                schedule = {**schedule, "tz": tz}  # a new zone for the stored crontab
            fields = {**spec, **changes}  # what changes, else what is stored
            new = self._spec(task, schedule, tz, fields, check_task and "task" in changes)
            return {"task": task, "spec": _json(new)}, changes

        return self._entry(self.store.change(self.namespace, name, "edit", self.actor, work))

    def pause(self, name: str) -> Entry:
        """Stop sending the entry (what falls due while paused: see ``resume``)."""
        return self._set(name, "pause", lambda row, now: {"paused_at": row.paused_at or now})

    def resume(self, name: str, *, missed: str = "skip") -> Entry:
        """Send the entry again.

        ``missed="skip"``: what fell due while paused is not sent; ``"catch_up"``: it is
        caught up per the entry's ``catch_up`` policy.
        """
        if missed not in RESUME:
            raise ConfigurationError(f"missed must be one of {', '.join(RESUME)}: got {missed!r}")

        def values(row: EntryRow, now: int) -> dict[str, Any]:
            skip = now if missed == "skip" and row.paused_at is not None else row.skip_before
            return {"paused_at": None, "skip_before": skip}

        return self._set(name, "resume", values, {"missed": missed})

    def enable(self, name: str) -> Entry:
        return self._set(name, "enable", lambda row, now: {"enabled": True})

    def disable(self, name: str) -> Entry:
        return self._set(name, "disable", lambda row, now: {"enabled": False})

    def run_now(self, name: str) -> bool:
        """Ask the leader for one extra run; False if one is already pending (one run)."""
        pending = False

        def values(row: EntryRow, now: int) -> dict[str, Any]:
            nonlocal pending
            pending = row.run_now_at is not None
            return {"run_now_at": row.run_now_at if pending else now}

        self._set(name, "run_now", values)
        return not pending

    def remove(self, name: str) -> None:
        """Delete a dynamic entry (its history stays until the retention prunes it)."""

        def work(current: EntryRow | None, now: int) -> tuple[dict[str, Any], dict[str, Any]]:
            current = self._existing(name, current)
            if current.task is None or name in self._static():
                raise ConfigurationError(
                    f"{name!r} is a static beat_schedule entry: remove it from the code "
                    f"(or disable it here)"
                )
            return {"deleted": True, "run_now_at": None}, {}

        self.store.change(self.namespace, name, "remove", self.actor, work)

    def _set(
        self, name: str, action: str, values: Any, detail: dict[str, Any] | None = None
    ) -> Entry:
        static = name in self._static()

        def work(current: EntryRow | None, now: int) -> tuple[dict[str, Any], dict[str, Any]]:
            current = self._existing(name, current, static)
            return values(current, now), dict(detail or {})

        return self._entry(self.store.change(self.namespace, name, action, self.actor, work))

    def _existing(self, name: str, current: EntryRow | None, static: bool = False) -> EntryRow:
        if current is None and static:  # the static entry's first overlay row
            return EntryRow(name=name, task=None, spec={})
        if current is None:
            raise ConfigurationError(
                f"no schedule entry {name!r} in namespace {self.namespace!r} "
                f"(`election schedule list` shows them)"
            )
        return current

    def _entry(self, row: EntryRow) -> Entry:
        return merge(self._static(), [row])[row.name]

    def _spec(
        self, task: str, schedule: Any, tz: str | None, fields: Mapping[str, Any], check_task: bool
    ) -> dict[str, Any]:
        """The stored spec of an entry: its schedule, ``fields``' arguments, window, policies."""
        if check_task and self.check_tasks:
            self._check_task(task)
        spec: dict[str, Any] = {"schedule": to_spec(schedule, tz=tz)}
        spec["args"] = _jsonable(list(fields.get("args") or ()), "args")
        spec["kwargs"] = _jsonable(dict(fields.get("kwargs") or {}), "kwargs")
        spec["options"] = _jsonable(dict(fields.get("options") or {}), "options")
        for key in ("start_at", "expires_at"):
            if fields.get(key) is not None:
                spec[key] = instant(fields[key]).isoformat()
        spec.update(check_policies(fields))
        return spec

    def _check_task(self, task: str) -> None:
        """A task name that no module of the app registers is a typo until shown otherwise."""
        if not isinstance(task, str) or not task:
            raise ConfigurationError(f"a task name is needed: got {task!r}")
        if task in self.app.tasks:
            return
        # the app's modules are the user's: a broken one is theirs, the name is ours
        with contextlib.suppress(Exception):
            self.app.loader.import_default_modules()
        if task not in self.app.tasks:
            raise ConfigurationError(
                f"no task {task!r} is registered by the app's modules (include=, imports, "
                f"autodiscovery); fix the name, or pass check_task=False (--no-check-task) "
                f"if only the workers import it"
            )


def _with_run(entry: Entry, run: RunState) -> Entry:
    return replace(entry, last_run_us=run.last_run_us, total_run_count=run.total_run_count)


def _check_name(name: object) -> None:
    if not isinstance(name, str) or not name.strip() or len(name) > 200:
        raise ConfigurationError(f"an entry name is 1-200 characters: got {name!r}")


def _jsonable(value: Any, what: str) -> Any:
    try:
        return json.loads(json.dumps(value))
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(
            f"{what} must be JSON (numbers, text, lists, maps): {exc}"
        ) from None


def _json(spec: Mapping[str, Any]) -> str:
    return json.dumps(spec, sort_keys=True)
