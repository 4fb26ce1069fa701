"""MkDocs hook: the Settings page's tables, rendered from ``celery_election.settings``.

``docs/settings.md`` holds the markers ``<!-- settings-table -->`` and
``<!-- retired-settings -->``; this hook replaces them with ``settings_table()`` (the one
definition, ``SETTINGS``) and the ``RETIRED`` list at build time, so the page is never
hand-copied. A page with a marker left over, or a marker missing, fails the build.
"""

from __future__ import annotations

from typing import Any

from celery_election.settings import RETIRED, settings_table

TABLE = "<!-- settings-table -->"
RETIRED_MARK = "<!-- retired-settings -->"


def retired_list() -> str:
    return "\n".join(f"- `{name}`: {why}." for name, why in sorted(RETIRED.items()))


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    if page.file.src_uri != "settings.md":
        return markdown
    if TABLE not in markdown or RETIRED_MARK not in markdown:
        raise RuntimeError(f"docs/settings.md must hold {TABLE} and {RETIRED_MARK}")
    return markdown.replace(TABLE, settings_table()).replace(RETIRED_MARK, retired_list())
