"""The daemon's HTTP endpoints, in process: what /metrics, /healthz and /readyz
answer, and how the server starts on a free port and stops with the daemon.

The whole daemon behind them is tested in tests/ops/test_ops.py; these pin the
HTTP behaviour itself (status, body, content type, HEAD, 404, 405).
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import aiohttp
from prometheus_client import CONTENT_TYPE_LATEST

from fairpost.mailer.daemon.http import Check, HttpServer
from fairpost.mailer.daemon.metrics import Metrics

ALIVE = Check(True, "running: sender")
READY = Check(True, "Redis and SQS answer")


@asynccontextmanager
async def serving(
    *,
    alive: Check = ALIVE,
    ready: Check = READY,
    refresh: Callable[[], Awaitable[None]] | None = None,
    metrics: Metrics | None = None,
) -> AsyncIterator[tuple[str, Metrics]]:
    metrics = metrics or Metrics()

    async def is_ready() -> Check:
        return ready

    server = HttpServer(
        metrics, port=0, host="127.0.0.1", alive=lambda: alive, ready=is_ready, refresh=refresh
    )
    await server.start()
    stop = asyncio.Event()
    task = asyncio.create_task(server.run(stop))
    try:
        yield f"http://127.0.0.1:{server.port}", metrics
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=10)


async def get(url: str, method: str = "GET") -> tuple[int, str, str]:
    async with aiohttp.ClientSession() as session, session.request(method, url) as response:
        return response.status, response.headers.get("Content-Type", ""), await response.text()


async def test_metrics_refreshes_the_gauges_and_renders_the_registry() -> None:
    refreshed = 0

    async def refresh() -> None:
        nonlocal refreshed
        refreshed += 1

    async with serving(refresh=refresh) as (url, metrics):
        metrics.sent("acme", 0)
        status, content_type, body = await get(url + "/metrics")
        assert status == 200
        assert content_type == CONTENT_TYPE_LATEST
        assert 'fairpost_mail_sent_total{tenant="acme"} 1.0' in body
        assert refreshed == 1
        # A query string does not change the path.
        assert (await get(url + "/metrics?format=text"))[0] == 200
        assert refreshed == 2


async def test_a_failed_refresh_still_serves_the_counters_and_counts_the_error() -> None:
    async def refresh() -> None:
        raise ConnectionError("Redis is away")

    async with serving(refresh=refresh) as (url, _):
        status, _, body = await get(url + "/metrics")
        assert status == 200
        assert "fairpost_stats_errors_total 1.0" in body


async def test_healthz_and_readyz_answer_200_or_503_with_the_detail() -> None:
    async with serving() as (url, _):
        assert (await get(url + "/healthz"))[::2] == (200, "ok: running: sender\n")
        assert (await get(url + "/readyz"))[::2] == (200, "ok: Redis and SQS answer\n")
        assert (await get(url + "/healthz"))[1] == "text/plain; charset=utf-8"
    async with serving(
        alive=Check(False, "sender stopped"), ready=Check(False, "Redis does not answer: TimeoutError")
    ) as (url, _):
        assert (await get(url + "/healthz"))[::2] == (503, "failing: sender stopped\n")
        assert (await get(url + "/readyz"))[::2] == (503, "failing: Redis does not answer: TimeoutError\n")


async def test_head_has_no_body_other_paths_404_other_methods_405() -> None:
    async with serving() as (url, _):
        assert (await get(url + "/healthz", "HEAD"))[::2] == (200, "")
        assert (await get(url + "/nope"))[0] == 404
        assert (await get(url + "/metrics", "POST"))[0] == 405
        assert (await get(url + "/nope", "DELETE"))[0] == 405


async def test_the_port_is_closed_once_stopped() -> None:
    async with serving() as (url, _):
        port = int(url.rsplit(":", 1)[1])
    with socket.socket() as sock:
        assert sock.connect_ex(("127.0.0.1", port)) != 0
