"""Fair share of the global quota: when it may refuse (issue 12, item 6) and what an
acquire costs with many contending tenants (issue 14), on the real quota scripts.

A share refusal may only happen while another tenant is actually refused for
global room, and never for longer than until that tenant is due back (plus a
few ms for its wake-up): room nobody waits for goes to whoever asks. Per
acquire the share state is read in O(log n) of the contending tenants.
"""

from __future__ import annotations

import redis.asyncio

from fairpost.config.limits import Window
from fairpost.mailer.quota.engine import QuotaEngine
from tests.support import KEYS

T0 = 1_700_000_000_000 - 1_700_000_000_000 % 86_400_000
HOUR_MS = 3_600_000
DAY_ONLY = [Window(86400, 1000)]
ROOMY = [Window(1, 100_000)]
DUE_SLACK_MS = 50
"""How late after its due time a tenant refused for room may come back and still
find its share kept (acquire.lua)."""


async def test_a_day_only_global_window_does_not_park_a_tenant_for_a_day_with_room_left(
    engine: QuotaEngine,
) -> None:
    # Today: [0, 86400000, 3] with 708 units free and b idle for 20 h.
    await engine.acquire("a", [1], DAY_ONLY, ROOMY, weight=1, now_ms=T0)
    await engine.acquire("b", [1], DAY_ONLY, ROOMY, weight=9, now_ms=T0)
    assert (await engine.acquire("a", [200], DAY_ONLY, ROOMY, weight=1, now_ms=T0 + 1)).granted == 1
    # b is refused for global room once, then sends something smaller and goes quiet.
    refused = await engine.acquire("b", [900], DAY_ONLY, ROOMY, weight=9, now_ms=T0 + 2)
    assert refused.blocked_by == "global"
    assert (await engine.acquire("b", [90], DAY_ONLY, ROOMY, weight=9, now_ms=T0 + 3)).granted == 1

    later = await engine.acquire("a", [1], DAY_ONLY, ROOMY, weight=1, now_ms=T0 + 20 * HOUR_MS)

    assert (later.granted, later.blocked_by) == (1, None)


async def test_a_share_refusal_lasts_only_until_the_refused_tenant_is_due_back(engine: QuotaEngine) -> None:
    await engine.acquire("a", [1], DAY_ONLY, ROOMY, weight=1, now_ms=T0)
    await engine.acquire("b", [1], DAY_ONLY, ROOMY, weight=9, now_ms=T0)
    assert (await engine.acquire("a", [200], DAY_ONLY, ROOMY, weight=1, now_ms=T0 + 1)).granted == 1
    # b waits for room for 900 (a's units leave the day window a day later).
    refused = await engine.acquire("b", [900], DAY_ONLY, ROOMY, weight=9, now_ms=T0 + 2)
    assert refused.blocked_by == "global"
    due_ms = T0 + 2 + round(refused.retry_after * 1000)

    # a is far ahead of its share while b is refused: it waits, but not past b's return.
    held = await engine.acquire("a", [1], DAY_ONLY, ROOMY, weight=1, now_ms=T0 + 30_000)
    assert (held.granted, held.blocked_by) == (0, "share")
    assert T0 + 30_000 + held.retry_after * 1000 <= due_ms + 60_000

    # b never came back (its mail was cancelled): once it is overdue, nobody is refused.
    after = await engine.acquire("a", [1], DAY_ONLY, ROOMY, weight=1, now_ms=due_ms + 60_001)
    assert after.granted == 1


async def _b_refused_for_room_behind_a(engine: QuotaEngine, windows: list[Window]) -> int:
    """a takes 11 of a 12 a second window, b 1; b is then refused for room: when it is
    due back (ms). a is 10 units ahead of b, a share 6."""
    await engine.acquire("b", [1], windows, ROOMY, weight=1, now_ms=T0)
    await engine.acquire("a", [1], windows, ROOMY, weight=1, now_ms=T0)
    assert (await engine.acquire("a", [10], windows, ROOMY, weight=1, now_ms=T0 + 1)).granted == 1
    refused = await engine.acquire("b", [1], windows, ROOMY, weight=1, now_ms=T0 + 10)
    assert refused.blocked_by == "global"
    return T0 + 10 + round(refused.retry_after * 1000)


async def test_a_share_refusal_ends_when_the_refused_tenant_is_due_back(engine: QuotaEngine) -> None:
    windows = [Window(1, 12)]
    due_ms = await _b_refused_for_room_behind_a(engine, windows)
    # Room is free from b's due time on. a is 10 units ahead of b, a share is 6:
    # held while b is due (b's wake-up may be a few ms late), not a window longer.
    held = await engine.acquire("a", [1], windows, ROOMY, weight=1, now_ms=due_ms)
    assert (held.granted, held.blocked_by) == (0, "share")
    assert held.retry_after * 1000 <= DUE_SLACK_MS
    # b did not come back (its mail was cancelled, or it is late): the room it
    # was due is anyone's, though a is still ahead.
    free = await engine.acquire("a", [1], windows, ROOMY, weight=1, now_ms=due_ms + DUE_SLACK_MS + 1)
    assert (free.granted, free.blocked_by) == (1, None)


async def test_a_tenant_granted_in_full_holds_nobody_back_after_the_slack(engine: QuotaEngine) -> None:
    windows = [Window(1, 12)]
    due_ms = await _b_refused_for_room_behind_a(engine, windows)
    # b is back on time and granted what it asked: it waits for room no more.
    assert (await engine.acquire("b", [1], windows, ROOMY, weight=1, now_ms=due_ms)).granted == 1
    free = await engine.acquire("a", [1], windows, ROOMY, weight=1, now_ms=due_ms + DUE_SLACK_MS + 1)
    assert (free.granted, free.blocked_by) == (1, None)


async def _contend(
    engine: QuotaEngine, client: redis.asyncio.Redis, count: int, windows: list[Window]
) -> None:
    """``count`` tenants t0..t(count-1) ask for one unit each (granted), weights 1, 2, 3, 1, ..."""
    for i in range(count):
        grant = await engine.acquire(f"t{i}", [1], windows, ROOMY, weight=1 + i % 3, now_ms=T0 + 1)
        assert grant.granted == 1
        if i % 100 == 99:
            await _hold(client)
    await _hold(client)


async def _hold(client: redis.asyncio.Redis) -> None:
    """Keep the quota keys from expiring. The tests' clock stands still (now_ms) while
    Redis expires keys in real time: a 1-second window key lives about a second of
    real time after its newest bucket, which thousands of acquires on a loaded
    machine outlast (make test-stress did)."""
    # One server-side call, not a SCAN and a PERSIST a key: a write just made gave its
    # window key a TTL of about a second, which a loaded machine's round trips outlast.
    persist_all = "for _, k in ipairs(redis.call('KEYS', ARGV[1])) do redis.call('PERSIST', k) end"
    await client.eval(persist_all, 0, KEYS.quota_prefix() + "*")


async def _commands(aredis: redis.asyncio.Redis) -> int:
    stats = await aredis.info("commandstats")
    return sum(int(v["calls"]) for k, v in stats.items() if k not in ("cmdstat_info", "cmdstat_evalsha"))


async def test_thousands_of_contending_tenants_share_by_weight(
    aredis: redis.asyncio.Redis, engine: QuotaEngine
) -> None:
    count = 3000
    weight_sum = sum(1 + i % 3 for i in range(count))  # 6000
    windows = [Window(1, 60_000), Window(86400, 10_000_000)]
    await _contend(engine, aredis, count, windows)
    # "late" is refused for global room: the 1-second window is full.
    await engine.acquire("filler", [60_000 - count], windows, ROOMY, weight=1, now_ms=T0 + 2)
    await _hold(aredis)
    late = await engine.acquire("late", [5], windows, ROOMY, weight=1, now_ms=T0 + 3)
    assert late.blocked_by == "global"
    # One fair share of the shortest window: 60,000 / (6000 + 1 filler + 1 late + 1 new) units.
    lead = 60_000 / (weight_sum + 3)
    # "new" starts level with the furthest behind (tag 1/3) and may go one share beyond it.
    ahead = await engine.acquire("new", [1] * 12, windows, ROOMY, weight=1, now_ms=T0 + 4)
    assert ahead.granted == 0  # the 1-second window is full: global
    assert ahead.blocked_by == "global"
    # Once room frees, "late" is due back; until then "new" gets exactly what one share allows.
    fresh = T0 + 3 + round(late.retry_after * 1000)
    grant = await engine.acquire("new", [1] * 20, windows, ROOMY, weight=1, now_ms=fresh)
    assert grant.blocked_by == "share"
    assert grant.granted == int(lead) + 1
    assert 0 < grant.retry_after * 1000 <= DUE_SLACK_MS


async def test_an_acquire_reads_a_bounded_number_of_keys_whatever_the_number_of_contenders(
    aredis: redis.asyncio.Redis, engine: QuotaEngine
) -> None:
    # Today: ZRANGE waiting 0 -1 and one HGET per contending tenant, on every acquire.
    windows = [Window(1, 60_000)]
    await _contend(engine, aredis, 2000, windows)
    await engine.acquire("filler", [60_000 - 2000], windows, ROOMY, weight=1, now_ms=T0 + 2)
    assert (await engine.acquire("late", [5], windows, ROOMY, weight=1, now_ms=T0 + 3)).blocked_by == "global"

    await aredis.config_resetstat()
    await engine.acquire("t7", [1] * 10, windows, ROOMY, weight=2, now_ms=T0 + 1100)

    assert await _commands(aredis) <= 40


async def test_a_crowd_gone_quiet_is_forgotten_a_few_per_acquire(
    aredis: redis.asyncio.Redis, engine: QuotaEngine
) -> None:
    # 2000 tenants asked once, then stopped: one later acquire must not forget them all at once.
    windows = [Window(1, 60_000)]
    await _contend(engine, aredis, 2000, windows)
    later = T0 + 60_000

    await aredis.config_resetstat()
    grant = await engine.acquire("t7", [1], windows, ROOMY, weight=1, now_ms=later)

    assert grant.granted == 1
    assert await _commands(aredis) <= 300
    # Over the following acquires the crowd is forgotten, a bounded number each.
    for step in range(200):
        await engine.acquire("t7", [1], windows, ROOMY, weight=1, now_ms=later + 1 + step)
    assert await aredis.zcard(KEYS.quota_share("tag")) == 1
