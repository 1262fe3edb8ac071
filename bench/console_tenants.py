"""The console's tenants page with 10 tenants and with 100,000: seconds a page
takes (issue 29's target: within 2 s at 100,000), over a redis-server of its own.

    python -m bench.console_tenants [--tenants 100000]

Each world is timed cold (the first page, which reads every id) and warm (the
pages after it), for the page by id, a search, and the sorts by backlog and hold.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Sequence

import aiohttp
import redis
from aiohttp import web

from fairpost.config import load_settings
from fairpost.mailer.console.app import build_app
from fairpost.mailer.sdk.keys import MailKeys
from fairpost.mailer.testing.services import redis_server

TOKEN = "bench-console-token-0123456789abcdef"
PATHS = ("/tenants", "/tenants?page=77", "/tenants?q=t-0999", "/tenants?sort=backlog", "/tenants?sort=hold")


def fill(url: str, count: int) -> None:
    """``count`` known tenants, one in a hundred with a backlog (written in bulk)."""
    client = redis.Redis.from_url(url)
    keys = MailKeys()
    names = [f"t-{i:06d}" for i in range(count)]
    with client.pipeline(transaction=False) as pipe:
        for start in range(0, count, 10_000):
            pipe.sadd(keys.tenants(), *names[start : start + 10_000])
        pipe.hset(keys.counts(), mapping={name: i % 50 + 1 for i, name in enumerate(names[::100])})
        pipe.execute()
    client.close()


async def time_pages(url: str, repeats: int) -> dict[str, list[float]]:
    settings = load_settings(redis_url=url, console={"token": TOKEN})
    runner = web.AppRunner(build_app(settings), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    base = f"http://127.0.0.1:{runner.addresses[0][1]}"
    seconds: dict[str, list[float]] = {}
    try:
        async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {TOKEN}"}) as http:
            for round_ in range(repeats + 1):
                for path in PATHS:
                    started = time.perf_counter()
                    async with http.get(base + path) as response:
                        assert response.status == 200, (path, response.status)
                        await response.read()
                    kind = "cold" if round_ == 0 and path == PATHS[0] else path
                    seconds.setdefault(kind, []).append(time.perf_counter() - started)
                # Past the console's 3 s reuse of an order, so each round reads it again.
                await asyncio.sleep(3.1)
    finally:
        await runner.cleanup()
    return seconds


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.console_tenants", description=__doc__)
    parser.add_argument("--tenants", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    results = {}
    for count in (10, args.tenants):
        with redis_server() as server:
            fill(server.url(), count)
            results[count] = asyncio.run(time_pages(server.url(), args.repeats))
    print(f"{'page':28} {'10 tenants':>12} {f'{args.tenants:,} tenants':>18}   (seconds, median / max)")
    for kind in results[10]:
        cells = [f"{statistics.median(results[n][kind]):.3f} / {max(results[n][kind]):.3f}" for n in results]
        print(f"{kind:28} {cells[0]:>12} {cells[1]:>18}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
