"""The SDK's routes to the sending pools (#43): each pool's settings, keys and stores.

A :class:`MailClient` writes a tenant's mail to the pool the directory
(:mod:`fairpost.mailer.sdk.directory`) puts it on, with the pool's own key space
(:func:`fairpost.config.pools.pool_settings`): its jobs, queues and quota live
under its own hash tag, and its daemon parts find them there. A job's status or
cancel asks each pool in turn, the default first: job ids are unique over all.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import redis
import redis.asyncio

from fairpost.config import Settings
from fairpost.config.pools import pool_names, pool_settings
from fairpost.dispatcher.lifecycle import Lifecycle, SyncLifecycle
from fairpost.dispatcher.store import JobStore, StoreLimits, SyncJobStore, store_limits
from fairpost.mailer.sdk.directory import AsyncPoolDirectory, PoolDirectory
from fairpost.mailer.sdk.keys import MailKeys
from fairpost.mailer.sdk.pool_redis import AsyncPoolRedis, SyncPoolRedis

__all__ = ["AsyncRoute", "AsyncRoutes", "SyncRoute", "SyncRoutes"]


@dataclass(frozen=True)
class SyncRoute:
    pool: str
    settings: Settings
    keys: MailKeys
    store: SyncJobStore
    lifecycle: SyncLifecycle


@dataclass(frozen=True)
class AsyncRoute:
    pool: str
    settings: Settings
    keys: MailKeys
    store: JobStore
    lifecycle: Lifecycle


class SyncRoutes:
    """Every pool's route, built once, and the directory that picks one per tenant."""

    def __init__(self, settings: Settings, client: redis.Redis, **options: Any) -> None:
        self.directory = PoolDirectory(settings, client)
        self.redis = SyncPoolRedis(settings, client, **options)
        self._routes = {
            name: SyncRoute(
                name, own, keys,
                SyncJobStore(self.redis(name), keys, limits), SyncLifecycle(self.redis(name), keys, limits),
            )
            for name, own, keys, limits in _pools(settings)
        }  # fmt: skip

    def pool(self, name: str) -> SyncRoute:
        return self._routes[name]

    def for_tenant(self, tenant: str) -> SyncRoute:
        return self._routes[self.directory.route(tenant)]

    def __iter__(self) -> Iterator[SyncRoute]:
        return iter(self._routes.values())


class AsyncRoutes:
    """:class:`SyncRoutes` for asyncio."""

    def __init__(self, settings: Settings, client: redis.asyncio.Redis, **options: Any) -> None:
        self.directory = AsyncPoolDirectory(settings, client)
        self.redis = AsyncPoolRedis(settings, client, **options)
        self._routes = {
            name: AsyncRoute(
                name, own, keys,
                JobStore(self.redis(name), keys, limits), Lifecycle(self.redis(name), keys, limits),
            )
            for name, own, keys, limits in _pools(settings)
        }  # fmt: skip

    def pool(self, name: str) -> AsyncRoute:
        return self._routes[name]

    async def for_tenant(self, tenant: str) -> AsyncRoute:
        return self._routes[await self.directory.route(tenant)]

    def __iter__(self) -> Iterator[AsyncRoute]:
        return iter(self._routes.values())


def _pools(settings: Settings) -> Iterator[tuple[str, Settings, MailKeys, StoreLimits]]:
    """Each pool's name, settings, keys and store limits, the default first."""
    for name in pool_names(settings):
        own = pool_settings(settings, name)
        yield name, own, MailKeys(own.key_prefix), store_limits(own)
