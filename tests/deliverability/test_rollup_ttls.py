"""What rollups.lua spends on its keys' TTLs: each set when it must be, not at every
call. Counted in Redis commands (``INFO commandstats``) and read from the keys'
TTLs against Redis's clock, never timed."""

from __future__ import annotations

from typing import Any

import redis
import redis.asyncio

from fairpost.config import Settings
from fairpost.dispatcher.replies import time_ms
from fairpost.mailer.sdk.keys import MailKeys
from fairpost.mailer.sdk.rollups import RollupWriter


def calls(client: redis.Redis) -> dict[str, int]:
    stats: dict[str, Any] = client.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}


async def two_groups(
    aredis: redis.asyncio.Redis, redis_client: redis.Redis, settings: Settings, period_ms: int
) -> tuple[int, dict[str, int]]:
    """Two groups of two sends counted on an empty Redis within one period of Redis's
    clock (a minute, a day; tried again if it turned meanwhile): when they began, and
    the commands they ran."""
    writer = RollupWriter(aredis, MailKeys(settings.key_prefix), settings)
    while True:
        redis_client.flushall()
        before, start = calls(redis_client), time_ms(redis_client.time())
        for _ in range(2):
            async with aredis.pipeline(transaction=False) as pipe:
                await writer.queue(pipe, "acme", {("gmail", "sent"): 2}, sent_now=2)
                await pipe.execute()
        after, end = calls(redis_client), time_ms(redis_client.time())
        if start // period_ms == end // period_ms:
            return start, {name: n - before.get(name, 0) for name, n in after.items()}


async def test_a_minute_of_sends_pushes_the_historys_ttl_once_and_it_outlives_the_hour(
    aredis: redis.asyncio.Redis, redis_client: redis.Redis, settings: Settings
) -> None:
    keys = MailKeys(settings.key_prefix)
    histories = (keys.send_history("t:acme"), keys.send_history("global"))
    start, ran = await two_groups(aredis, redis_client, settings, 60_000)
    # Two groups in one minute: each history's TTL pushed by the first only (and the
    # day's hash, new, given its TTL).
    assert ran["expire"] == 2 + 1
    # The minute's count is read for an hour after the minute ends: the history outlives it.
    minute_ends = (start // 60_000 + 1) * 60_000
    for key in histories:
        assert redis_client.hget(key, str(start // 60_000 % 60)) == f"{start // 60_000}:4"
        with redis_client.pipeline(transaction=True) as pipe:  # TTL and clock at one moment
            pipe.pttl(key)
            pipe.time()
            ttl, now = pipe.execute()
        assert time_ms(now) + ttl >= minute_ends + 3_600_000 - 1  # (- 1: TTLs in whole ms)


async def test_a_days_ttl_is_looked_at_only_by_the_call_that_may_make_the_day(
    aredis: redis.asyncio.Redis, redis_client: redis.Redis, settings: Settings
) -> None:
    start, ran = await two_groups(aredis, redis_client, settings, 86_400_000)
    assert ran["ttl"] == 1
    day = MailKeys(settings.key_prefix).rollup_prefix("acme") + str(start // 86_400_000)
    assert redis_client.hget(day, "gmail:sent") == "4"
    assert 0 < redis_client.ttl(day) <= settings.deliverability.retention_days * 86400
