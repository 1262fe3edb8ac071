"""What the warm-up tests share: a running OverrideCache, and the Redis clock."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import redis.asyncio

from fairpost.config import Settings
from fairpost.dispatcher.replies import time_ms
from fairpost.mailer.quota.overrides import OverrideCache, Overrides
from fairpost.mailer.quota.warmup import Place
from fairpost.mailer.sdk.keys import MailKeys

KEYS = MailKeys()


@asynccontextmanager
async def running_cache(
    client: redis.asyncio.Redis,
    settings: Settings,
    on_change: Callable[[Overrides, Overrides], Awaitable[None]] | None = None,
) -> AsyncIterator[OverrideCache]:
    """An OverrideCache as a sender replica runs it, refreshed every 0.2 s, until the block ends."""
    cache = OverrideCache(client, KEYS, settings, refresh_seconds=0.2, on_change=on_change)
    await cache.refresh()
    stop = asyncio.Event()
    task = asyncio.create_task(cache.run(stop))
    try:
        yield cache
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=5)


async def stored(client: redis.asyncio.Redis, tenant: str) -> Place | None:
    """The tenant's place as Redis holds it."""
    raw = await client.hget(KEYS.warmup(), tenant)
    return None if raw is None else Place.from_json(raw)


async def redis_now_ms(client: redis.asyncio.Redis) -> int:
    return time_ms(await client.time())
