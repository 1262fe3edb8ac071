"""The pool directory (#43): which sending pool each tenant is on, and its fallback.

The only module that reads or writes the directory's keys
(:meth:`~fairpost.mailer.sdk.keys.MailKeys.pool_directory` and its neighbours), all in
the default pool's slot. A tenant with no entry is on the default pool, so an
installation that declares no pool never reads the directory at all.

Every SDK caches a tenant's answer for :data:`DIRECTORY_TTL` seconds: a tenant
moved (``fairpost tenant move``) sends its new mail to its new pool within that
time on every client, with no restart. Mail enqueued in the old pool meanwhile
drains there (docs/operations.md, "Sending pools").

A fallback is followed only once its identities were found in the fallback pool's
SES (:class:`FallbackCheck`, ``verified``): ``fairpost tenant fallback`` writes that
verdict with the fallback when it checked, and the daemon serving the fallback pool
asks SES for every fallback without a fresh verdict
(mailer/daemon/fallback_checks.py). A fallback with no verdict (set through the SDK,
with ``--skip-identity-check``, or before verdicts were kept) is not followed until
the daemon has verified it.
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
from fairpost.dispatcher.replies import text, time_ms
from fairpost.mailer.sdk.keys import MailKeys

__all__ = ["DIRECTORY_TTL", "AsyncPoolDirectory", "FallbackCheck", "Placement", "PoolDirectory"]

DIRECTORY_TTL = 2.0
"""Seconds an SDK trusts what it read of a tenant's pool."""
_CACHE_SIZE = 10_000


@dataclass(frozen=True)
class FallbackCheck:
    """Whether a tenant's identities were found in its fallback pool's SES, and when (ms)."""

    pool: str
    verified: bool
    at_ms: int

    def to_json(self) -> str:
        return json.dumps({"pool": self.pool, "verified": self.verified, "at_ms": self.at_ms})

    @classmethod
    def from_json(cls, raw: Any) -> FallbackCheck | None:
        if raw is None:
            return None
        found = json.loads(text(raw))
        return cls(str(found["pool"]), bool(found["verified"]), int(found["at_ms"]))


@dataclass(frozen=True)
class Placement:
    """Where a tenant's new mail goes: its pool, and the pool it may fall back to."""

    pool: str = DEFAULT_POOL
    fallback: str | None = None
    check: FallbackCheck | None = None
    """The last look at the fallback's identities (None: not looked at yet)."""

    @property
    def fallback_identities(self) -> str:
        """``verified``, ``refused`` or ``unchecked``: the fallback is followed only if verified."""
        if self.fallback is None or self.check is None or self.check.pool != self.fallback:
            return "unchecked"
        return "verified" if self.check.verified else "refused"


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
        pool, fallback = (text(v) if v is not None else None for v in raw[:2])
        placement = Placement(
            self.known(pool or DEFAULT_POOL, tenant),
            fallback and self.known(fallback, tenant),
            FallbackCheck.from_json(raw[2]) if fallback else None,
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
        """The pool new mail goes to: the tenant's own, or its verified fallback while its
        own fails (and the fallback does not)."""
        if (
            placement.fallback
            and placement.fallback_identities == "verified"
            and placement.pool in failing
            and placement.fallback not in failing
        ):
            return placement.fallback
        return placement.pool

    def forget(self, tenant: str) -> None:
        self._cache.pop(tenant, None)

    def read(self, tenant: str) -> list[tuple[str, str]]:
        keys = self.keys
        return [
            (keys.pool_directory(), tenant),
            (keys.pool_fallback(), tenant),
            (keys.pool_fallback_checks(), tenant),
        ]


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

    def set_fallback(self, tenant: str, pool: str | None, *, verified: bool = False) -> None:
        """Let the tenant's new mail go through ``pool`` while its own pool's SES fails; None:
        never. ``verified``: its identities were found in that pool's SES just now; else the
        fallback waits for the daemon's own check (mailer/daemon/fallback_checks.py)."""
        keys = self._core.keys
        check = None
        if pool is not None:
            self._core.known(pool, tenant)
            check = FallbackCheck(pool, True, time_ms(self._redis.time())) if verified else None
        with self._redis.pipeline(transaction=True) as pipe:
            if pool is None:
                pipe.hdel(keys.pool_fallback(), tenant)
            else:
                pipe.hset(keys.pool_fallback(), tenant, pool)
            if check is None:
                pipe.hdel(keys.pool_fallback_checks(), tenant)
            else:
                pipe.hset(keys.pool_fallback_checks(), tenant, check.to_json())
            pipe.execute()
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

    async def fallbacks_to(self, pool: str) -> dict[str, FallbackCheck | None]:
        """Every tenant whose fallback is ``pool`` → the last look at its identities there."""
        keys = self._core.keys
        tenants = [
            text(t) for t, p in (await self._redis.hgetall(keys.pool_fallback())).items() if text(p) == pool
        ]
        if not tenants:
            return {}
        checks = await self._redis.hmget(keys.pool_fallback_checks(), tenants)
        return {
            tenant: check if check is not None and check.pool == pool else None
            for tenant, check in zip(tenants, map(FallbackCheck.from_json, checks), strict=True)
        }

    async def record_check(self, tenant: str, check: FallbackCheck) -> bool:
        """Write the verdict on the tenant's fallback, unless its fallback changed meanwhile
        (the verdict would be on another pool's SES); whether it was written."""
        keys = self._core.keys
        async with self._redis.pipeline(transaction=True) as pipe:
            try:
                await pipe.watch(keys.pool_fallback())
                current = await pipe.hget(keys.pool_fallback(), tenant)
                if current is None or text(current) != check.pool:
                    return False
                pipe.multi()  # type: ignore[no-untyped-call]  # redis-py leaves it untyped
                pipe.hset(keys.pool_fallback_checks(), tenant, check.to_json())
                await pipe.execute()
            except redis.WatchError:
                return False
        self._core.forget(tenant)
        return True

    async def now_ms(self) -> int:
        """Redis's clock, which the verdicts' ``at_ms`` are on."""
        return time_ms(await self._redis.time())
