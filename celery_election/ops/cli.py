"""``celery election ...`` (with ``-A proj``) and ``celery-election ...`` (with ``--url``).

    celery -A proj election status [--namespace NS | --all] [--json]
    celery -A proj election candidates | resign | watch | transfer NODE
    celery -A proj election install [--dry-run] | uninstall [--dry-run] [--yes]
    celery -A proj election health [--ready] [--port N]     (exit 0/1: an exec probe)
    celery -A proj election web [--bind 127.0.0.1] [--port 8080] [--token TOKEN]
    celery -A proj election keys [--json] | release KEY [--term N]   (singleton tasks)
    celery-election --url postgresql+psycopg://... status
    celery-election demo [--url ...]

Under ``celery`` the app's ``election_*`` settings are used (``--url``/``--table-prefix``
override them); ``celery-election`` needs ``--url`` (or CELERY_ELECTION_URL) for everything
but ``demo``. Every time shown comes from the database's clock.
"""

from __future__ import annotations

import json
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import click

from ..backends import Backend, SQLBackend, backend_from_url
from ..backends.sql import DEFAULT_TABLE_PREFIX
from ..core.lease import CandidateInfo, Lease
from ..errors import ElectionError, SchemaMissingError
from ..keys.cli import key_commands
from ..schedule.cli import schedule
from ..schedule.cli_web import web
from ..settings import is_postgres

__all__ = ["election", "main"]


@dataclass
class Target:
    """Where the commands act: a backend and a default namespace."""

    backend: Backend
    namespace: str

    @property
    def sql(self) -> SQLBackend:
        """The backend, where a command needs SQL (DDL, a database file)."""
        if not isinstance(self.backend, SQLBackend):
            raise click.ClickException(f"{self.backend.description} is not a SQL database")
        return self.backend

    def close(self) -> None:
        self.backend.close()


def _target(ctx: click.Context, namespace: str | None) -> Target:
    params = ctx.parent.params if ctx.parent is not None else {}  # the election group's
    url = params.get("url")
    prefix = params.get("table_prefix")
    app = getattr(ctx.obj, "app", None)
    try:
        if app is not None:
            from ..settings import ElectionSettings

            settings = ElectionSettings.from_app(app)
            if url:  # --url wins over the app's election_url
                settings = replace(settings, url=url, listen_url=None)
            options = settings.backend_options(listen=False)
            if prefix:
                options["table_prefix"] = prefix
            return Target(
                backend_from_url(settings.url, **options), namespace or settings.namespace
            )
        if not url:
            raise click.UsageError(
                "give the election database: --url URL (or CELERY_ELECTION_URL), "
                "or run it as `celery -A proj election ...` to use the app's settings"
            )
        plain: dict[str, Any] = {"table_prefix": prefix or DEFAULT_TABLE_PREFIX}
        if is_postgres(url):
            plain["listen"] = False  # one-shot commands never LISTEN
        return Target(backend_from_url(url, **plain), namespace or "default")
    except ElectionError as exc:
        raise click.ClickException(str(exc)) from exc


@contextmanager
def _using(ctx: click.Context, namespace: str | None, *, known: bool = True) -> Iterator[Target]:
    """The target of a command; errors become one clear line, the backend is closed."""
    t = _target(ctx, namespace)
    try:
        if known:
            _check_exists(t)
            _check_namespace(t)
        yield t
    except ElectionError as exc:
        raise click.ClickException(str(exc)) from exc
    finally:
        t.close()


def _check_exists(t: Target) -> None:
    """Reading a SQLite file that is not there would create it: refuse instead."""
    if isinstance(t.backend, SQLBackend) and t.backend.dialect == "sqlite":
        path = Path(t.backend.engine.url.database or "")
        if not path.exists():
            raise click.ClickException(
                f"no election database at {path}: check the URL, or create it with "
                f"`celery -A proj election install` (your app for proj)"
            )


def _check_namespace(t: Target) -> None:
    known = t.backend.namespaces()
    if t.namespace not in known:
        hint = f"known: {', '.join(known)}" if known else "no election has run here yet"
        raise click.ClickException(f"no election in namespace {t.namespace!r} ({hint})")


def _candidate_json(c: CandidateInfo, db_now_us: int) -> dict[str, Any]:
    return {
        "candidate_id": c.candidate_id,
        "hostname": c.hostname,
        "pid": c.pid,
        "heartbeat_age": round((db_now_us - c.heartbeat_at_us) / 1e6, 3),
        "eligible": c.eligible,
        "release": c.release,
    }


def _status(t: Target) -> dict[str, Any]:
    lease: Lease | None = t.backend.current(t.namespace)
    now = lease.db_now_us if lease is not None else 0
    candidates = t.backend.candidates(t.namespace)
    if lease is None and candidates:
        now = max(c.heartbeat_at_us for c in candidates)
    held = lease is not None and lease.held
    return {
        "namespace": t.namespace,
        "database": t.backend.description,
        "leader": lease.leader_id if held and lease is not None else None,
        "term": lease.term if lease is not None else None,
        "expires_in": round(lease.remaining, 3) if lease is not None and held else None,
        "acquired_at": lease.acquired_at.isoformat()
        if lease is not None and held and lease.acquired_at
        else None,
        # the leader's liveness delta when its trust is bound by the lock, else None
        "liveness": None
        if lease is None or not held or lease.liveness_us is None
        else lease.liveness_us / 1_000_000,
        "candidates": [_candidate_json(c, now) for c in candidates],
        # live candidates that may take a term: with none, nobody leads
        "eligible_candidates": sum(c.eligible for c in candidates),
        # beat runs claimed and not yet sent: the next leader sends them (the run ledger)
        "pending_runs": _pending(t, now),
    }


def _pending(t: Target, now_us: int) -> list[dict[str, Any]]:
    """The namespace's beat runs claimed and not yet sent, the oldest first."""
    return [
        {"entry": p.entry_name, "term": p.state.term, "age": max(0, now_us - p.claimed_us) / 1e6,
         "run_now": p.run_now}
        for p in t.backend.beat.pending_runs(t.namespace)
    ]  # fmt: skip


# -- the group ------------------------------------------------------------------------------


@click.group(name="election")
@click.option("--url", envvar="CELERY_ELECTION_URL", help="Election database URL.")
@click.option("--table-prefix", help=f"Table prefix (default {DEFAULT_TABLE_PREFIX!r}).")
@click.pass_context
def election(ctx: click.Context, url: str | None, table_prefix: str | None) -> None:
    """Leader election: who leads, who stands by, and the tables behind it."""


_namespace = click.option("--namespace", "-N", help="Election namespace (default: the app's).")


@election.command()
@_namespace
@click.option(
    "--all", "every", is_flag=True, help="Every namespace in the database (beats: <ns>-beat)."
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def status(ctx: click.Context, namespace: str | None, every: bool, as_json: bool) -> None:
    """Show the leader, its term, when its lease expires, and the live candidates."""
    if every and namespace:
        raise click.UsageError("give --all or --namespace, not both")
    with _using(ctx, namespace, known=not every) as t:
        if every:
            _check_exists(t)
            infos = [_status(replace(t, namespace=ns)) for ns in t.backend.namespaces()]
        else:
            infos = [_status(t)]
    if as_json:
        click.echo(json.dumps(infos if every else infos[0]))
        return
    if every and not infos:
        click.echo(f"no election has run in {t.backend.description} yet")
    for n, info in enumerate(infos):
        if n:
            click.echo("")
        _print_status(info)


def _print_status(info: dict[str, Any]) -> None:
    click.echo(f"namespace   {info['namespace']}  ({info['database']})")
    if info["leader"]:
        click.echo(f"leader      {info['leader']}")
        click.echo(f"term        {info['term']}")
        click.echo(f"expires in  {info['expires_in']:.3f} s (database clock)")
        live = info["liveness"]
        click.echo(
            f"liveness    on: replaced about {live:g} s after it dies"
            if live is not None
            else "liveness    off: replaced when its lease ends"
        )
    else:
        click.echo(f"leader      none (last term {info['term']})")
        if info["candidates"] and not info["eligible_candidates"]:
            click.echo(
                "            no eligible candidate is live: every live candidate runs with "
                "--no-election-eligible (election_eligible=False); start one that may lead"
            )
    pending = info["pending_runs"]
    if pending:
        click.echo(f"pending     {len(pending)} beat runs claimed and not yet sent "
                   f"(oldest {pending[0]['age']:.1f} s: {pending[0]['entry']})")  # fmt: skip
    click.echo(f"candidates  {len(info['candidates'])}")
    for c in info["candidates"]:
        mark = "*" if c["candidate_id"] == info["leader"] else " "
        click.echo(
            f"  {mark} {c['candidate_id']}  host={c['hostname']} pid={c['pid']} "
            f"heartbeat {c['heartbeat_age']:.1f} s ago release={c['release'] or '?'}"
            f"{'' if c['eligible'] else '  ineligible'}"
        )


@election.command()
@_namespace
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def candidates(ctx: click.Context, namespace: str | None, as_json: bool) -> None:
    """List the live candidates (heartbeat not expired)."""
    with _using(ctx, namespace) as t:
        info = _status(t)
    if as_json:
        click.echo(json.dumps(info["candidates"]))
        return
    for c in info["candidates"]:
        mark = "" if c["eligible"] else "\tineligible"
        click.echo(
            f"{c['candidate_id']}\t{c['hostname']}\t{c['pid']}\t{c['heartbeat_age']:.1f}s{mark}"
        )


@election.command()
@_namespace
@click.pass_context
def resign(ctx: click.Context, namespace: str | None) -> None:
    """Vacate the current term so the candidates elect again now.

    Term-scoped: if the lease changed hands meanwhile, nothing happens. The resigned
    leader learns it at its next renewal (within renew_interval) and steps down; prefer
    ``celery control election_resign`` where remote control works.
    """
    with _using(ctx, namespace) as t:
        lease = t.backend.current(t.namespace)
        if lease is None or not lease.held or lease.token is None:
            raise click.ClickException(f"namespace {t.namespace!r} has no leader to resign")
        if not t.backend.resign(t.namespace, lease.token, lease.term):
            raise click.ClickException("the lease changed hands meanwhile; nothing resigned")
    click.echo(f"resigned term {lease.term} of {lease.leader_id}")


@election.command()
@click.argument("node")
@_namespace
@click.option("--wait", default=30.0, show_default=True, help="Seconds to wait for the move.")
@click.pass_context
def transfer(ctx: click.Context, node: str, namespace: str | None, wait: float) -> None:
    """Move leadership to NODE (a candidate id, or a worker's node name such as w2@host).

    NODE must be a live candidate that may lead. The request goes on the lease row, for
    the leader's term only; the leader acts on it at its next renewal (within
    renew_interval): its belief ends, then one conditional write hands the term to NODE.
    """
    from ..core.transfer import TransferRefusedError, pick_target

    with _using(ctx, namespace) as t:
        ns = t.namespace
        lease = t.backend.current(ns)
        if lease is None or not lease.held or lease.token is None:
            raise click.ClickException(f"namespace {ns!r} has no leader to transfer from")
        try:
            target = pick_target(t.backend.candidates(ns), node, ns, lease.token)
        except TransferRefusedError as exc:
            raise click.ClickException(str(exc)) from None
        if not t.backend.ask_transfer(ns, lease, target):
            raise click.ClickException(
                f"the lease or {target.candidate_id!r} changed meanwhile; nothing asked "
                f"(see: celery election status)"
            )
        started, now = time.monotonic(), t.backend.current(ns)
        while now is None or not now.held_by(target.token):
            if time.monotonic() - started > wait:
                raise click.ClickException(
                    f"asked {lease.leader_id!r} to hand term {lease.term} to "
                    f"{target.candidate_id!r}, and it has not within {wait:g} s (an older "
                    f"release, or a leader that cannot reach the database?)"
                )
            time.sleep(0.01)
            now = t.backend.current(ns)
    click.echo(
        f"leadership of {ns!r} moved from {lease.leader_id} (term {lease.term}) to "
        f"{target.candidate_id} (term {now.term}) in {time.monotonic() - started:.3f} s"
    )


@election.command()
@click.option(
    "--port",
    type=int,
    help="The process's metrics port: what its --election-metrics-port was given "
    "(default: the election_metrics_port setting).",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Where it listens.")
@click.option("--ready", is_flag=True, help="Readiness (/readyz) instead of liveness.")
@click.option("--timeout", default=3.0, show_default=True, help="Seconds to wait.")
@click.pass_context
def health(ctx: click.Context, port: int | None, host: str, ready: bool, timeout: float) -> None:
    """Exit 0 if this host's worker or beat is healthy (or ready), else 1: an exec probe.

    Asks the process's own /healthz (/readyz) on localhost, so the verdict is the HTTP
    probe's: remote control would not reach a worker on the SQLAlchemy broker.
    """
    if port is None:
        app = getattr(ctx.obj, "app", None)
        if app is not None:
            from ..settings import ElectionSettings

            port = ElectionSettings.from_app(app).metrics_port
    if port is None:
        raise click.UsageError(
            "give --port with the port the worker or beat was started with "
            "(--election-metrics-port), or set election_metrics_port in the app"
        )
    url = f"http://{host}:{port}/{'readyz' if ready else 'healthz'}"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            body = response.read().decode()
            ok = response.status == 200
    except urllib.error.HTTPError as exc:
        body, ok = exc.read().decode(), False
    except OSError as exc:
        body, ok = f"no answer from {url}: {exc}", False
    click.echo(body.strip())
    sys.exit(0 if ok else 1)


@election.command()
@click.option("--dry-run", is_flag=True, help="Print the DDL instead of running it.")
@click.pass_context
def install(ctx: click.Context, dry_run: bool) -> None:
    """Create the election tables (idempotent)."""
    with _using(ctx, None, known=False) as t:
        if dry_run:
            for ddl in t.sql.create_ddl():
                click.echo(f"{ddl};\n")
            return
        t.backend.install()
        names = ", ".join(sorted(t.sql.metadata.tables))
        click.echo(f"installed in {t.backend.description}: {names}")


@election.command()
@click.option("--dry-run", is_flag=True, help="Print the DDL instead of running it.")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.pass_context
def uninstall(ctx: click.Context, dry_run: bool, yes: bool) -> None:
    """Drop the election tables (terms stay increasing after a re-install)."""
    with _using(ctx, None, known=False) as t:
        if dry_run:
            for ddl in t.sql.drop_ddl():
                click.echo(f"{ddl};\n")
            return
        if not yes:
            click.confirm(f"Drop the election tables in {t.backend.description}?", abort=True)
        t.backend.uninstall()
        click.echo(f"uninstalled from {t.backend.description}")


@election.command()
@_namespace
@click.option("--interval", default=0.2, show_default=True, help="Seconds between looks.")
@click.option("--max-seconds", type=float, default=None, help="Stop after this long.")
@click.pass_context
def watch(
    ctx: click.Context, namespace: str | None, interval: float, max_seconds: float | None
) -> None:
    """Print a line every time the leader or its term changes (Ctrl-C to stop)."""
    t = _target(ctx, namespace)
    end = None if max_seconds is None else time.monotonic() + max_seconds
    last: tuple[Any, ...] | None = None
    try:
        while end is None or time.monotonic() < end:
            try:
                info = _status(t)
                now = (info["leader"], info["term"], len(info["candidates"]))
            except SchemaMissingError as exc:
                raise click.ClickException(str(exc)) from exc
            except ElectionError as exc:  # keep watching through an outage
                now = ("unreachable", str(exc), 0)
            if now != last:
                stamp = time.strftime("%H:%M:%S")
                leader, term, n = now
                click.echo(f"{stamp}  leader={leader or '-'}  term={term}  candidates={n}")
                last = now
            time.sleep(interval)
    except KeyboardInterrupt:
        pass
    finally:
        t.close()


@election.command()
@click.option("--url", "demo_url", help="Run the election on this database (default SQLite).")
@click.option("--ttl", default=3.0, show_default=True, help="Lease length in seconds.")
@click.option("--keep", is_flag=True, help="Keep the temporary directory.")
@click.option(
    "--history",
    type=click.Path(dir_okay=False),
    help="Append the workers' election history here (JSON lines for harness/checker.py).",
)
def demo(demo_url: str | None, ttl: float, keep: bool, history: str | None) -> None:
    """Three `celery worker -B --election` processes: failover and handoff, live."""
    from .demo import run

    sys.exit(run(url=demo_url, ttl=ttl, keep=keep, history=history))


@contextmanager
def _using_store(ctx: click.Context, namespace: str | None) -> Iterator[Target]:
    """A target for the key commands: any namespace (keys need no election)."""
    with _using(ctx, namespace, known=False) as t:
        _check_exists(t)
        yield t


election.add_command(schedule)
election.add_command(web)
for command in key_commands(_using_store, _namespace):
    election.add_command(command)


def main() -> None:
    """The ``celery-election`` console script."""
    election(prog_name="celery-election")
