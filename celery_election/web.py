"""The schedule page's WSGI app, under the name the docs give it (``celery_election.web``).

It lives in ``celery_election/schedule/web.py`` with the rest of the operable schedule.
"""

from __future__ import annotations

from .schedule.web import ACTIONS, TOKEN_ENV, Observer, WebApp, make_app, server

__all__ = ["ACTIONS", "TOKEN_ENV", "Observer", "WebApp", "make_app", "server"]
