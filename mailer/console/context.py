"""What the console's handlers share: the application's parts, and how a page is answered."""

from __future__ import annotations

import secrets
from collections import OrderedDict
from typing import Any

import jinja2
from aiohttp import web

from fairpost.mailer.console.actions import Actions
from fairpost.mailer.console.auth import AUTH, session_of
from fairpost.mailer.console.data import Console

__all__ = ["ACTIONS", "AUTH", "CONSOLE", "FLASHES", "JINJA", "LIVE_SECONDS", "done", "render"]

CONSOLE = web.AppKey("console", Console)
ACTIONS = web.AppKey("actions", Actions)
JINJA = web.AppKey("jinja", jinja2.Environment)
FLASHES = web.AppKey("flashes", OrderedDict)
LIVE_SECONDS = web.AppKey("live_seconds", float)


def render(request: web.Request, name: str, *, status: int = 200, **context: Any) -> web.Response:
    """A page: the template with what every page shows (the session's CSRF token, the mode, a flash)."""
    app = request.app
    session = session_of(request)
    flash_id = request.query.get("done", "")
    html = (
        app[JINJA]
        .get_template(name)
        .render(
            url=lambda path: app[AUTH].prefix + path,
            csrf=session.csrf,
            write=app[AUTH].write,
            flash=app[FLASHES].pop(flash_id, None) if flash_id else None,
            live_seconds=app[LIVE_SECONDS],
            request_path=request.path_qs,
            **context,
        )
    )
    return web.Response(
        text=html, status=status, content_type="text/html", headers={"Cache-Control": "no-store"}
    )


def done(request: web.Request, location: str, message: str) -> web.HTTPSeeOther:
    """After an action, back to a page that says what was done (post, redirect, get)."""
    flashes = request.app[FLASHES]
    key = secrets.token_urlsafe(8)
    flashes[key] = message
    while len(flashes) > 256:
        flashes.popitem(last=False)
    joiner = "&" if "?" in location else "?"
    return web.HTTPSeeOther(f"{request.app[AUTH].prefix}{location}{joiner}done={key}")
