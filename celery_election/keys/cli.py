"""``celery election keys`` and ``celery election release KEY``: the singleton tasks' holds.

    celery -A proj election keys [--namespace NS] [--json]
    celery -A proj election release KEY [--namespace NS] [--term TERM]

``keys`` lists the held keys (key, holder, since, term) as the database stores them, with
times on its clock. ``release`` frees one hold, fenced: only the term it read (or the one
given with ``--term``, the term ``keys`` showed), so it never frees a hold taken after the
operator looked. The released task is not stopped: it keeps running until it returns, and
the next holder's term is greater than its own (fence your writes with the term).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, Protocol

import click

from ..backends.base import Backend
from ..core.lease import Lease

__all__ = ["key_commands"]


class Target(Protocol):
    """What a command acts on (``cli.Target``; named here, not imported: cli imports us)."""

    backend: Backend
    namespace: str


#: ``cli._using`` with ``known=False``: the target, errors as one line, closed after.
Using = Callable[[click.Context, "str | None"], AbstractContextManager[Target]]


def _hold_json(h: Lease) -> dict[str, Any]:
    since = h.acquired_at
    return {
        "key": h.key,
        "holder": h.leader_id,
        "since": since.isoformat() if since is not None else None,
        "held_for": None
        if h.acquired_at_us is None
        else round(max(0, h.db_now_us - h.acquired_at_us) / 1e6, 3),
        "term": h.term,
        "expires_in": round(h.remaining, 3),
        # the holder's liveness delta: its keys free about this long after it dies
        "liveness": None if h.liveness_us is None else h.liveness_us / 1e6,
    }


def show_keys(t: Target, as_json: bool) -> None:
    """Print the held keys: a table, or JSON."""
    held = [_hold_json(h) for h in t.backend.keys.held(t.namespace)]
    if as_json:
        click.echo(json.dumps(held))
        return
    if not held:
        click.echo(f"no key is held in namespace {t.namespace!r} ({t.backend.description})")
        return
    rows = [
        (h["key"], h["holder"] or "?",
         f"{h['since']} ({h['held_for']:.1f} s)" if h["since"] else "?", str(h["term"]))
        for h in held
    ]  # fmt: skip
    widths = [
        max(len(r[i]) for r in [("KEY", "HOLDER", "SINCE", "TERM"), *rows]) for i in (0, 1, 2)
    ]
    for key, holder, since, term in [("KEY", "HOLDER", "SINCE", "TERM"), *rows]:
        click.echo(f"{key:<{widths[0]}}  {holder:<{widths[1]}}  {since:<{widths[2]}}  {term}")


def release_key(t: Target, key: str, term: int | None) -> Lease:
    """Free ``key``'s hold of the term read (or ``term``); the hold freed, else one line."""
    hold = t.backend.keys.get(t.namespace, key)
    if hold is None or not hold.held:
        raise click.ClickException(
            f"key {key!r} is not held in namespace {t.namespace!r}: nothing to release "
            f"(`celery election keys` lists the held keys)"
        )
    if term is not None and term != hold.term:
        raise click.ClickException(
            f"key {key!r} is held in term {hold.term}, not {term}: it changed hands since "
            f"you looked; nothing released"
        )
    if not t.backend.keys.force_release(t.namespace, key, hold.term):
        raise click.ClickException(
            f"key {key!r} changed hands meanwhile (term {hold.term} is over); nothing released"
        )
    return hold


def key_commands(using: Using, namespace_option: Callable[[Any], Any]) -> list[click.Command]:
    """``keys`` and ``release``, on the CLI's own target (``cli._add_keys``)."""

    @click.command()
    @namespace_option
    @click.option("--json", "as_json", is_flag=True, help="Print JSON.")
    @click.pass_context
    def keys(ctx: click.Context, namespace: str | None, as_json: bool) -> None:
        """List the keys singleton tasks hold now: key, holder, since, term."""
        with using(ctx, namespace) as t:
            show_keys(t, as_json)

    @click.command()
    @click.argument("key")
    @namespace_option
    @click.option("--term", type=int, help="Release only this term (the one `keys` showed).")
    @click.pass_context
    def release(ctx: click.Context, key: str, namespace: str | None, term: int | None) -> None:
        """Free KEY's hold now, fenced: only the term seen (a newer hold is never freed).

        The holding task is not stopped: it runs on until it returns. For a hold whose
        task hangs in a live worker (a dead worker's keys free by themselves in seconds).
        """
        with using(ctx, namespace) as t:
            hold = release_key(t, key, term)
        click.echo(f"released key {key!r}: term {hold.term} of {hold.leader_id}")

    return [keys, release]
