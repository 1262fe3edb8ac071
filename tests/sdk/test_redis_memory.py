"""dispatcher/redis_memory.py: Redis's memory and eviction policy, read from INFO, judged once."""

from __future__ import annotations

import pytest
import redis
import redis.asyncio

from fairpost.config import load_settings
from fairpost.dispatcher.errors import EvictingRedis
from fairpost.dispatcher.redis_memory import (
    RedisMemory,
    aread_memory,
    check_policy,
    judge_policy,
    read_masters,
    read_memory,
)
from tests.support.memory import MAXMEMORY, LimitedRedis, fill_to


@pytest.mark.parametrize("policy", ["noeviction", "volatile-lru", "allkeys-lru"])
def test_read_memory_says_the_limit_and_policy_the_server_was_started_with(
    limited_redis_srv: LimitedRedis, policy: str
) -> None:
    with redis.Redis.from_url(limited_redis_srv.url(policy)) as client:
        memory = read_memory(client)
    assert (memory.maxmemory, memory.policy, memory.evicted_keys) == (MAXMEMORY, policy, 0)
    assert 0 < memory.used_memory < MAXMEMORY
    assert memory.fill == memory.used_memory / MAXMEMORY


async def test_the_async_face_reads_the_same(limited_redis_srv: LimitedRedis) -> None:
    url = limited_redis_srv.url("volatile-lru")
    client = redis.asyncio.Redis.from_url(url)
    try:
        memory = await aread_memory(client)
    finally:
        await client.aclose()
    assert (memory.maxmemory, memory.policy) == (MAXMEMORY, "volatile-lru")


def test_read_memory_does_not_use_config(limited_redis_srv: LimitedRedis) -> None:
    """Managed services refuse CONFIG: a Redis that renamed it away still answers."""
    url = limited_redis_srv.url("noeviction")
    with redis.Redis.from_url(url) as client:
        client.acl_setuser("app", enabled=True, passwords=["+pw"], commands=["+@all", "-config"], keys=["*"])
    try:
        with redis.Redis.from_url(url, username="app", password="pw") as client:
            with pytest.raises(redis.exceptions.NoPermissionError):
                client.config_get("maxmemory")
            assert read_memory(client).maxmemory == MAXMEMORY
    finally:
        with redis.Redis.from_url(url) as client:
            client.acl_deluser("app")


def test_evicted_keys_counts_what_redis_dropped(limited_redis_srv: LimitedRedis) -> None:
    with redis.Redis.from_url(limited_redis_srv.url("allkeys-lru")) as client:
        fill_to(client, 1.2)
        memory = read_memory(client)
    assert memory.evicted_keys > 0


@pytest.mark.parametrize(
    ("policy", "maxmemory", "level"),
    [
        ("noeviction", MAXMEMORY, "ok"),
        ("volatile-lru", 0, "ok"),
        ("volatile-lru", MAXMEMORY, "guarded"),
        ("volatile-ttl", MAXMEMORY, "guarded"),
        ("allkeys-lru", MAXMEMORY, "refused"),
        ("allkeys-lfu", 0, "refused"),
    ],
)
def test_judge_policy(policy: str, maxmemory: int, level: str) -> None:
    verdict = judge_policy(RedisMemory(100, maxmemory, policy, 0), 0.85)
    assert verdict.level == level
    assert policy in verdict.reason


def test_check_policy_names_the_setting_and_the_fix() -> None:
    with pytest.raises(EvictingRedis) as raised:
        check_policy(RedisMemory(100, MAXMEMORY, "allkeys-lru", 0), 0.85)
    assert raised.value.retriable is False
    assert "maxmemory-policy is allkeys-lru" in str(raised.value)
    assert "noeviction" in raised.value.fix


def test_above_the_high_water_mark() -> None:
    assert RedisMemory(90, 100, "noeviction", 0).above(0.85)
    assert not RedisMemory(80, 100, "noeviction", 0).above(0.85)
    assert not RedisMemory(10**9, 0, "noeviction", 0).above(0.85)  # no limit, never full


def test_read_masters_of_one_server(limited_redis_srv: LimitedRedis) -> None:
    [memory] = read_masters(load_settings(redis_url=limited_redis_srv.url("volatile-lru")))
    assert (memory.maxmemory, memory.policy) == (MAXMEMORY, "volatile-lru")


@pytest.mark.cluster
def test_read_masters_of_a_cluster_reads_every_master(topology_cluster: dict[str, object]) -> None:
    masters = read_masters(load_settings(**topology_cluster))
    assert len(masters) == 3
    assert len({memory.node for memory in masters}) == 3
    assert all(memory.used_memory > 0 for memory in masters)


@pytest.fixture
def topology_cluster(request: pytest.FixtureRequest) -> dict[str, object]:
    cluster = request.getfixturevalue("cluster_srv")
    cluster.flush()
    return {"redis_url": cluster.url, "redis_cluster": True}
