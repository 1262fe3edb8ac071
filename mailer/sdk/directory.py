"""The pool directory (#43): which sending pool each tenant is on, and its fallback.

The only module that reads or writes the directory's keys
(:meth:`~fairpost.mailer.sdk.keys.MailKeys.pool_directory` and its neighbours), all in
the default pool's slot. A tenant with no entry is on the default pool, so an
installation that declares no pool never reads the directory at all.

Every SDK caches a tenant's answer for :data:`DIRECTORY_TTL` seconds: a tenant
moved (``fairpost tenant move``) sends its new mail to its new pool within that
time on every client, with no restart. Mail enqueued in the old pool meanwhile
drains there (docs/operations.md, "Sending pools").
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis
import redis.asyncio

from fairpost.config import ConfigError, Settings
from fairpost.config.pools import DEFAULT_POOL, pool_names
from fairpost.dispatcher.replies import text
from fairpost.mailer.sdk.keys import MailKeys

__all__ = ["DIRECTORY_TTL", "AsyncPoolDirectory", "Placement", "PoolDirectory"]

DIRECTORY_TTL = 2.0
"""Seconds an SDK trusts what it read of a tenant's pool."""
_CACHE_SIZE = 10_000


@dataclass(frozen=True)
class Placement:
    """Where a tenant's new mail goes: its pool, and the pool it may fall back to."""

    pool: str = DEFAULT_POOL
    fallback: str | None = None


class _Core:
    """What both faces share, none of it I/O: the keys, the cache, the checks."""

    def __init__(self, settings: Settings, *, ttl: float, clock: Callable[[], float]) -> None:
        self.settings = settings
        self.keys = MailKeys(settings.key_prefix)
        self.pooled = bool(settings.pools)
        self._ttl = ttl
        self._clock = clock
        self._cache: dict[str, tuple[Placement, float]] = {}
        self._failing: tuple[frozenset[str], float] = (frozenset(), 0.0)

    def cached(self, tenant: str) -> Placement | None:
        if not self.pooled:
            return Placement()
        hit = self._cache.get(tenant)
        if hit is not None and hit[1] > self._clock():
            return hit[0]
        return None

    def remember(self, tenant: str, raw: list[Any]) -> Placement:
        pool, fallback = (text(v) if v is not None else None for v in raw)
        placement = Placement(
            self.known(pool or DEFAULT_POOL, tenant), fallback and self.known(fallback, tenant)
        )
        if len(self._cache) >= _CACHE_SIZE:
            self._cache.pop(next(iter(self._cache)))
        self._cache[tenant] = (placement, self._clock() + self._ttl)
        return placement

    def known(self, pool: str, tenant: str) -> str:
        if pool not in pool_names(self.settings):
            raise ConfigError([(
                "FAIRPOST_POOLS",
                f"tenant {tenant!r} is on pool {pool!r}, which these settings do not declare",
            )])  # fmt: skip
        return pool

    def failing_cached(self) -> frozenset[str] | None:
        pools, until = self._failing
        return pools if until > self._clock() else None

    def remember_failing(self, raw: list[Any]) -> frozenset[str]:
        pools = frozenset(text(p) for p in raw)
        self._failing = (pools, self._clock() + self._ttl)
        return pools

    @staticmethod
    def route(placement: Placement, failing: frozenset[str]) -> str:
        """The pool new mail goes to: the tenant's own, or its fallback while its own fails
        (and the fallback does not)."""
        if placement.fallback and placement.pool in failing and placement.fallback not in failing:
            return placement.fallback
        return placement.pool

    def forget(self, tenant: str) -> None:
        self._cache.pop(tenant, None)

    def read(self, tenant: str) -> list[tuple[str, str]]:
        return [(self.keys.pool_directory(), tenant), (self.keys.pool_fallback(), tenant)]


class PoolDirectory:
    """The directory, blocking (the SDK's :class:`MailClient`, the CLI)."""

    def __init__(
        self,
        settings: Settings,
        client: redis.Redis,
        *,
        ttl: float = DIRECTORY_TTL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._core = _Core(settings, ttl=ttl, clock=clock)
        self._redis = client

    def placement(self, tenant: str) -> Placement:
        """The tenant's pool and fallback, from the cache while it is fresh."""
        hit = self._core.cached(tenant)
        if hit is not None:
            return hit
        with self._redis.pipeline(transaction=False) as pipe:
            for key, field in self._core.read(tenant):
                pipe.hget(key, field)
            return self._core.remember(tenant, pipe.execute())

    def pool_of(self, tenant: str) -> str:
        """The pool the tenant is on."""
        return self.placement(tenant).pool

    def route(self, tenant: str) -> str:
        """The pool the tenant's new mail goes to now: its own, or its fallback while its
        own pool's SES fails (mailer/daemon/failover.py)."""
        placement = self.placement(tenant)
        if not placement.fallback:
            return placement.pool
        failing = self._core.failing_cached()
        if failing is None:
            failing = self._core.remember_failing(self._redis.hkeys(self._core.keys.pool_failing()))
        return self._core.route(placement, failing)

    def failing(self) -> dict[str, int]:
        """Pool → since when (ms) its fallback tenants send through their fallbacks."""
        raw = self._redis.hgetall(self._core.keys.pool_failing())
        return {text(k): int(v) for k, v in raw.items()}

    def placements(self) -> dict[str, str]:
        """Every tenant not on the default pool → its pool."""
        return {text(k): text(v) for k, v in self._redis.hgetall(self._core.keys.pool_directory()).items()}

    def place(self, tenant: str, pool: str) -> None:
        """Put the tenant's new mail on ``pool`` (idempotent)."""
        keys = self._core.keys
        self._core.known(pool, tenant)
        if pool == DEFAULT_POOL:
            self._redis.hdel(keys.pool_directory(), tenant)
        else:
            self._redis.hset(keys.pool_directory(), tenant, pool)
        self._core.forget(tenant)

    def set_fallback(self, tenant: str, pool: str | None) -> None:
        """Let the tenant's new mail go through ``pool`` while its own pool's SES fails; None: never."""
        keys = self._core.keys
        if pool is None:
            self._redis.hdel(keys.pool_fallback(), tenant)
        else:
            self._redis.hset(keys.pool_fallback(), tenant, self._core.known(pool, tenant))
        self._core.forget(tenant)

    def move(self, tenant: str) -> dict[str, Any] | None:
        """The tenant's move in progress (fairpost.mailer.ops.pool_move), if any."""
        raw = self._redis.hget(self._core.keys.pool_moves(), tenant)
        return None if raw is None else dict(json.loads(text(raw)))

    def record_move(self, tenant: str, state: dict[str, Any] | None) -> None:
        """Write (None: clear) the tenant's move in progress."""
        key = self._core.keys.pool_moves()
        if state is None:
            self._redis.hdel(key, tenant)
        else:
            self._redis.hset(key, tenant, json.dumps(state, sort_keys=True))


class AsyncPoolDirectory:
    """The directory, asyncio (the SDK's :class:`AsyncMailClient`, the daemon)."""

    def __init__(
        self,
        settings: Settings,
        client: redis.asyncio.Redis,
        *,
        ttl: float = DIRECTORY_TTL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._core = _Core(settings, ttl=ttl, clock=clock)
        self._redis = client

    async def placement(self, tenant: str) -> Placement:
        hit = self._core.cached(tenant)
        if hit is not None:
            return hit
        async with self._redis.pipeline(transaction=False) as pipe:
            for key, field in self._core.read(tenant):
                pipe.hget(key, field)
            return self._core.remember(tenant, await pipe.execute())

    async def pool_of(self, tenant: str) -> str:
        return (await self.placement(tenant)).pool

    async def route(self, tenant: str) -> str:
        """:meth:`PoolDirectory.route`."""
        placement = await self.placement(tenant)
        if not placement.fallback:
            return placement.pool
        failing = self._core.failing_cached()
        if failing is None:
            failing = self._core.remember_failing(await self._redis.hkeys(self._core.keys.pool_failing()))
        return self._core.route(placement, failing)
