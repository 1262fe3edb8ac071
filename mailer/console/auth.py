"""Who may use the console, and what they may do.

One secret, ``FAIRPOST_CONSOLE_TOKEN``. A browser posts it once to the login
page and gets a session cookie (HttpOnly, SameSite=Strict) signed with a key
derived from the token, so a new token ends every session. Logout ends the
session on the server too (:mod:`.sessions`): the cookie is refused from then.
A script sends ``Authorization: Bearer <token>`` instead. Wrong tokens are
slowed per client address (:mod:`.guard`).

Every action is a POST. One made with the session cookie must carry the
session's CSRF token (the ``csrf`` form field or an ``X-CSRF-Token`` header):
a cookie travels with any request the browser makes, the CSRF token only
with the console's own forms. A Bearer request carries no cookie, so it needs
none. In read-only mode (``FAIRPOST_CONSOLE_WRITE`` not true) every action
answers 403, whoever asks.

Neither the token nor a cookie is ever logged: a session is named by a short
digest of its id.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import posixpath
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from urllib.parse import quote, unquote, urlsplit

from aiohttp import web
from aiohttp.typedefs import Middleware

from fairpost.config import ConfigError, Settings
from fairpost.mailer.console.guard import Guard
from fairpost.mailer.console.sessions import SESSIONS

__all__ = [
    "AUTH",
    "COOKIE",
    "Auth",
    "Session",
    "auth_middleware",
    "require_action",
    "safe_next",
    "session_of",
]

log = logging.getLogger("fairpost.console")

COOKIE = "fairpost_console"
SESSION_SECONDS = 12 * 3600
"""How long a login lasts."""


@dataclass(frozen=True)
class Session:
    id: str
    """The random session id (``bearer`` for a request with the token itself)."""
    via: str
    """``cookie`` or ``bearer``."""
    csrf: str = ""
    """The token the session's forms carry; empty for Bearer requests."""
    expires: float = 0.0
    """When its cookie expires (epoch seconds); 0 for Bearer requests."""

    @property
    def who(self) -> str:
        """The session as the log names it: never the id itself."""
        if self.via == "bearer":
            return "bearer token"
        return "session " + hashlib.sha256(self.id.encode()).hexdigest()[:10]


_TOKEN_REQUIRED = "is required to start the console (a secret of 16 characters or more)"


def _same(given: str, expected: str) -> bool:
    """In constant time, and for any text a client sends (compare_digest refuses non-ASCII str)."""
    return hmac.compare_digest(given.encode(), expected.encode())


class Auth:
    """Checks the token, signs and reads session cookies, derives CSRF tokens."""

    def __init__(self, settings: Settings, guard: Guard | None = None) -> None:
        token = settings.console.token
        if token is None:
            raise ConfigError([("FAIRPOST_CONSOLE_TOKEN", _TOKEN_REQUIRED)])
        self._token = token.get_secret_value().encode()
        self._key = hmac.new(self._token, b"fairpost-console-session", hashlib.sha256).digest()
        self.write = settings.console.write
        self.prefix = settings.console.prefix
        self.guard = guard or Guard()

    def token_matches(self, given: str) -> bool:
        return hmac.compare_digest(given.encode(), self._token)  # bytes: any text compares

    def _sign(self, text: str) -> str:
        return hmac.new(self._key, text.encode(), hashlib.sha256).hexdigest()

    def new_cookie(self, now: float | None = None) -> str:
        session_id = secrets.token_hex(16)
        expires = int((now or time.time()) + SESSION_SECONDS)
        body = f"{session_id}.{expires}"
        return f"{body}.{self._sign(body)}"

    def session_from_cookie(self, value: str, now: float | None = None) -> Session | None:
        session_id, _, rest = value.partition(".")
        expires, _, signature = rest.partition(".")
        if not (session_id and expires.isdigit() and signature):
            return None
        if not _same(signature, self._sign(f"{session_id}.{expires}")):
            return None
        if int(expires) < (now or time.time()):
            return None
        return Session(session_id, "cookie", self._sign("csrf:" + session_id)[:32], float(expires))

    def session(self, request: web.Request) -> Session | None:
        """The request's session: a valid Bearer token or session cookie; None otherwise.

        A wrong Bearer token is no session, even with a good cookie beside it.
        """
        header = request.headers.get("Authorization", "")
        if header:
            scheme, _, given = header.partition(" ")
            if scheme.lower() == "bearer" and self.token_matches(given.strip()):
                return Session("bearer", "bearer")
            return None
        cookie = request.cookies.get(COOKIE)
        return self.session_from_cookie(cookie) if cookie else None

    def csrf_ok(self, session: Session, given: str) -> bool:
        return session.via == "bearer" or (bool(given) and _same(given, session.csrf))

    def set_cookie(self, response: web.StreamResponse, request: web.Request, value: str) -> None:
        response.set_cookie(
            COOKIE,
            value,
            max_age=SESSION_SECONDS,
            path=self.prefix or "/",
            httponly=True,
            samesite="Strict",
            secure=_is_https(request),
        )

    def clear_cookie(self, response: web.StreamResponse) -> None:
        response.del_cookie(COOKIE, path=self.prefix or "/")


AUTH = web.AppKey("auth", Auth)


def _is_https(request: web.Request) -> bool:
    # Behind a reverse proxy the console sees plain HTTP; the proxy says what the browser used.
    return request.secure or request.headers.get("X-Forwarded-Proto", "").lower() == "https"


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

OPEN_PATHS = ("/login", "/healthz")
"""Paths (after the prefix) anyone may ask for; ``/static/`` too."""


def auth_middleware(auth: Auth) -> Middleware:
    """Every request but the open ones needs a session: pages without one are sent
    to the login page, anything else (actions, live fragments) gets 401. A Bearer
    token from an address that must wait (:mod:`.guard`) is not compared: 429."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        path = request.path.removeprefix(auth.prefix)
        if path in OPEN_PATHS or path.startswith("/static/"):
            return await handler(request)
        bearer = "Authorization" in request.headers
        if bearer:
            refuse_while_waiting(auth.guard, request)
        session = auth.session(request)
        if bearer:
            if session is None:
                auth.guard.failed(request.remote, "bearer")
            else:
                auth.guard.succeeded(request.remote)
        elif session is not None and await request.app[SESSIONS].ended(session.id):
            session = None  # logged out: the cookie is still signed, but over
        if session is None:
            if request.method in ("GET", "HEAD") and not path.startswith("/fragments/") and not bearer:
                raise web.HTTPFound(login_url(auth.prefix, request.path_qs))
            raise web.HTTPUnauthorized(
                text="log in first: the console's session cookie, or Authorization: Bearer <token>\n",
                headers={"WWW-Authenticate": 'Bearer realm="fairpost console"'},
            )
        return await handler(request)

    return middleware


def refuse_while_waiting(guard: Guard, request: web.Request) -> None:
    """429 with ``Retry-After`` if the client's address must wait before its next token."""
    left = guard.throttled(request.remote)
    if left > 0:
        seconds = str(max(1, int(left + 0.999)))
        raise web.HTTPTooManyRequests(
            text=f"too many wrong tokens from this address: try again in {seconds} s\n",
            headers={"Retry-After": seconds},
        )


def session_of(request: web.Request) -> Session:
    """The session the middleware let through (read again: a request keeps no state)."""
    session = request.app[AUTH].session(request)
    if session is None:
        raise web.HTTPUnauthorized(text="log in first\n")
    return session


def login_url(prefix: str, next_path: str) -> str:
    return f"{prefix}/login?next={quote(next_path, safe='/')}"


def safe_next(prefix: str, wanted: str | None) -> str:
    """Where a login goes on to: a path of this console, never another site.

    Parsed, not only matched: a browser drops tabs and line breaks from a URL and
    reads a backslash as ``/``, so ``/<TAB>/evil.example/`` is ``//evil.example/``,
    another site. Anything but visible ASCII, a scheme or a host, a dot segment
    (``..``, ``%2e%2e``), or a path outside the prefix goes home instead."""
    home = prefix + "/"
    if not wanted or not all(32 < ord(c) < 127 for c in wanted) or "\\" in wanted:
        return home
    parts = urlsplit(wanted)
    path = parts.path
    if parts.scheme or parts.netloc or not path.startswith(home) or path.startswith("//"):
        return home
    segments = unquote(path).split("/")
    if any(s in (".", "..") for s in segments) or posixpath.normpath(unquote(path)).startswith("//"):
        return home
    return path + (f"?{parts.query}" if parts.query else "")


async def require_action(auth: Auth, request: web.Request) -> tuple[Session, dict[str, str]]:
    """The checks every action passes, in order: a session (the middleware), write
    mode, then for a cookie session the CSRF token. Returns the session and the
    form; raises 403 naming what is missing."""
    session = session_of(request)
    if not auth.write:
        raise web.HTTPForbidden(text="the console is read-only (FAIRPOST_CONSOLE_WRITE is not true)\n")
    form = {k: str(v) for k, v in (await request.post()).items()}
    given = form.get("csrf") or request.headers.get("X-CSRF-Token") or ""
    if not auth.csrf_ok(session, given):
        log.warning(
            "console action refused: no valid CSRF token (%s %s, %s)",
            request.method,
            request.path,
            session.who,
        )
        raise web.HTTPForbidden(text="missing or wrong CSRF token: reload the page and try again\n")
    return session, form
