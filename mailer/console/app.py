"""The console's web application: aiohttp serving Jinja2 pages under
``FAIRPOST_CONSOLE_PREFIX``, on ``FAIRPOST_CONSOLE_PORT``.

:func:`build_app` makes the application (the tests serve it on a free port);
:func:`serve` runs it until SIGTERM or SIGINT, as ``fairpost console`` does.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections import OrderedDict
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import jinja2
import redis
import redis.asyncio
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from fairpost.config import Settings, mask_url
from fairpost.dispatcher import connect
from fairpost.mailer.console import pages, posts
from fairpost.mailer.console.actions import Actions
from fairpost.mailer.console.auth import (
    AUTH,
    Auth,
    Handler,
    auth_middleware,
    refuse_while_waiting,
    safe_next,
    session_of,
)
from fairpost.mailer.console.context import ACTIONS, CONSOLE, FLASHES, JINJA, LIVE_SECONDS
from fairpost.mailer.console.data import Console
from fairpost.mailer.console.guard import Guard
from fairpost.mailer.console.sessions import SESSIONS, EndedSessions
from fairpost.mailer.console.views import clock, mask_address, mask_text, rate, waits, warmup_source, when
from fairpost.mailer.errors import RedisFailed
from fairpost.mailer.sdk.connection import timeouts

__all__ = ["build_app", "serve"]

log = logging.getLogger("fairpost.console")

HERE = Path(__file__).parent
STOP_SECONDS = 2.0

HEADERS = {
    # Everything the pages load is the console's own: no inline script or style.
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; "
    "form-action 'self'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "X-Frame-Options": "DENY",
}


def build_app(
    settings: Settings,
    *,
    live_seconds: float = 5.0,
    sample_seconds: float | None = None,
    guard: Guard | None = None,
) -> web.Application:
    """The console for these settings; its Redis connections open with the app and close with it.

    Raises :class:`ConfigError` without ``FAIRPOST_CONSOLE_TOKEN``. ``guard``: the
    one that slows wrong tokens (a test's, with its own clock).
    """
    auth = Auth(settings, guard)
    prefix = settings.console.prefix
    app = web.Application(middlewares=[_headers, _failures, auth_middleware(auth)])
    app[AUTH] = auth
    app[LIVE_SECONDS] = live_seconds
    app[FLASHES] = OrderedDict()
    app[JINJA] = _templates(settings)
    app.cleanup_ctx.append(_connections(settings, sample_seconds))

    def get(path: str, handler: Handler) -> None:
        app.router.add_get(prefix + path, handler)

    def post(path: str, handler: Handler) -> None:
        app.router.add_post(prefix + path, handler)

    if prefix:
        get("", _to_home)
    get("/healthz", _healthz)
    get("/metrics", _metrics)
    get("/login", _login_page)
    post("/login", _login)
    post("/logout", _logout)
    pages.add_routes(get)
    posts.add_routes(post)
    app.router.add_static(prefix + "/static", HERE / "static", append_version=True)
    return app


async def _to_home(request: web.Request) -> web.StreamResponse:
    raise web.HTTPFound(request.app[AUTH].prefix + "/")


def _templates(settings: Settings) -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    show = settings.console.show_addresses
    env.filters.update(
        clock=clock,
        when=when,
        rate=rate,
        address=(lambda a: a) if show else mask_address,
        scrub=(lambda t: t or "") if show else mask_text,
        number=lambda n: f"{n:,}",
    )
    env.globals.update(
        waits=waits,
        warmup_source=warmup_source,
        prefix=settings.console.prefix,
        show_addresses=show,
        tenant_path=pages.tenant_path,
    )
    return env


def _connections(settings: Settings, sample_seconds: float | None) -> Any:
    async def connections(app: web.Application) -> AsyncIterator[None]:
        client = connect.async_redis_client(settings, **timeouts(settings))
        sync_client = connect.redis_client(settings, **timeouts(settings))
        console = Console(settings, client, sync_client)
        if sample_seconds is not None:
            console.backlog.every = sample_seconds
        app[CONSOLE] = console
        app[SESSIONS] = EndedSessions(client, console.keys)
        app[ACTIONS] = Actions(console)
        stop = asyncio.Event()
        sampler = asyncio.create_task(console.backlog.run(stop, console.sample_backlog), name="backlog")
        try:
            yield
        finally:
            stop.set()
            await sampler
            console.account.close()
            await console.aclose()
            await client.aclose()
            await asyncio.to_thread(sync_client.close)

    return connections


@web.middleware
async def _headers(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        response = await handler(request)
    except web.HTTPException as exc:
        exc.headers.update(HEADERS)
        raise
    response.headers.update(HEADERS)
    return response


@web.middleware
async def _failures(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Redis out of reach is a 503 naming it (password masked), not a traceback."""
    try:
        return await handler(request)
    except (redis.RedisError, RedisFailed, OSError) as exc:
        url, what = mask_url(request.app[CONSOLE].settings.redis_url), type(exc).__name__
        log.warning("console: Redis failed a request (%s): %s", request.path, what)
        return web.Response(status=503, text=f"Redis at {url} did not answer ({what}); try again\n")


async def _healthz(request: web.Request) -> web.Response:
    return web.Response(text="ok\n")


async def _metrics(request: web.Request) -> web.Response:
    """The console's own counters (wrong tokens), for Prometheus with the Bearer token."""
    body = generate_latest(request.app[AUTH].guard.registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def _login_page(
    request: web.Request, *, status: int = 200, error: str | None = None, next_path: str | None = None
) -> web.Response:
    template = request.app[JINJA].get_template("login.html")
    html = template.render(
        url=lambda path: request.app[AUTH].prefix + path,
        next=request.query.get("next", "") if next_path is None else next_path,
        error=error,
    )
    headers = {"Cache-Control": "no-store"}
    return web.Response(text=html, status=status, content_type="text/html", headers=headers)


async def _login(request: web.Request) -> web.StreamResponse:
    auth = request.app[AUTH]
    form = await request.post()
    next_path = str(form.get("next", ""))
    try:
        refuse_while_waiting(auth.guard, request)
    except web.HTTPTooManyRequests as wait:
        error = f"Too many wrong tokens from your address: try again in {wait.headers['Retry-After']} s."
        page = await _login_page(request, status=429, error=error, next_path=next_path)
        page.headers["Retry-After"] = wait.headers["Retry-After"]
        return page
    if not auth.token_matches(str(form.get("token", ""))):
        auth.guard.failed(request.remote, "login")
        error = "That is not the console's token."
        return await _login_page(request, status=401, error=error, next_path=next_path)
    auth.guard.succeeded(request.remote)
    response = web.HTTPSeeOther(safe_next(auth.prefix, next_path or None))
    value = auth.new_cookie()
    auth.set_cookie(response, request, value)
    session = auth.session_from_cookie(value)
    assert session is not None
    log.info("console: logged in: %s", session.who)
    raise response


async def _logout(request: web.Request) -> web.StreamResponse:
    session = session_of(request)
    form = await request.post()
    if not request.app[AUTH].csrf_ok(session, str(form.get("csrf", ""))):
        raise web.HTTPForbidden(text="missing or wrong CSRF token\n")
    if session.via == "cookie":
        await request.app[SESSIONS].end(session.id, session.expires)
    response = web.HTTPSeeOther(request.app[AUTH].prefix + "/login")
    request.app[AUTH].clear_cookie(response)
    log.info("console: logged out: %s", session.who)
    raise response


async def serve(settings: Settings) -> int:
    """Serve until SIGTERM or SIGINT; the exit code."""
    app = build_app(settings)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=STOP_SECONDS)
    await runner.setup()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        await web.TCPSite(runner, settings.console.host, settings.console.port).start()
        mode = "read-write" if settings.console.write else "read-only"
        where = f"http://{settings.console.host}:{settings.console.port}{settings.console.prefix}/"
        log.info("console on %s (%s), Redis at %s", where, mode, mask_url(settings.redis_url))
        await stop.wait()
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
        await runner.cleanup()
    return 0
