"""The daemon's HTTP endpoints on ``FAIRPOST_HTTP_PORT``, served by ``aiohttp.web``.

- ``/metrics``: the Prometheus exposition of :class:`~fairpost.mailer.daemon.metrics.Metrics`,
  its gauges refreshed from Redis first (a failed refresh still serves the
  counters, and counts ``fairpost_stats_errors_total``);
- ``/healthz``: 200 while the daemon's tasks run, else 503 naming what failed;
- ``/readyz``: 200 when Redis and SQS answer, else 503 naming which does not.

Only GET and HEAD are served (405 otherwise); any other path is a 404.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiohttp import web

from fairpost.mailer.daemon.metrics import CONTENT_TYPE, Metrics

__all__ = ["Check", "HttpServer"]

log = logging.getLogger("fairpost.metrics")

STOP_SECONDS = 1.0
"""At stop, how long requests being answered get before they are cut off."""


@dataclass(frozen=True)
class Check:
    """What /healthz or /readyz answers: 200 ``ok: detail`` or 503 ``failing: detail``."""

    ok: bool
    detail: str


class HttpServer:
    """``/metrics``, ``/healthz``, ``/readyz`` for one daemon.

    ``alive`` answers /healthz (the daemon's loops are running), ``ready``
    /readyz (Redis and SQS answer), ``refresh`` fills the gauges before a
    scrape. ``port=0`` takes a free port, readable from :attr:`port` after
    :meth:`start`.
    """

    def __init__(
        self,
        metrics: Metrics,
        *,
        port: int,
        host: str = "0.0.0.0",
        alive: Callable[[], Check],
        ready: Callable[[], Awaitable[Check]],
        refresh: Callable[[], Awaitable[None]] | None = None,
        scrape_timeout: float = 5.0,
    ) -> None:
        self.metrics = metrics
        self.port = port
        self.host = host
        self._alive = alive
        self._ready = ready
        self._refresh = refresh
        self._scrape_timeout = scrape_timeout
        self._runner: web.AppRunner | None = None

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        # Last, so the routes above win for GET and HEAD: everything else.
        app.router.add_route("*", "/{path:.*}", self._other)
        return app

    async def start(self) -> None:
        # No access log: a scrape every few seconds would drown the daemon's own lines.
        runner = web.AppRunner(self.app(), access_log=None, shutdown_timeout=STOP_SECONDS)
        await runner.setup()
        try:
            await web.TCPSite(runner, self.host, self.port).start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        if self.port == 0:
            self.port = int(runner.addresses[0][1])
        log.info("HTTP on port %d: /metrics /healthz /readyz", self.port)

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until ``stop`` is set (call :meth:`start` first, or this does)."""
        if self._runner is None:
            await self.start()
        assert self._runner is not None
        try:
            await stop.wait()
        finally:
            await self._runner.cleanup()
            self._runner = None

    async def _metrics(self, request: web.Request) -> web.Response:
        if self._refresh is not None:
            try:
                await asyncio.wait_for(self._refresh(), timeout=self._scrape_timeout)
            except Exception as exc:
                self.metrics.stats_errors_total.inc()
                log.warning("gauges not refreshed for this scrape: %s", exc)
        return web.Response(body=self.metrics.render(), headers={"Content-Type": CONTENT_TYPE})

    async def _healthz(self, request: web.Request) -> web.Response:
        return _check_answer(self._alive())

    async def _readyz(self, request: web.Request) -> web.Response:
        return _check_answer(await self._ready())

    async def _other(self, request: web.Request) -> web.Response:
        if request.method not in ("GET", "HEAD"):
            return web.Response(status=405, text="only GET and HEAD\n", headers={"Allow": "GET, HEAD"})
        return web.Response(status=404, text="try /metrics, /healthz or /readyz\n")


def _check_answer(check: Check) -> web.Response:
    return web.Response(
        status=200 if check.ok else 503,
        text=("ok: " if check.ok else "failing: ") + check.detail + "\n",
        charset="utf-8",
    )
