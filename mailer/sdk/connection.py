"""Settings and a Redis connection, for every blocking or asyncio client fairpost
hands out (:class:`~fairpost.mailer.sdk.client.MailClient`, :class:`~fairpost.mailer.sdk.dead.DeadLetters`,
:class:`~fairpost.mailer.quota.admin.QuotaAdmin`, :class:`~fairpost.mailer.sdk.client.AsyncMailClient`).

A client given a ``redis_client`` uses it and leaves it open: its owner
closes it. A client that opened its own connection (:mod:`fairpost.dispatcher.connect`:
``FAIRPOST_REDIS_URL``, or a cluster or Sentinel by the settings) closes it on
:meth:`close` or at the end of its ``with`` block.
"""

from __future__ import annotations

from types import TracebackType
from typing import Self

import redis
import redis.asyncio

from fairpost.config import Settings, load_settings
from fairpost.dispatcher import connect

__all__ = ["AsyncRedisOwner", "RedisOwner", "timeouts"]


def timeouts(settings: Settings) -> dict[str, float]:
    """A Redis that stops answering must not hang the application: its calls end
    after FAIRPOST_REDIS_TIMEOUT, its connections after FAIRPOST_REDIS_CONNECT_TIMEOUT."""
    return {
        "socket_timeout": settings.redis_timeout,
        "socket_connect_timeout": settings.redis_connect_timeout,
    }


class RedisOwner:
    """Blocking: ``settings`` (from ``FAIRPOST_*`` if not given) and ``_redis``."""

    def __init__(self, settings: Settings | None = None, *, redis_client: redis.Redis | None = None) -> None:
        self.settings = settings or load_settings()
        self._owns_redis = redis_client is None
        self._redis = redis_client or connect.redis_client(self.settings, **timeouts(self.settings))

    def close(self) -> None:
        if self._owns_redis:
            self._redis.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncRedisOwner:
    """asyncio: ``settings`` (from ``FAIRPOST_*`` if not given) and ``_redis``."""

    def __init__(
        self, settings: Settings | None = None, *, redis_client: redis.asyncio.Redis | None = None
    ) -> None:
        self.settings = settings or load_settings()
        self._owns_redis = redis_client is None
        self._redis = redis_client or connect.async_redis_client(self.settings, **timeouts(self.settings))

    async def aclose(self) -> None:
        if self._owns_redis:
            await self._redis.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()
