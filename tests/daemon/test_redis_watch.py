"""The daemon's memory watch (mailer/daemon/redis_watch.py) on real redis-servers with maxmemory."""

from __future__ import annotations

import asyncio
import logging

import pytest
import redis
import redis.asyncio
from prometheus_client import CollectorRegistry

from fairpost.config import load_settings
from fairpost.dispatcher.errors import EvictingRedis
from fairpost.mailer.daemon.redis_metrics import RedisMemoryMetrics
from fairpost.mailer.daemon.redis_watch import RedisWatch
from tests.support.memory import LimitedRedis, fill_to


async def test_evictions_are_logged_and_counted(
    limited_redis_srv: LimitedRedis, caplog: pytest.LogCaptureFixture
) -> None:
    url = limited_redis_srv.url("volatile-lru")
    client = redis.asyncio.Redis.from_url(url)
    registry = CollectorRegistry()
    gauges = RedisMemoryMetrics(registry, 0.85)
    try:
        watch = RedisWatch(client, load_settings(redis_url=url), gauges)
        assert (await watch.start()).level == "guarded"
        with redis.Redis.from_url(url) as plain:
            fill_to(plain, 1.5, ttl=600)  # a neighbour's cache, evicted at the limit
        with caplog.at_level(logging.ERROR, logger="fairpost.redis_memory"):
            await watch.check()
    finally:
        await client.aclose()
    assert any("Redis evicted" in r.getMessage() for r in caplog.records)
    assert (registry.get_sample_value("fairpost_redis_evicted_keys") or 0) > 0


async def test_the_watch_ends_with_the_refusal_when_the_policy_turns_allkeys(
    limited_redis_srv: LimitedRedis,
) -> None:
    url = limited_redis_srv.url("noeviction")
    client = redis.asyncio.Redis.from_url(url)
    settings = load_settings(redis_url=url, redis_memory_check_seconds=1)
    try:
        watch = RedisWatch(client, settings, RedisMemoryMetrics(CollectorRegistry(), 0.85))
        await watch.start()
        running = asyncio.create_task(watch.run(asyncio.Event()))
        with redis.Redis.from_url(url) as plain:
            plain.config_set("maxmemory-policy", "allkeys-lfu")
        with pytest.raises(EvictingRedis, match="allkeys-lfu"):
            await asyncio.wait_for(running, timeout=10)
    finally:
        await client.aclose()


async def test_a_stop_ends_the_watch_cleanly(limited_redis_srv: LimitedRedis) -> None:
    url = limited_redis_srv.url("noeviction")
    client = redis.asyncio.Redis.from_url(url)
    try:
        watch = RedisWatch(
            client, load_settings(redis_url=url), RedisMemoryMetrics(CollectorRegistry(), 0.85)
        )
        stop = asyncio.Event()
        running = asyncio.create_task(watch.run(stop))
        stop.set()
        await asyncio.wait_for(running, timeout=10)  # no refusal: returns
    finally:
        await client.aclose()
