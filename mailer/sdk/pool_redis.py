"""A Redis client for each sending pool's keys (#43).

One client serves every pool on one server or behind Sentinel. On a Redis Cluster a
client of fairpost's (:mod:`fairpost.dispatcher.connect`) talks to the master of one
slot, its key prefix's: each other pool's keys hash to a slot of their own, so
each gets a client of its own, opened on first use and closed with the owner.
"""

from __future__ import annotations

from typing import Any

import redis
import redis.asyncio

from fairpost.config import Settings
from fairpost.config.pools import DEFAULT_POOL, pool_settings
from fairpost.dispatcher import connect

__all__ = ["AsyncPoolRedis", "SyncPoolRedis"]


class SyncPoolRedis:
    """Blocking: ``pools(name)`` is the client of that pool's keys."""

    def __init__(self, settings: Settings, client: redis.Redis, **options: Any) -> None:
        self._settings = settings
        self._default = client
        self._options = options
        self._opened: dict[str, redis.Redis] = {}

    def __call__(self, pool: str) -> redis.Redis:
        if pool == DEFAULT_POOL or not self._settings.redis_cluster:
            return self._default
        if pool not in self._opened:
            self._opened[pool] = connect.redis_client(pool_settings(self._settings, pool), **self._options)
        return self._opened[pool]

    def close(self) -> None:
        for client in self._opened.values():
            client.close()
        self._opened.clear()


class AsyncPoolRedis:
    """asyncio: ``pools(name)`` is the client of that pool's keys."""

    def __init__(self, settings: Settings, client: redis.asyncio.Redis, **options: Any) -> None:
        self._settings = settings
        self._default = client
        self._options = options
        self._opened: dict[str, redis.asyncio.Redis] = {}

    def __call__(self, pool: str) -> redis.asyncio.Redis:
        if pool == DEFAULT_POOL or not self._settings.redis_cluster:
            return self._default
        if pool not in self._opened:
            own = pool_settings(self._settings, pool)
            self._opened[pool] = connect.async_redis_client(own, **self._options)
        return self._opened[pool]

    async def aclose(self) -> None:
        for client in self._opened.values():
            await client.aclose()
        self._opened.clear()
