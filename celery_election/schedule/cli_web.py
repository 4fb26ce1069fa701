"""``celery -A proj election web``: the schedule page, served until Ctrl-C.

    celery -A proj election web [--bind 127.0.0.1] [--port 8080] [--token TOKEN]
    CELERY_ELECTION_WEB_TOKEN=ops:s3cret celery -A proj election web
    celery-election --url postgresql+psycopg://... web      (no static entries, no task names)

Read-only without a token. The page and its API are ``celery_election.web``'s WSGI app,
served by the standard library's server, one thread a request.
"""

from __future__ import annotations

import ipaddress
import logging

import click

from ..errors import ElectionError
from .cli import command_app

__all__ = ["web"]

log = logging.getLogger("celery_election.web")


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@click.command(name="web")
@click.option("--bind", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8080, show_default=True, help="Port (0: a free one).")
@click.option(
    "--token",
    "tokens",
    multiple=True,
    envvar="CELERY_ELECTION_WEB_TOKEN",
    help="Allow actions to who sends it (NAME:SECRET records NAME); repeatable. "
    "Without one the page is read-only. [env: CELERY_ELECTION_WEB_TOKEN]",
)
@click.option("--namespace", "-N", help="The beats' namespace (default: election_beat_namespace).")
@click.pass_context
def web(
    ctx: click.Context, bind: str, port: int, tokens: tuple[str, ...], namespace: str | None
) -> None:
    """Serve the schedule page: leaders, entries, history; actions with --token."""
    from .web import make_app, server

    app, _ = command_app(ctx, "web")
    try:
        page = make_app(app, token=list(tokens) or None, namespace=namespace)
    except ElectionError as exc:
        raise click.ClickException(str(exc)) from exc
    try:
        httpd = server(page, bind=bind, port=port)
    except OSError as exc:
        page.close()
        raise click.ClickException(f"cannot listen on {bind}:{port}: {exc}") from exc
    where = httpd.server_address
    host = f"[{where[0]}]" if ":" in str(where[0]) else where[0]
    mode = "actions allowed with the token" if page.can_act else "read-only (no --token)"
    click.echo(f"schedule page: http://{host}:{where[1]}/ ({mode}; Ctrl-C stops)", err=True)
    click.echo(f"election database: {page.observer.database}", err=True)
    if not _loopback(bind):
        click.echo(
            f"warning: listening on {bind}: whoever reaches it reads the schedule; put it "
            f"behind your proxy's authentication or mount make_app(..., protect_reads=True)",
            err=True,
        )
    try:
        httpd.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        httpd.server_close()
        page.close()
