"""A daemon told to wait for replicas says so at start when the master has fewer
connected: otherwise every enqueue, quota grant and sent record fails with
NotReplicated and the first sign is a wall of errors. Real redis-servers, one a
replica of the other."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import redis.asyncio

from fairpost.dispatcher.durable import replica_shortfall
from fairpost.mailer.testing.services import redis_server
from fairpost.mailer.testing.wait import wait_for_async


@pytest.fixture
async def lone(redis_url: str) -> AsyncIterator[redis.asyncio.Redis]:
    async with redis.asyncio.Redis.from_url(redis_url) as client:
        yield client


async def test_a_lone_server_falls_short_of_one_replica(lone: redis.asyncio.Redis) -> None:
    warning = await replica_shortfall(lone, 1)
    assert warning is not None
    assert "FAIRPOST_REDIS_MIN_REPLICAS=1" in warning
    assert "0 replicas connected" in warning
    assert await replica_shortfall(lone, 0) is None


async def test_a_master_with_its_replica_connected_is_enough() -> None:
    with redis_server() as master, redis_server() as replica:
        async with (
            redis.asyncio.Redis(port=master.port) as primary,
            redis.asyncio.Redis(port=replica.port) as secondary,
        ):
            await secondary.replicaof("127.0.0.1", master.port)

            async def connected() -> bool:
                info = await primary.info("replication")
                return int(info.get("connected_slaves", 0)) == 1

            await wait_for_async(connected, within=30, what="the replica to connect")
            assert await replica_shortfall(primary, 1) is None
            warning = await replica_shortfall(primary, 2)
            assert warning is not None and "1 replica connected" in warning
