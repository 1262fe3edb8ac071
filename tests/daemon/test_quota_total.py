"""The quota windows' running totals and TTLs (windows.lua's "n", "lo" and "hi").

A grant reads a window's total from the hash instead of every bucket, so the
total must be the sum of the buckets after every operation, no bucket may sit
below "lo", and the key must live until its newest bucket leaves the window,
also after a restamp moved units to a newer bucket. Against a real redis-server.
"""

from __future__ import annotations

from typing import Any

import pytest
from redis.asyncio import Redis

from fairpost.config.limits import Window
from fairpost.dispatcher.replies import time_ms
from fairpost.mailer.quota.engine import SHARE_PARTS, QuotaEngine
from tests.daemon.test_quota import AHEAD, BUCKETS, T0, assert_consistent
from tests.support import KEYS

TEN = Window(10, 100)  # 500 ms buckets
WIDTH = 10_000 // BUCKETS


@pytest.fixture
def engine(aredis: Redis) -> QuotaEngine:
    return QuotaEngine(aredis, KEYS, buckets_per_window=BUCKETS)


async def expiry_left(aredis: Redis, key: str) -> tuple[int, int, int]:
    """(PTTL, Redis time in ms just before it, just after it): PTTL counts from its own
    millisecond, which a loaded server may read one or more ms apart from a TIME beside it."""
    async with aredis.pipeline(transaction=False) as pipe:
        pipe.time()
        pipe.pttl(key)
        pipe.time()
        before, ttl, after = await pipe.execute()
    return ttl, time_ms(before), time_ms(after)


async def test_the_total_is_the_sum_of_the_buckets_after_grants_prunes_and_refunds(
    engine: QuotaEngine, aredis: Redis
) -> None:
    key = KEYS.quota("t:a", 10)
    first = await engine.acquire("a", [3, 4], [], [TEN], now_ms=T0 + 10)
    await engine.acquire("a", [5], [], [TEN], now_ms=T0 + 2_600)
    await engine.refund("a", 4, first.at_ms, [], [TEN])
    assert await assert_consistent(aredis, key) == {T0 // WIDTH: 3, T0 // WIDTH + 5: 5}

    # 10 s later the first bucket has left the window: a grant deletes it and its units.
    await engine.acquire("a", [1], [], [TEN], now_ms=T0 + 10_600)
    assert await assert_consistent(aredis, key) == {T0 // WIDTH + 5: 5, T0 // WIDTH + 21: 1}
    assert await engine.usage("a", [TEN], now_ms=T0 + 10_600) == [(TEN, 6)]

    # Long idle (a test's clock: the key outlives its window): everything goes at once.
    await engine.acquire("a", [2], [], [TEN], now_ms=T0 + 60_000)
    assert await assert_consistent(aredis, key) == {(T0 + 60_000) // WIDTH: 2}


async def test_a_refused_grant_names_the_time_the_buckets_say(engine: QuotaEngine, aredis: Redis) -> None:
    await engine.acquire("a", [60], [], [TEN], now_ms=T0 + 10)
    await engine.acquire("a", [40], [], [TEN], now_ms=T0 + 700)

    refused = await engine.acquire("a", [50], [], [TEN], now_ms=T0 + 800)

    # 50 fit once the first bucket [T0, T0+500) has left: at T0 + 500 + 10,000 - 1.
    assert refused.granted == 0
    assert refused.retry_after == pytest.approx((10_499 - 800) / 1000)
    await assert_consistent(aredis, KEYS.quota("t:a", 10))


async def test_a_restamp_moves_the_units_and_the_key_lives_until_their_bucket_leaves(
    engine: QuotaEngine, aredis: Redis
) -> None:
    key = KEYS.quota("t:a", 10)
    # Granted 3 s ago (the hook), so the restamp moves the units to another bucket.
    granted_at = time_ms(await aredis.time()) - 3_000
    grant = await engine.acquire("a", [4, 2], [], [TEN], now_ms=granted_at)

    returned = await engine.restamp("a", 6, grant.at_ms, [], [TEN])

    assert returned is not None
    assert await assert_consistent(aredis, key) == {returned // WIDTH: 6}
    # Its bucket stops counting at (k+1)*w + W - 1; the key lives that long, and AHEAD buckets more.
    ttl, before, after = await expiry_left(aredis, key)
    ends = (returned // WIDTH + AHEAD + 1) * WIDTH + 10_000 - 1
    # The script's PEXPIRE counts from its own clock, a little after the TIME it read `now`
    # from: the key may outlive `ends` by that (a bucket too many would be 500 ms).
    assert ends - after - 1 <= ttl <= ends - before + 50


async def test_a_restamp_after_the_key_expired_counts_the_units_again(
    engine: QuotaEngine, aredis: Redis
) -> None:
    key = KEYS.quota("t:a", 10)
    grant = await engine.acquire("a", [4], [], [TEN])
    await aredis.delete(key)

    returned = await engine.restamp("a", 4, grant.at_ms, [], [TEN])

    assert returned is not None
    assert await assert_consistent(aredis, key) == {returned // WIDTH: 4}
    assert await aredis.pttl(key) > 9_000


async def test_refunding_every_unit_deletes_the_hash(engine: QuotaEngine, aredis: Redis) -> None:
    grant = await engine.acquire("a", [2, 3], [], [TEN], now_ms=T0 + 10)

    await engine.refund("a", 2, grant.at_ms, [], [TEN])
    await assert_consistent(aredis, KEYS.quota("t:a", 10))
    await engine.refund("a", 3, grant.at_ms, [], [TEN])

    assert await aredis.exists(KEYS.quota("t:a", 10)) == 0


async def test_the_share_keys_live_as_long_as_their_longest_stay(engine: QuotaEngine, aredis: Redis) -> None:
    share = [KEYS.quota_share(part) for part in SHARE_PARTS]
    tags, untils, weights, refused = share
    now = time_ms(await aredis.time())
    one, memory = Window(1, 10), 2_000  # a tenant contends 2 s after asking (a 1 s window)

    async def stays_covered() -> None:
        """Tags, untils and weights expire together, after every tenant's stay (the
        highest "until"), and at most half a memory later."""
        entries: list[Any] = await aredis.zrange(untils, 0, -1, withscores=True)
        longest = max(score for _, score in entries)
        ttls = [await aredis.pttl(key) for key in (tags, untils, weights)]
        assert max(ttls) - min(ttls) <= 50
        stay = int(longest) - now
        assert stay - 100 <= min(ttls) and max(ttls) <= stay + memory // 2

    # Created by this call: no TTL yet, so the call sets one.
    await engine.acquire("a", [10], [one], [TEN], weight=1, now_ms=now)
    await stays_covered()
    # Refused for global room: refused until it is due back, plus 50 ms for its
    # wake-up (acquire.lua's DUE_SLACK_MS); contending as long, plus the memory.
    refusal = await engine.acquire("b", [1], [one], [TEN], weight=1, now_ms=now)
    assert refusal.blocked_by == "global"
    longest = round(refusal.retry_after * 1000) + 50
    assert longest - 100 <= await aredis.pttl(refused) <= longest
    await stays_covered()
    # A later call with a shorter stay leaves the longer TTLs alone.
    await engine.acquire("a", [1], [Window(1, 1000)], [TEN], weight=1, now_ms=now + 5)
    await stays_covered()
    assert longest - 100 <= await aredis.pttl(refused) <= longest
    # Its last tenant forgotten, a key is created again, and expires with the others.
    await aredis.delete(tags, untils)
    await engine.acquire("a", [1], [Window(1, 1000)], [TEN], weight=1, now_ms=now + 10)
    assert await aredis.pttl(tags) > 0
    # (The test's clock runs a few ms off Redis's: TTLs are counted on Redis's.)
    assert abs(await aredis.pttl(tags) - await aredis.pttl(weights)) <= 50


async def test_a_peek_counts_as_a_grant_does_with_buckets_that_left_still_in_the_hash(
    engine: QuotaEngine, aredis: Redis
) -> None:
    # 60 units 10 s ago (out of the window now, but still in the hash: only a grant deletes
    # them), 30 in it: 70 fit by the window, 10 by the total with the old bucket in it.
    await engine.acquire("a", [60], [], [TEN], now_ms=T0 + 10)
    await engine.acquire("a", [30], [], [TEN], now_ms=T0 + 5_000)
    later = T0 + 10_600
    assert len(await assert_consistent(aredis, KEYS.quota("t:a", 10))) == 2

    assert await engine.retry_after("a", [TEN], cost=5, now_ms=later) == 0.0
    assert await engine.retry_after("a", [TEN], cost=70, now_ms=later) == 0.0
    # 71 fits once the 30 have left: their bucket [T0+5000, T0+5500) ends, and a window.
    assert await engine.retry_after("a", [TEN], cost=71, now_ms=later) == pytest.approx(
        (5_500 + 10_000 - 1 - 10_600) / 1000
    )
    assert await engine.usage("a", [TEN], now_ms=later) == [(TEN, 30)]
    assert len(await assert_consistent(aredis, KEYS.quota("t:a", 10))) == 2
