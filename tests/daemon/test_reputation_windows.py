"""The reputation windows' buckets and totals (reputation.lua), against a real Redis.

The script reads Redis's clock; the tests plant buckets around the current one
(30-minute buckets in the 24-hour window) and check what a call counts and leaves.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest
import redis.asyncio

from fairpost.config import Settings, load_settings
from fairpost.dispatcher.replies import time_ms
from fairpost.mailer.quota.reputation import GuardState, ReputationBook, WindowCounts, lift_guard
from fairpost.mailer.sdk.keys import MailKeys

KEYS = MailKeys("rep-windows")
DAY = 86_400
WIDTH = DAY * 1000 // 48


@pytest.fixture
def settings(redis_url: str) -> Settings:
    return load_settings(redis_url=redis_url)


@pytest.fixture
async def client(settings: Settings) -> AsyncIterator[redis.asyncio.Redis]:
    async with redis.asyncio.Redis.from_url(settings.redis_url, decode_responses=True) as c:
        yield c


@pytest.fixture
def book(client: redis.asyncio.Redis, settings: Settings) -> ReputationBook:
    return ReputationBook(client, KEYS, settings)


async def current_bucket(client: redis.asyncio.Redis) -> int:
    return time_ms(await client.time()) // WIDTH


def day_counts(counts: tuple[WindowCounts, ...]) -> tuple[int, int, int]:
    [day] = [w for w in counts if w.seconds == DAY]
    return day.sends, day.bounces, day.complaints


async def test_buckets_that_left_the_window_leave_its_totals_and_its_hash(
    client: redis.asyncio.Redis, book: ReputationBook
) -> None:
    key = KEYS.reputation("acme", DAY)
    idx = await current_bucket(client)
    first = idx - 47
    await client.hset(
        key,
        mapping={
            "lo": first - 3,
            f"{first - 3}:s": 5,
            f"{first - 1}:b": 2,
            f"{first + 1}:s": 7,
            f"{first + 1}:c": 1,
            "s": 12,
            "b": 2,
            "c": 1,
        },
    )

    rep = await book.read("acme", sends=3)

    assert day_counts(rep.windows) == (10, 0, 1)
    fields = await client.hgetall(key)
    assert fields == {
        "lo": str(first),
        f"{first + 1}:s": "7",
        f"{first + 1}:c": "1",
        f"{idx}:s": "3",
        "s": "10",
        "b": "0",
        "c": "1",
    }
    # A read alone counts the same and adds nothing.
    assert day_counts((await book.read("acme")).windows) == (10, 0, 1)


async def test_a_window_idle_for_longer_than_itself_starts_afresh(
    client: redis.asyncio.Redis, book: ReputationBook
) -> None:
    key = KEYS.reputation("acme", DAY)
    first = await current_bucket(client) - 47
    await client.hset(key, mapping={"lo": first - 60, f"{first - 60}:s": 9, "s": 9})

    rep = await book.read("acme", sends=2, bounces=1)

    assert day_counts(rep.windows) == (2, 1, 0)
    assert await client.hget(key, "lo") == str(first + 47)


async def test_the_key_lives_until_its_newest_bucket_has_left_the_window(
    client: redis.asyncio.Redis, book: ReputationBook
) -> None:
    key = KEYS.reputation("acme", DAY)
    await book.read("acme", sends=1)
    await book.read("acme", complaints=1)

    async with client.pipeline(transaction=False) as pipe:
        pipe.pttl(key)
        pipe.time()
        ttl, now = await pipe.execute()
    idx = time_ms(now) // WIDTH
    # Bucket idx counts until bucket idx+48 begins.
    assert ttl >= (idx + 48) * WIDTH - time_ms(now)
    assert day_counts((await book.read("acme")).windows) == (1, 0, 1)


async def test_after_a_lift_only_what_came_since_is_judged(
    client: redis.asyncio.Redis, book: ReputationBook, settings: Settings
) -> None:
    await book.read("acme", sends=10, bounces=4)
    paused = GuardState(
        level="paused", reason="r", bounce_rate=0.4, complaint_rate=0.0, window="24h", at_ms=0, override=None
    )
    await client.hset(KEYS.guard(), "acme", json.dumps(paused.to_json()))
    with redis.Redis.from_url(settings.redis_url) as sync:
        lift_guard(sync, KEYS, "acme")

    rep = await book.read("acme", sends=5, bounces=1)

    [day] = [w for w in rep.windows if w.seconds == DAY]
    assert (day.sends, day.bounces) == (15, 5)
    assert (day.judged_sends, day.judged_bounces) == (5, 1)
