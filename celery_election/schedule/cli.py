"""``celery -A proj election schedule ...``: operate the beats' schedule from any shell.

    celery -A proj election schedule list [--json]
    celery -A proj election schedule show NAME | history NAME [--limit N] [--json]
    celery -A proj election schedule add NAME TASK "every 10s" [--kwargs '{"a": 1}'] ...
    celery -A proj election schedule edit NAME [--schedule "*/5 * * * *" --tz Europe/Paris]
    celery -A proj election schedule pause | resume [--missed skip|catch_up] | run NAME
    celery -A proj election schedule enable | disable | remove NAME

The same operations as ``celery_election.schedule.Schedule``, each one transaction,
recorded with ``--as`` (default: user@host). ``celery-election --url ... schedule`` works
too, without the app's static entries or its task names.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Any

import click
from celery import Celery

from ..errors import ElectionError
from .api import Entry, Schedule
from .spec import CATCH_UP, OVERLAP, POLICY_DEFAULTS, RESUME

__all__ = ["command_app", "schedule"]


def _when(us: int | None) -> str | None:
    if us is None:
        return None
    return datetime.fromtimestamp(us / 1e6, tz=timezone.utc).isoformat(timespec="seconds")


def command_app(ctx: click.Context, command: str) -> tuple[Any, bool]:
    """The ``-A`` app (True), or a bare app on ``--url`` (False).

    The ``election`` group's ``--url``/``--table-prefix`` apply as settings, validated as
    any settings are.
    """
    params: dict[str, Any] = {}
    node: click.Context | None = ctx
    while node is not None:
        if node.command.name == "election":
            params = dict(node.params)
        node = node.parent
    app = getattr(ctx.find_root().obj, "app", None)
    given = app is not None
    if app is None:
        if not params.get("url"):
            raise click.UsageError(
                f"give the election database: --url URL (or CELERY_ELECTION_URL), or run "
                f"it as `celery -A proj election {command} ...` to use the app's settings"
            )
        app = Celery("celery-election", set_as_current=False)  # no project: --url alone
    overrides = {"url": params.get("url"), "table_prefix": params.get("table_prefix")}
    app.conf.update({f"election_{k}": v for k, v in overrides.items() if v})
    return app, given


@contextmanager
def _opened(ctx: click.Context) -> Iterator[Schedule]:
    """The Schedule the command acts on; errors become one line."""
    group = ctx.parent.params if ctx.parent is not None else {}  # the schedule group's
    app, given = command_app(ctx, "schedule")
    try:
        # without the app, its task names are unknown here
        s = Schedule(app, namespace=group.get("namespace"), actor=group.get("actor"),
                     check_tasks=given)  # fmt: skip
    except ElectionError as exc:
        raise click.ClickException(str(exc)) from exc
    try:
        yield s
    except ElectionError as exc:
        raise click.ClickException(str(exc)) from exc
    finally:
        s.close()


@click.group(name="schedule")
@click.option("--namespace", "-N", help="The beats' namespace (default: election_beat_namespace).")
@click.option("--as", "actor", help="Who is acting, for the audit (default: user@host).")
@click.pass_context
def schedule(ctx: click.Context, namespace: str | None, actor: str | None) -> None:
    """Operate the beats' schedule: entries at runtime, pause, run now, history."""


def _row(e: Entry) -> list[str]:
    state = "enabled" if e.enabled else "disabled"
    if e.paused:
        state = "paused"
    if e.run_now_pending:
        state += " +run now"
    if e.pending_since_us is not None:  # claimed, the broker has not taken it yet
        state += f" +unsent since {_when(e.pending_since_us)}"
    policies = [f"{k}={v}" for k, v in e.policies.items() if v != POLICY_DEFAULTS.get(k)]
    return [
        e.name,
        e.task,
        e.schedule_text,
        state,
        _when(e.last_run_us) or "-",
        str(e.total_run_count),
        "static" if e.static else "dynamic",
        " ".join(policies) or "-",
    ]


def _table(header: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, *rows]:
        click.echo("  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())


@schedule.command(name="list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def list_entries(ctx: click.Context, as_json: bool) -> None:
    """Every entry, static and dynamic, with its state and last run."""
    with _opened(ctx) as s:
        entries = s.list()
    if as_json:
        click.echo(json.dumps([e.as_dict() for e in entries], default=str))
        return
    header = ["NAME", "TASK", "SCHEDULE", "STATE", "LAST RUN (UTC)", "RUNS", "KIND", "POLICIES"]
    _table(header, [_row(e) for e in entries])


@schedule.command()
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def show(ctx: click.Context, name: str, as_json: bool) -> None:
    """One entry in full."""
    with _opened(ctx) as s:
        entry = s.get(name)
    info = entry.as_dict()
    if as_json:
        click.echo(json.dumps(info, default=str))
        return
    info["last_run_us"] = _when(entry.last_run_us)
    info["updated_at"] = _when(entry.updated_at)
    for key, value in info.items():
        text = json.dumps(value, default=str) if isinstance(value, (dict, list)) else value
        click.echo(f"{key:<16}{text}")


@schedule.command()
@click.argument("name")
@click.option("--limit", default=20, show_default=True, help="How many runs.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def history(ctx: click.Context, name: str, limit: int, as_json: bool) -> None:
    """The entry's runs, newest first: sent, missed, skipped, and how they ended."""
    with _opened(ctx) as s:
        runs = s.history(name, limit=limit)
    if as_json:
        click.echo(json.dumps([r.__dict__ for r in runs]))
        return
    rows = [
        [
            _when(r.sent_at) or "-",
            r.kind if r.count == 1 else f"{r.kind} x{r.count}",
            str(r.term),
            r.task_id or "-",
            r.status or "-",
            "-" if r.duration_us is None else f"{r.duration_us / 1e6:.3f}s",
        ]
        for r in runs
    ]
    _table(["AT (UTC)", "KIND", "TERM", "TASK ID", "OUTCOME", "DURATION"], rows)


def _load(value: str | None, what: str) -> Any:
    if value is None:
        return None
    try:
        return json.loads(value)
    except ValueError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint=what) from None


def _entry_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """What add and edit both take: arguments, options, time zone, window, policies."""
    options = [
        click.option("--catch-up", type=click.Choice(CATCH_UP), help="latest, skip or all."),
        click.option("--catch-up-max", type=int, help="catch_up=all: at most this many."),
        click.option("--grace", type=float, help="A run later than this (s) is missed."),
        click.option("--overlap", type=click.Choice(OVERLAP), help="skip: not while running."),
        click.option("--overlap-timeout", type=float, help="A run older (s) no longer blocks."),
        click.option("--args", help="Positional arguments (JSON)"),
        click.option("--kwargs", help="Keyword arguments (JSON)"),
        click.option("--options", help='apply_async options, e.g. {"queue": "q"} (JSON)'),
        click.option("--tz", help="The crontab's time zone (IANA name; default: the app's)."),
        click.option("--start", help="Not before this time (ISO 8601 with a zone)."),
        click.option("--expires", help="Not after this time (ISO 8601 with a zone)."),
        click.option("--no-check-task", is_flag=True, help="Accept a task this app does not know."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def _given(kw: dict[str, Any]) -> dict[str, Any]:
    """The :func:`_entry_options` given, as ``Schedule.add``/``update`` arguments."""
    changes: dict[str, Any] = {k: kw[k] for k in POLICY_DEFAULTS if kw.get(k) is not None}
    for key in ("args", "kwargs", "options"):
        if kw[key] is not None:
            changes[key] = _load(kw[key], f"--{key}")
    for key, arg in (("tz", "tz"), ("start_at", "start"), ("expires_at", "expires")):
        if kw[arg] is not None:
            changes[key] = kw[arg]
    return changes


@schedule.command()
@click.argument("name")
@click.argument("task")
@click.argument("when", metavar="SCHEDULE")
@click.option("--disabled", is_flag=True, help="Add it disabled.")
@_entry_options
@click.pass_context
def add(ctx: click.Context, /, name: str, task: str, when: str, **kw: Any) -> None:
    """Add an entry.

    SCHEDULE: 'every 10s' (s/m/h/d), a crontab '*/5 * * * *', 'at ISO-TIME' or
    'sunrise LAT LON'.
    """
    with _opened(ctx) as s:
        entry = s.add(name, task, when, enabled=not kw["disabled"],
                      check_task=not kw["no_check_task"], **_given(kw))  # fmt: skip
    click.echo(f"added {entry.name}: {entry.task} {entry.schedule_text}")


@schedule.command()
@click.argument("name")
@click.option("--task", help="Another task.")
@click.option("--schedule", "when", help="Another schedule (as for add).")
@_entry_options
@click.pass_context
def edit(ctx: click.Context, /, name: str, **kw: Any) -> None:
    """Change an entry (a static one: only its policies)."""
    changes = _given(kw)
    for key, arg in (("task", "task"), ("schedule", "when")):
        if kw[arg] is not None:
            changes[key] = kw[arg]
    if not changes:
        raise click.UsageError("nothing to change: give --schedule, --task, a policy, ...")
    with _opened(ctx) as s:
        entry = s.update(name, check_task=not kw["no_check_task"], **changes)
    click.echo(f"edited {entry.name}: {entry.task} {entry.schedule_text}")


def _simple(action: str, doc: str) -> None:
    @schedule.command(name=action, help=doc)
    @click.argument("name")
    @click.pass_context
    def command(ctx: click.Context, name: str) -> None:
        with _opened(ctx) as s:
            getattr(s, action)(name)
        click.echo(f"{action}d {name}" if action.endswith("e") else f"{action}ed {name}")


_simple("pause", "Stop sending an entry until it is resumed.")
_simple("enable", "Enable an entry.")
_simple("disable", "Disable an entry.")
_simple("remove", "Delete a dynamic entry.")


@schedule.command()
@click.argument("name")
@click.option(
    "--missed",
    type=click.Choice(RESUME),
    default="skip",
    show_default=True,
    help="What fell due while paused: skip it, or catch it up per the entry's policy.",
)
@click.pass_context
def resume(ctx: click.Context, name: str, missed: str) -> None:
    """Send a paused entry again."""
    with _opened(ctx) as s:
        s.resume(name, missed=missed)
    click.echo(f"resumed {name} (missed runs: {missed})")


@schedule.command(name="run")
@click.argument("name")
@click.pass_context
def run_now(ctx: click.Context, name: str) -> None:
    """Run an entry once now (the leader sends it within a second; two clicks: one run)."""
    with _opened(ctx) as s:
        requested = s.run_now(name)
    click.echo(f"run of {name} requested" if requested else f"a run of {name} is already pending")
