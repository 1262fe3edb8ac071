"""The console over the sending pools (#43): each pool's readers and admins, and which
pool a tenant is on.

A tenant's page reads, and its buttons act, in the pool the directory puts it on
(:mod:`fairpost.mailer.sdk.directory`, cached as every SDK caches it); its mail that
still drains from a pool it was moved from is counted there, not on its page. An
installation that declares no pool has the default pool alone, and the directory is
never read.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass

import redis
import redis.asyncio

from fairpost.config import Settings
from fairpost.config.pools import DEFAULT_POOL, pool_names, pool_settings
from fairpost.dispatcher.lifecycle import SyncLifecycle
from fairpost.dispatcher.store import store_limits
from fairpost.mailer.quota.admin import QuotaAdmin
from fairpost.mailer.quota.engine import QuotaEngine
from fairpost.mailer.sdk.connection import timeouts
from fairpost.mailer.sdk.dead import DeadLetters
from fairpost.mailer.sdk.directory import AsyncPoolDirectory, PoolDirectory
from fairpost.mailer.sdk.keys import MailKeys
from fairpost.mailer.sdk.pool_redis import AsyncPoolRedis, SyncPoolRedis
from fairpost.mailer.sdk.rollups import Deliverability

__all__ = ["ConsolePools", "PoolParts"]


@dataclass(frozen=True)
class PoolParts:
    """One pool as the console reads it: its settings and keys, its clients (of its slot,
    on a Redis Cluster) and the admin clients of its keys."""

    name: str
    settings: Settings
    keys: MailKeys
    redis: redis.asyncio.Redis
    quota: QuotaEngine
    admin: QuotaAdmin
    dead: DeadLetters
    deliverability: Deliverability
    lifecycle: SyncLifecycle


class ConsolePools:
    """Every pool's parts, the default first, and the directory that picks a tenant's."""

    def __init__(self, settings: Settings, client: redis.asyncio.Redis, sync_client: redis.Redis) -> None:
        self.pooled = bool(settings.pools)
        self._async = AsyncPoolRedis(settings, client, **timeouts(settings))
        self._sync = SyncPoolRedis(settings, sync_client, **timeouts(settings))
        self._directory = AsyncPoolDirectory(settings, client)
        self._sync_directory = PoolDirectory(settings, sync_client)
        self.parts = {name: self._build(settings, name) for name in pool_names(settings)}
        self.default = self.parts[DEFAULT_POOL]

    def _build(self, settings: Settings, name: str) -> PoolParts:
        own = pool_settings(settings, name)
        keys = MailKeys(own.key_prefix)
        aclient, client = self._async(name), self._sync(name)
        return PoolParts(
            name=name,
            settings=own,
            keys=keys,
            redis=aclient,
            quota=QuotaEngine(aclient, keys),
            admin=QuotaAdmin(own, redis_client=client),
            dead=DeadLetters(own, redis_client=client),
            deliverability=Deliverability(own, redis_client=client),
            lifecycle=SyncLifecycle(client, keys, store_limits(own)),
        )

    def __iter__(self) -> Iterator[PoolParts]:
        return iter(self.parts.values())

    def names(self) -> tuple[str, ...]:
        """The pools, for a filter; none without pools (the pages then show no pool)."""
        return tuple(self.parts) if self.pooled else ()

    async def of(self, tenant: str) -> PoolParts:
        """The tenant's pool's parts."""
        return self.parts[await self._directory.pool_of(tenant)]

    def of_sync(self, tenant: str) -> PoolParts:
        """:meth:`of`, blocking (the actions run in a thread)."""
        return self.parts[self._sync_directory.pool_of(tenant)]

    async def placements(self) -> dict[str, str]:
        """Every tenant not on the default pool → its pool (one ``HGETALL``; none without pools)."""
        if not self.pooled:
            return {}
        return await asyncio.to_thread(self._sync_directory.placements)

    async def aclose(self) -> None:
        await self._async.aclose()
        await asyncio.to_thread(self._sync.close)
