"""The sliding-window quota engine, against a real redis-server.

Time is driven with ``now_ms`` (the engine's test hook) except where the
server's own clock is the point. ``T0`` sits on a bucket boundary of every
window so that the expected retry times below can be worked out by hand.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis.asyncio import Redis

from fairpost.config.limits import Window
from fairpost.dispatcher.replies import time_ms
from fairpost.mailer.quota.engine import NEVER, Grant, QuotaEngine
from fairpost.mailer.testing.wait import wait_for_async
from tests.support import KEYS

BUCKETS = 20
T0 = 1_700_000_000_000 - 1_700_000_000_000 % 86_400_000  # a day boundary, so every bucket's too
SECOND = Window(1, 5)
DAY = Window(86400, 50_000)


AHEAD = BUCKETS // 10
"""Buckets a window key's TTL covers beyond its newest (windows.lua)."""
META = {"n", "lo", "hi"}
"""A window hash's fields beside its buckets: the running total, the lowest and newest bucket."""


@pytest.fixture
def engine(aredis: Redis) -> QuotaEngine:
    return QuotaEngine(aredis, KEYS, buckets_per_window=BUCKETS)


async def buckets(aredis: Redis, key: str) -> dict[int, int]:
    """A window hash's buckets (index -> units), its other fields left out."""
    fields = await aredis.hgetall(key)
    return {int(k): int(v) for k, v in fields.items() if _text(k) not in META}


def _text(name: str | bytes) -> str:
    return name.decode() if isinstance(name, bytes) else name


async def assert_consistent(aredis: Redis, key: str) -> dict[int, int]:
    """The hash's total is the sum of its buckets, all between "lo" and "hi"; returns the
    buckets that hold units."""
    every = await buckets(aredis, key)
    meta = {_text(k): int(v) for k, v in (await aredis.hgetall(key)).items() if _text(k) in META}
    if not every:
        assert meta == {}, "a hash with no bucket left is deleted"
        return every
    assert meta["n"] == sum(every.values()) > 0
    assert meta["lo"] <= min(every) and max(every) <= meta["hi"]
    return {k: v for k, v in every.items() if v}


# -- counting ----------------------------------------------------------------


async def test_grants_the_prefix_that_fits_and_counts_recipients(engine: QuotaEngine) -> None:
    grant = await engine.acquire("a", [2, 2, 2], [], [SECOND], now_ms=T0)

    assert grant == Grant(granted=2, retry_after=grant.retry_after, blocked_by="tenant", at_ms=T0)
    assert await engine.usage("a", [SECOND], now_ms=T0) == [(SECOND, 4)]


async def test_stops_at_the_first_refused_mail_even_if_later_ones_fit(engine: QuotaEngine) -> None:
    grant = await engine.acquire("a", [1, 5, 1], [], [SECOND], now_ms=T0)

    assert grant.granted == 1
    assert await engine.usage("a", [SECOND], now_ms=T0) == [(SECOND, 1)]


async def test_a_run_of_equal_costs_counts_each_mail(engine: QuotaEngine) -> None:
    # The script gets the run of 1s once (engine._mails): each mail of it still counts.
    grant = await engine.acquire("a", [3, 1, 1, 1, 1], [], [SECOND], now_ms=T0)

    assert grant.granted == 3
    assert await engine.usage("a", [SECOND], now_ms=T0) == [(SECOND, 5)]
    assert (await engine.acquire("b", [1, 1, 1, 1], [], [SECOND], now_ms=T0)).granted == 4
    assert await engine.usage("b", [SECOND], now_ms=T0) == [(SECOND, 4)]


async def test_every_window_must_fit(engine: QuotaEngine) -> None:
    ten = Window(10, 8)
    first = await engine.acquire("a", [1] * 6, [], [SECOND, ten], now_ms=T0)
    assert first.granted == 5  # the one-second window is full
    later = await engine.acquire("a", [1] * 6, [], [SECOND, ten], now_ms=T0 + 2000)
    assert later.granted == 3  # the ten-second window is full: 5 + 3
    assert later.blocked_by == "tenant"
    # The units of T0 leave the ten-second window (500 ms buckets) at T0 + 10.499 s.
    assert later.retry_after == pytest.approx(10.499 - 2.0)


async def test_all_granted_reports_nothing_blocked(engine: QuotaEngine) -> None:
    grant = await engine.acquire("a", [1, 2], [DAY], [SECOND], now_ms=T0)

    assert grant == Grant(granted=2, retry_after=0.0, blocked_by=None, at_ms=T0)
    empty = await engine.acquire("a", [], [DAY], [SECOND], now_ms=T0)
    assert empty == Grant(granted=0, retry_after=0.0, blocked_by=None, at_ms=T0)


async def test_global_quota_blocks_every_tenant(engine: QuotaEngine) -> None:
    shared = [Window(1, 4)]
    assert (await engine.acquire("a", [4], shared, [SECOND], now_ms=T0)).granted == 1

    other = await engine.acquire("b", [1], shared, [SECOND], now_ms=T0 + 10)

    assert (other.granted, other.blocked_by) == (0, "global")
    assert await engine.usage(None, shared, now_ms=T0 + 10) == [(shared[0], 4)]


async def test_tenant_quota_blocks_only_that_tenant(engine: QuotaEngine) -> None:
    shared = [Window(1, 100)]
    assert (await engine.acquire("a", [5], shared, [SECOND], now_ms=T0)).granted == 1

    again = await engine.acquire("a", [1], shared, [SECOND], now_ms=T0 + 10)
    other = await engine.acquire("b", [5], shared, [SECOND], now_ms=T0 + 10)

    assert (again.granted, again.blocked_by) == (0, "tenant")
    assert other.granted == 1
    assert await engine.usage("b", [SECOND], now_ms=T0 + 10) == [(SECOND, 5)]


async def test_concurrent_replicas_never_overdraw(redis_url: str) -> None:
    clients = [Redis.from_url(redis_url) for _ in range(4)]
    engines = [QuotaEngine(c, KEYS) for c in clients]
    try:
        grants = await asyncio.gather(
            *(
                engines[i % 4].acquire(f"t{i % 3}", [1, 2], [Window(60, 50)], [Window(60, 30)])
                for i in range(80)
            )
        )
        costs = sum(sum([1, 2][: g.granted]) for g in grants)
        assert costs <= 50
        assert costs >= 49  # a batch of 1 + 2 may leave one unit over
        assert (await engines[0].usage(None, [Window(60, 50)]))[0][1] == costs
    finally:
        for c in clients:
            await c.aclose()


async def test_uses_the_redis_server_clock(engine: QuotaEngine, aredis: Redis) -> None:
    seconds, micros = await aredis.time()
    grant = await engine.acquire("a", [1], [], [SECOND])

    assert 0 <= grant.at_ms - (seconds * 1000 + micros // 1000) < 1000


# -- retry_after -------------------------------------------------------------


async def test_retry_after_is_when_the_oldest_bucket_leaves_the_window(engine: QuotaEngine) -> None:
    await engine.acquire("a", [5], [], [SECOND], now_ms=T0)

    grant = await engine.acquire("a", [1], [], [SECOND], now_ms=T0 + 500)

    # Units taken in the bucket [T0, T0+50) count until the whole bucket has left
    # (t-1000, t], at T0 + 1049: 549 ms from now, 49 of them bucket slack.
    assert grant.retry_after == pytest.approx(0.549)
    assert (await engine.acquire("a", [1], [], [SECOND], now_ms=T0 + 1048)).granted == 0
    assert (await engine.acquire("a", [1], [], [SECOND], now_ms=T0 + 1049)).granted == 1


async def test_retry_after_is_exact_to_the_millisecond(engine: QuotaEngine) -> None:
    windows = [Window(1, 6), Window(10, 9)]
    now = T0 + 17
    for step, costs in enumerate([[3], [2, 1], [2], [1, 1], [2]]):
        await engine.acquire("a", costs, [], windows, now_ms=now + step * 333)
    now += 5 * 333
    grant = await engine.acquire("a", [3], [], windows, now_ms=now)
    assert grant.granted == 0

    retry_ms = round(grant.retry_after * 1000)
    assert retry_ms / 1000 == grant.retry_after
    assert (await engine.acquire("a", [3], [], windows, now_ms=now + retry_ms - 1)).granted == 0
    assert (await engine.acquire("a", [3], [], windows, now_ms=now + retry_ms)).granted == 1


async def test_retry_after_counts_the_batch_granted_before_it(engine: QuotaEngine) -> None:
    await engine.acquire("a", [2], [], [SECOND], now_ms=T0)

    grant = await engine.acquire("a", [3, 2], [], [SECOND], now_ms=T0 + 600)

    # The 2 of T0 must leave (T0 + 1049), and that is enough: 2 + 3 + 2 > 5 only with them.
    assert grant.granted == 1
    assert grant.retry_after == pytest.approx(0.449)


async def test_the_later_scope_is_named_when_both_block(engine: QuotaEngine) -> None:
    await engine.acquire("a", [3], [Window(10, 3)], [Window(1, 3)], now_ms=T0)

    grant = await engine.acquire("a", [1], [Window(10, 3)], [Window(1, 3)], now_ms=T0 + 100)

    assert grant.blocked_by == "global"
    assert grant.retry_after == pytest.approx(10.499 - 0.1)  # 10 s windows have 500 ms buckets


async def test_a_cost_over_a_budget_limit_never_fits(engine: QuotaEngine, aredis: Redis) -> None:
    # A window of a minute or more is a budget (a shorter one is a rate: test_quota_big_mail.py).
    minute = Window(60, 5)
    tenant = await engine.acquire("a", [1, 6], [DAY], [minute], now_ms=T0)
    global_ = await engine.acquire("a", [7], [Window(60, 6)], [Window(120, 100)], now_ms=T0)

    assert (tenant.granted, tenant.retry_after, tenant.blocked_by) == (1, NEVER, "tenant")
    assert (global_.granted, global_.retry_after, global_.blocked_by) == (0, -1.0, "global")
    assert await aredis.hlen(KEYS.quota("global", 60)) == 0


async def test_global_retry_after(engine: QuotaEngine) -> None:
    windows = [Window(1, 3)]
    assert await engine.global_retry_after(windows, now_ms=T0) == 0.0
    await engine.acquire("a", [3], windows, [], now_ms=T0)

    assert await engine.global_retry_after(windows, now_ms=T0 + 49) == pytest.approx(1.0)
    # Asking takes nothing.
    assert await engine.usage(None, windows, now_ms=T0 + 49) == [(windows[0], 3)]


# -- refunds -----------------------------------------------------------------


async def test_refund_gives_units_back_where_they_were_counted(engine: QuotaEngine) -> None:
    windows = ([DAY], [SECOND])
    grant = await engine.acquire("a", [2, 3], *windows, now_ms=T0 + 20)

    await engine.refund("a", 3, grant.at_ms, *windows)

    assert await engine.usage("a", [SECOND], now_ms=T0 + 40) == [(SECOND, 2)]
    assert await engine.usage(None, [DAY], now_ms=T0 + 40) == [(DAY, 2)]
    assert (await engine.acquire("a", [3], *windows, now_ms=T0 + 40)).granted == 1


async def test_refund_never_goes_below_zero_nor_revives_a_bucket(engine: QuotaEngine, aredis: Redis) -> None:
    grant = await engine.acquire("a", [2], [], [SECOND], now_ms=T0)

    await engine.refund("a", 5, grant.at_ms, [], [SECOND])
    await engine.refund("a", 1, grant.at_ms, [DAY], [SECOND])

    assert await aredis.exists(KEYS.quota("t:a", 1), KEYS.quota("global", 86400)) == 0
    assert await engine.usage("a", [SECOND], now_ms=T0) == [(SECOND, 0)]


# -- memory ------------------------------------------------------------------


async def test_memory_stays_bounded_over_a_day(engine: QuotaEngine, aredis: Redis) -> None:
    global_windows, tenant_windows = [Window(1, 100), DAY], [Window(60, 1000), DAY]
    calls, per_call = 2000, 25
    step_ms = 86_400_000 // calls
    for i in range(calls):
        now = T0 + 12_345 + i * step_ms
        grant = await engine.acquire("a", [per_call], global_windows, tenant_windows, now_ms=now)
        assert grant.granted == 1
        for key in (KEYS.quota("global", 86400), KEYS.quota("t:a", 86400), KEYS.quota("t:a", 60)):
            assert len(await buckets(aredis, key)) <= BUCKETS + 1
            assert await aredis.hlen(key) <= BUCKETS + 1 + len(META)

    assert await engine.usage(None, [DAY], now_ms=now) == [(DAY, 50_000)]
    refused = await engine.acquire("a", [1], global_windows, tenant_windows, now_ms=now)
    assert refused.blocked_by == "global"  # both day windows free at once: a tie names global


async def test_keys_expire_once_their_buckets_leave_the_window(engine: QuotaEngine, aredis: Redis) -> None:
    before = time_ms(await aredis.time())
    await engine.acquire("a", [1], [DAY], [SECOND], now_ms=T0 + 10)
    async with aredis.pipeline(transaction=False) as pipe:
        pipe.pttl(KEYS.quota("t:a", 1))
        pipe.time()
        ttl, after = await pipe.execute()

    # The newest bucket [T0, T0+50) counts until T0 + 1049 in the second window; the key
    # lives AHEAD buckets longer (a tenth of the window, so a busy key's TTL is set once
    # every AHEAD buckets). Its TTL has run down by the real time since the script set it.
    assert 1039 + AHEAD * 50 - (time_ms(after) - before) - 1 <= ttl <= 1039 + AHEAD * 50
    day_ttl = await aredis.pttl(KEYS.quota("global", 86400))
    assert 86_400_000 < day_ttl <= 86_400_000 + (1 + AHEAD) * 86_400_000 // BUCKETS


async def test_an_idle_key_is_gone_in_real_time(engine: QuotaEngine, aredis: Redis) -> None:
    await engine.acquire("a", [1], [], [SECOND])
    assert await aredis.exists(KEYS.quota("t:a", 1)) == 1

    async def gone() -> bool:
        return await aredis.exists(KEYS.quota("t:a", 1)) == 0

    # By itself, about 1.1 s later: its bucket's window, and AHEAD buckets.
    await wait_for_async(gone, within=10, what="the idle key to expire")


# -- input -------------------------------------------------------------------


async def test_bad_input_is_refused_before_redis(engine: QuotaEngine, aredis: Redis) -> None:
    with pytest.raises(ValueError, match="at least 1"):
        await engine.acquire("a", [1, 0], [], [SECOND])
    with pytest.raises(ValueError, match="same length"):
        await engine.acquire("a", [1], [Window(1, 2), Window(1, 3)], [])
    with pytest.raises(ValueError, match="at least 1"):
        QuotaEngine(aredis, KEYS, buckets_per_window=0)
    assert await aredis.dbsize() == 0


# -- the property: against a model that keeps every unit's exact time --------


@dataclass
class Scenario:
    global_windows: list[Window]
    tenant_windows: dict[str, list[Window]]
    start_ms: int
    steps: list[tuple[int, str, list[int]]]


@dataclass
class Model:
    """Every granted unit with its exact time: the truth the buckets approximate."""

    grants: list[tuple[int, str, int]] = field(default_factory=list)

    def counted(self, tenant: str | None, at: int, span_ms: int) -> int:
        return sum(units for t, who, units in self.grants if at - span_ms < t <= at and tenant in (None, who))

    def largest(self, tenant: str | None, at: int, span_ms: int) -> int:
        return max(
            (u for t, who, u in self.grants if at - span_ms < t <= at and tenant in (None, who)), default=0
        )

    def fits(self, tenant: str | None, windows: list[Window], at: int, cost: int, *, widen: bool) -> bool:
        """Whether ``cost`` more fits now; ``widen`` adds the one bucket the engine may over-count.
        A rate window (under a minute) also takes a bigger mail alone, once it is empty."""
        for w in windows:
            span_ms = w.seconds * 1000 + (w.seconds * 1000 // BUCKETS if widen else 0)
            counted = self.counted(tenant, at, span_ms)
            if counted + cost > w.limit and not (w.seconds < 60 and counted == 0):
                return False
        return True


_windows = st.lists(
    st.builds(Window, seconds=st.sampled_from([1, 2, 5, 10, 60]), limit=st.integers(1, 50)),
    min_size=1,
    max_size=3,
    unique_by=lambda w: w.seconds,
)
# Mostly small steps, so buckets fill and windows stay busy, with some long ones.
_advance = st.one_of(
    st.integers(0, 60), st.integers(0, 1500), st.sampled_from([999, 1000, 1049, 10_000, 61_000])
)


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    tenants = ["a", "b", "c"][: draw(st.integers(2, 3))]
    steps = st.tuples(_advance, st.sampled_from(tenants), st.lists(st.integers(1, 5), min_size=1, max_size=4))
    return Scenario(
        global_windows=draw(_windows),
        tenant_windows={t: draw(_windows) for t in tenants},
        start_ms=T0 + draw(st.integers(0, 86_400_000)),
        steps=draw(st.lists(steps, min_size=1, max_size=30)),
    )


async def _play(aredis: Redis, engine: QuotaEngine, scenario: Scenario) -> None:
    await aredis.flushdb()
    model = Model()
    gw, tws = scenario.global_windows, scenario.tenant_windows

    async def acquire(tenant: str, costs: list[int], now: int) -> Grant:
        tw = tws[tenant]
        grant = await engine.acquire(tenant, costs, gw, tw, now_ms=now)
        assert grant.at_ms == now
        for name, ws in (("global", gw), (f"t:{tenant}", tw)):
            for w in ws:
                await assert_consistent(aredis, KEYS.quota(name, w.seconds))
        for cost in costs[: grant.granted]:
            model.grants.append((now, tenant, cost))
        # (1) Never over max(limit, the largest single mail in the window): counts
        # only rise at grants, so checking now is enough.
        for scope, ws in ((None, gw), (tenant, tw)):
            for w in ws:
                span = w.seconds * 1000
                bound = max(w.limit, model.largest(scope, now, span))
                assert model.counted(scope, now, span) <= bound, (scope, w)
        if grant.granted == len(costs):
            assert (grant.retry_after, grant.blocked_by) == (0.0, None)
            return grant
        refused = costs[grant.granted]
        too_big = {
            scope
            for scope, ws in (("global", gw), ("tenant", tw))
            if any(refused > w.limit and w.seconds >= 60 for w in ws)
        }
        if too_big:
            assert grant.retry_after == NEVER
            assert grant.blocked_by in too_big
            return grant
        # (2) Never too stingy beyond the slack: the scope named refuses it in
        # the model too, once each window is widened by one bucket.
        assert grant.retry_after > 0
        if grant.blocked_by == "global":
            assert not model.fits(None, gw, now, refused, widen=True)
        else:
            assert grant.blocked_by == "tenant"
            assert not model.fits(tenant, tw, now, refused, widen=True)
        return grant

    now = scenario.start_ms
    for advance, tenant, costs in scenario.steps:
        now += advance
        grant = await acquire(tenant, costs, now)
        if grant.retry_after <= 0:
            continue
        # (3) retry_after is exact in whole ms: 1 ms early still refuses, on time fits.
        retry_ms = round(grant.retry_after * 1000)
        assert retry_ms / 1000 == grant.retry_after
        refused = costs[grant.granted]
        assert (await acquire(tenant, [refused], now + retry_ms - 1)).granted == 0
        now += retry_ms
        assert (await acquire(tenant, [refused], now)).granted == 1


def test_matches_a_brute_force_model(redis_url: str) -> None:
    with asyncio.Runner() as runner:
        aredis = Redis.from_url(redis_url)
        engine = QuotaEngine(aredis, KEYS, buckets_per_window=BUCKETS)

        @settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
        @given(scenario=scenarios())
        def check(scenario: Scenario) -> None:
            runner.run(_play(aredis, engine, scenario))

        try:
            check()
        finally:
            runner.run(aredis.aclose())
