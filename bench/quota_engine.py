"""Quota engine throughput: fairpost's one atomic script against ``limits``' moving window.

Both sides check and take one unit in the same six windows (three global,
three for the tenant: a second, a minute, an hour) on the same Redis, from
one process, one acquisition after another. fairpost does it in one
round trip (``acquire.lua``); ``limits`` (its async moving window over
redis-py) needs one ``hit`` per window, six round trips, and nothing makes
the six atomic together. The limits are high so that nothing is refused:
this measures the cost of a grant.
"""

from __future__ import annotations

import time
import uuid

import redis.asyncio
from limits import RateLimitItemPerHour, RateLimitItemPerMinute, RateLimitItemPerSecond
from limits.aio.storage import RedisStorage
from limits.aio.strategies import MovingWindowRateLimiter

from bench.cluster import Backend
from bench.figures import Figure
from fairpost.config.limits import Window
from fairpost.mailer.quota.engine import QuotaEngine
from fairpost.mailer.sdk.keys import MailKeys

WINDOWS = (Window(1, 1_000_000), Window(60, 10_000_000), Window(3600, 100_000_000))


async def run(backend: Backend, quick: bool) -> list[Figure]:
    acquisitions = 400 if quick else 5000
    rounds = 20 if quick else 100
    per_round = acquisitions // rounds
    tenants = [f"t{i}" for i in range(10)]
    url = backend.redis_url(db=1)

    client = redis.asyncio.Redis.from_url(url)
    engine = QuotaEngine(client, MailKeys(f"bench-quota-{uuid.uuid4().hex[:6]}"))
    storage = RedisStorage(f"async+{url}", implementation="redispy")
    limiter = MovingWindowRateLimiter(storage)
    items = [
        RateLimitItemPerSecond(WINDOWS[0].limit),
        RateLimitItemPerMinute(WINDOWS[1].limit),
        RateLimitItemPerHour(WINDOWS[2].limit),
    ]

    async def fairpost(n: int) -> None:
        for i in range(n):
            grant = await engine.acquire(tenants[i % len(tenants)], [1], WINDOWS, WINDOWS)
            assert grant.granted == 1

    async def limits(n: int) -> None:
        for i in range(n):
            tenant = tenants[i % len(tenants)]
            for item in items:
                assert await limiter.hit(item, "global")
            for item in items:
                assert await limiter.hit(item, "tenant", tenant)

    # Warm both (script loading, connections), then alternate rounds so that
    # a machine busy with something else slows both sides alike.
    await fairpost(10)
    await limits(10)
    fairpost_seconds = limits_seconds = 0.0
    for _ in range(rounds):
        started = time.perf_counter()
        await fairpost(per_round)
        fairpost_seconds += time.perf_counter() - started
        started = time.perf_counter()
        await limits(per_round)
        limits_seconds += time.perf_counter() - started
    await storage.reset()
    await client.flushdb()
    await client.aclose()

    done = rounds * per_round
    fairpost_rate = done / fairpost_seconds
    limits_rate = done / limits_seconds
    return [
        Figure(
            key="quota_engine_speedup",
            title="Quota engine: acquisitions/s vs limits' moving window",
            value=fairpost_rate / limits_rate,
            unit="x",
            op=">=",
            target=3.0,
            detail=(
                f"fairpost {fairpost_rate:.0f}/s (1 atomic call), limits {limits_rate:.0f}/s "
                f"(6 hits, not atomic); {done} acquisitions each, 3 global + 3 tenant windows"
            ),
            data={
                "acquisitions": done,
                "fairpost_per_second": fairpost_rate,
                "limits_per_second": limits_rate,
            },
        )
    ]
