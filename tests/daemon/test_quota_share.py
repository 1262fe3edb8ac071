"""Tenants waiting for a binding global quota share it by weight.

The quota engine runs against the real redis-server with time under the
test's control; tenants behave as the sender does: a batch of up to ten mails
when their messages are visible and, when refused, back at ``retry_after``
plus jitter (a short wait timed to the millisecond, a long one in SQS's whole
seconds).
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Sequence

import pytest

from fairpost.config import parse_limits
from fairpost.config.limits import Window
from fairpost.mailer.daemon.parking import PRECISE_JITTER, PRECISE_WAIT_MAX
from fairpost.mailer.quota.engine import QuotaEngine

GLOBAL = parse_limits("12/second")
TENANT = parse_limits("1000/second")


async def simulate(
    engine: QuotaEngine,
    weights: dict[str, int],
    seconds: float,
    seed: int = 7,
    *,
    tenant_limits: Sequence[Window] = TENANT,
    tick_ms: int = 10,
) -> Counter[str]:
    rng = random.Random(seed)
    start = 1_000_000_000
    next_try = {tenant: start + rng.randrange(0, 50) for tenant in weights}
    granted: Counter[str] = Counter()
    now = start
    while now < start + seconds * 1000:
        for tenant, weight in weights.items():
            if next_try[tenant] > now:
                continue
            grant = await engine.acquire(tenant, [1] * 10, GLOBAL, tenant_limits, weight=weight, now_ms=now)
            granted[tenant] += grant.granted
            if grant.granted == 10:
                next_try[tenant] = now + 20
            else:
                next_try[tenant] = now + comes_back_in(grant.retry_after, rng)
        now += tick_ms
    return granted


def comes_back_in(retry_after: float, rng: random.Random) -> int:
    """Milliseconds until a refused tenant asks again, as the sender does it: a short
    wait it times itself, plus its jitter (fairpost.mailer.daemon.parking); a longer one
    waits in SQS, whose visibility is whole seconds, plus up to a second of jitter."""
    if retry_after <= PRECISE_WAIT_MAX:
        return round(retry_after * 1000) + rng.randrange(0, round(PRECISE_JITTER * 1000) + 1)
    return math.ceil(retry_after) * 1000 + rng.randrange(0, 1000)


@pytest.mark.parametrize("seed", [7, 11, 13])
async def test_waiting_tenants_share_the_global_quota_by_weight(engine: QuotaEngine, seed: int) -> None:
    weights = {"a": 1, "b": 2, "c": 3}
    granted = await simulate(engine, weights, seconds=60, seed=seed)
    total = sum(granted.values())
    # A tenant ahead of its share waits only until the one refused is due back.
    assert total >= 0.95 * 12 * 60, granted
    for tenant, weight in weights.items():
        share = granted[tenant] / total
        assert share == pytest.approx(weight / 6, rel=0.10), (tenant, granted)


async def test_equal_weights_get_equal_shares(engine: QuotaEngine) -> None:
    granted = await simulate(engine, {"a": 1, "b": 1, "c": 1, "d": 1}, seconds=60)
    total = sum(granted.values())
    for tenant in "abcd":
        assert granted[tenant] / total == pytest.approx(0.25, rel=0.15), granted


async def test_a_lone_tenant_is_never_held_back_for_fairness(engine: QuotaEngine) -> None:
    granted = await simulate(engine, {"solo": 1}, seconds=20)
    assert granted["solo"] >= 0.9 * 12 * 20


async def test_a_tenant_limited_by_its_own_quota_does_not_hold_others_back(engine: QuotaEngine) -> None:
    start = 1_000_000_000
    slow_limits = parse_limits("1/second")
    # "slow" asks every 100 ms but its own quota allows one a second.
    now = start
    granted: Counter[str] = Counter()
    while now < start + 10_000:
        if now % 100 == 0:
            grant = await engine.acquire("slow", [1], GLOBAL, slow_limits, weight=1, now_ms=now)
            granted["slow"] += grant.granted
        grant = await engine.acquire("busy", [1], GLOBAL, TENANT, weight=1, now_ms=now)
        granted["busy"] += grant.granted
        now += 10
    assert granted["slow"] <= 10
    # busy takes the rest of the global quota: 12/s minus slow's 1/s.
    assert granted["busy"] >= 0.9 * 11 * 10, granted


async def test_nobody_waits_for_fairness_while_the_global_quota_has_room(engine: QuotaEngine) -> None:
    # "fast" sends 5 a second, "slow" 2.5: twice the share, but together well
    # under the global 12/s, so neither is ever held back.
    start = 1_000_000_000
    refused = 0
    for step in range(100):
        now = start + step * 200
        for tenant, cost in (("fast", 1), ("slow", 1)):
            if tenant == "slow" and step % 2:
                continue
            grant = await engine.acquire(tenant, [cost], GLOBAL, TENANT, weight=1, now_ms=now)
            refused += 1 - grant.granted
    assert refused == 0


@pytest.mark.parametrize("seed", [7, 11])
async def test_tenants_capped_by_their_own_quota_still_share_by_weight(
    engine: QuotaEngine, seed: int
) -> None:
    # Each may send half the global quota: any two fill it, and each is now and
    # then refused by its own quota. That refusal must not wipe out how far
    # ahead it is, or the third, waiting for room, never catches up.
    half = parse_limits("6/second")
    granted = await simulate(
        engine, {"a": 1, "b": 1, "c": 1}, seconds=30, seed=seed, tenant_limits=half, tick_ms=1
    )
    total = sum(granted.values())
    assert total >= 0.97 * 12 * 30, granted
    for tenant in "abc":
        assert granted[tenant] / total == pytest.approx(1 / 3, rel=0.10), granted
