"""``fairpost unsubscribe-server``: the one-click unsubscribe endpoint (RFC 8058),
meant to face the internet, on a port of its own (never the daemon's metrics port).

- ``POST /u/<token>`` with the body ``List-Unsubscribe=One-Click`` (what a
  mailbox provider sends, and what the page's buttons send) unsubscribes at once
  (fairpost.mailer.sdk.unsubscribes): the address from the token's topic, or,
  with ``scope=tenant``, from every topic of the tenant. A POST without that body
  changes nothing: some clients send one, and link scanners may too.
- ``GET /u/<token>`` only shows a page naming the tenant and the topic, whose
  buttons POST: a link scanner following links unsubscribes nobody.
- Every answer is the same whether the address was known or not, or unsubscribed
  already; an invalid, forged or expired token gets one generic refusal. No
  address is written to a page or a log.
- Each client address gets ``FAIRPOST_UNSUBSCRIBE__RATE_PER_MINUTE`` requests a
  minute (429 after).
"""

from __future__ import annotations

import asyncio
import collections
import html
import logging
import signal
import time

from aiohttp import web
from aiohttp.typedefs import Handler

from fairpost.config import Settings, mask_url
from fairpost.dispatcher.connect import async_redis_client
from fairpost.mailer.daemon.unsubscriber import Unsubscriber
from fairpost.mailer.errors import InvalidToken
from fairpost.mailer.sdk.list_unsubscribe import ONE_CLICK
from fairpost.mailer.sdk.unsub_token import Token

__all__ = ["RateLimit", "build_app", "serve"]

log = logging.getLogger("fairpost.unsubscribe")

_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'",
    "X-Frame-Options": "DENY",
    # The token is in the path: no other site may see it in a Referer.
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
}

_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width">
<meta name="robots" content="noindex"><title>{title}</title>
<style>body{{font-family:sans-serif;max-width:32em;margin:3em auto;padding:0 1em}}
button{{font-size:1em;padding:.5em 1em;margin:.3em 0}}</style></head>
<body><h1>{title}</h1>{body}</body></html>"""


class RateLimit:
    """At most ``per_minute`` requests a minute from one client address (in this process)."""

    def __init__(self, per_minute: int) -> None:
        self.per_minute = per_minute
        self._seen: dict[str, collections.deque[float]] = {}

    def allow(self, client: str, now: float) -> bool:
        seen = self._seen.setdefault(client, collections.deque())
        while seen and seen[0] <= now - 60:
            seen.popleft()
        if len(self._seen) > 100_000:
            # Bounded memory under a flood of addresses: forget those with no recent request.
            self._seen = {k: v for k, v in self._seen.items() if v and v[-1] > now - 60}
            self._seen[client] = seen
        if len(seen) >= self.per_minute:
            return False
        seen.append(now)
        return True


async def _form(request: web.Request) -> dict[str, str]:
    """The POST's fields: form-encoded (urlencoded or multipart) as RFC 8058 asks, or
    the one-click body sent bare by a client that names another content type."""
    if request.content_type in ("application/x-www-form-urlencoded", "multipart/form-data"):
        return {k: v for k, v in (await request.post()).items() if isinstance(v, str)}
    name, _, value = (await request.read()).decode("utf-8", "replace").strip().partition("=")
    return {name: value}


def _page(title: str, body: str, status: int = 200) -> web.Response:
    text = _PAGE.format(title=html.escape(title), body=body)
    return web.Response(text=text, status=status, content_type="text/html", headers=_HEADERS)


def _refused() -> web.Response:
    # One answer for a malformed, forged or expired token: which it was helps only a forger.
    return _page("Link not valid", "<p>This unsubscribe link is not valid, or it has expired.</p>", 400)


def _confirm(token: Token) -> web.Response:
    """The page a GET shows. Its forms have no action: they post to the page's own URL,
    whatever path a proxy serves it under."""
    tenant, topic = html.escape(token.tenant), html.escape(token.topic)
    hidden = '<input type="hidden" name="List-Unsubscribe" value="One-Click">'
    body = (
        f"<p>Stop <b>{topic}</b> mail from <b>{tenant}</b>?</p>"
        f'<form method="post">{hidden}<button>Unsubscribe from {topic}</button></form>'
        f'<form method="post">{hidden}<input type="hidden" name="scope" value="tenant">'
        f"<button>Stop all notification mail from {tenant}</button></form>"
        "<p>Receipts and other mail about your own actions will still be sent.</p>"
    )
    return _page("Unsubscribe", body)


def build_app(settings: Settings, unsubscriber: Unsubscriber) -> web.Application:
    limit = RateLimit(settings.unsubscribe.rate_per_minute)

    @web.middleware
    async def rate_limited(request: web.Request, handler: Handler) -> web.StreamResponse:
        if not limit.allow(request.remote or "", time.monotonic()):
            return web.Response(status=429, text="Too many requests", headers={"Retry-After": "60"})
        return await handler(request)

    async def show(request: web.Request) -> web.Response:
        try:
            token = unsubscriber.token(request.match_info["token"])
        except InvalidToken:
            return _refused()
        return _confirm(token)

    async def one_click(request: web.Request) -> web.Response:
        form = await _form(request)
        if form.get("List-Unsubscribe") != ONE_CLICK.partition("=")[2]:
            body = "<p>An unsubscribe needs the body <code>List-Unsubscribe=One-Click</code> (RFC 8058).</p>"
            return _page("Nothing changed", body, 400)
        try:
            token = unsubscriber.token(request.match_info["token"])
        except InvalidToken:
            return _refused()
        await unsubscriber.apply(token, whole_tenant=form.get("scope") == "tenant", source="link")
        return _page("Unsubscribed", "<p>You are unsubscribed. It takes effect at once.</p>")

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application(middlewares=[rate_limited], client_max_size=4096)
    app.router.add_get("/u/{token}", show)
    app.router.add_post("/u/{token}", one_click)
    app.router.add_get("/healthz", healthz)
    return app


async def serve(settings: Settings) -> int:
    """Serve until SIGTERM or SIGINT; the exit code."""
    section = settings.unsubscribe
    if not section.keys:
        log.error("FAIRPOST_UNSUBSCRIBE__KEYS is not set: no token could be verified")
        return 2
    client = async_redis_client(settings)
    unsubscriber = Unsubscriber(settings, client)
    runner = web.AppRunner(build_app(settings, unsubscriber), access_log=None)
    await runner.setup()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        await web.TCPSite(runner, section.host, section.port).start()
        where = f"{section.host}:{section.port}"
        log.info("unsubscribe server on %s, Redis at %s", where, mask_url(settings.redis_url))
        await stop.wait()
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
        await runner.cleanup()
        await unsubscriber.aclose()
        await client.aclose()
    return 0
