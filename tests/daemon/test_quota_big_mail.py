"""A mail to more recipients than a window's limit (issue 12, item 3), on the real quota scripts.

A window shorter than a minute is a rate: the big mail waits until that window
holds nothing else, then goes alone, counted in full. A window of a minute or
longer is a budget: a mail that can never fit is refused, naming the window.
"""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

from fairpost.config.limits import Window
from fairpost.mailer.quota.engine import NEVER, QuotaEngine, never_fits_reason
from tests.support import KEYS

BUCKETS = 20
T0 = 1_700_000_000_000 - 1_700_000_000_000 % 86_400_000
SECOND = Window(1, 5)
DAY = Window(86400, 50_000)


@pytest.fixture
def engine(aredis: Redis) -> QuotaEngine:
    return QuotaEngine(aredis, KEYS, buckets_per_window=BUCKETS)


async def test_a_mail_over_a_rate_limit_is_not_dead_lettered_it_goes_alone(engine: QuotaEngine) -> None:
    # Today: cost 6 at 5/second -> [0, -1, 2], a dead letter "too_many_recipients".
    grant = await engine.acquire("a", [6], [DAY], [SECOND], now_ms=T0)

    assert (grant.granted, grant.retry_after, grant.blocked_by) == (1, 0.0, None)
    # Counted in full, in every window.
    assert await engine.usage("a", [SECOND], now_ms=T0) == [(SECOND, 6)]
    assert await engine.usage(None, [DAY], now_ms=T0) == [(DAY, 6)]


async def test_a_mail_over_a_rate_limit_waits_until_the_window_holds_nothing_else(
    engine: QuotaEngine,
) -> None:
    await engine.acquire("a", [2], [], [SECOND], now_ms=T0)

    grant = await engine.acquire("a", [6], [], [SECOND], now_ms=T0 + 100)

    # The 2 of T0 (bucket [T0, T0+50)) leave the window at T0 + 1049.
    assert (grant.granted, grant.blocked_by) == (0, "tenant")
    assert grant.retry_after == pytest.approx(0.949)
    assert (await engine.acquire("a", [6], [], [SECOND], now_ms=T0 + 1048)).granted == 0
    assert (await engine.acquire("a", [6], [], [SECOND], now_ms=T0 + 1049)).granted == 1


async def test_a_big_mail_goes_alone_nothing_joins_it_in_its_window(engine: QuotaEngine) -> None:
    # In one batch: the big mail first takes the empty window, the next waits for it to leave.
    grant = await engine.acquire("a", [7, 1], [], [SECOND], now_ms=T0)
    assert grant.granted == 1
    assert grant.retry_after == pytest.approx(1.049)
    # And a big mail behind a small one waits for the small one to leave.
    later = await engine.acquire("a", [1, 7], [], [SECOND], now_ms=T0 + 1049)
    assert later.granted == 1
    assert later.retry_after == pytest.approx(1.0)  # the 1 of T0 + 1049 sits in [T0 + 1000, T0 + 1050)
    assert await engine.usage("a", [SECOND], now_ms=T0 + 1049) == [(SECOND, 1)]


async def test_a_mail_over_a_global_rate_limit_goes_alone_too(engine: QuotaEngine) -> None:
    shared = [Window(1, 14), DAY]
    assert (await engine.acquire("a", [20], shared, [Window(1, 50)], now_ms=T0)).granted == 1
    other = await engine.acquire("b", [1], shared, [Window(1, 50)], now_ms=T0 + 10)
    assert (other.granted, other.blocked_by) == (0, "global")
    assert other.retry_after == pytest.approx(1.039)


async def test_a_mail_over_a_budget_window_never_fits_and_names_the_window(engine: QuotaEngine) -> None:
    hour = Window(3600, 100)
    grant = await engine.acquire("a", [1, 101], [DAY], [SECOND, hour], now_ms=T0)

    assert (grant.granted, grant.retry_after, grant.blocked_by) == (1, NEVER, "tenant")
    assert grant.too_big_for == hour
    reason = never_fits_reason(grant, 101)
    assert "100/hour" in reason and "tenant" in reason and "101" in reason


async def test_a_global_budget_window_is_named_when_it_refuses_forever(engine: QuotaEngine) -> None:
    minute = Window(60, 30)
    grant = await engine.acquire("a", [31], [Window(1, 14), minute], [SECOND], now_ms=T0)

    assert (grant.granted, grant.retry_after, grant.blocked_by, grant.too_big_for) == (
        0,
        NEVER,
        "global",
        minute,
    )
    assert "30/minute" in never_fits_reason(grant, 31)


async def test_a_mail_over_the_global_rate_is_not_starved_by_busy_tenants(engine: QuotaEngine) -> None:
    # Three tenants keep the global 14/second window busy; "big" has a 20-recipient mail.
    # Refused for global room, "big" holds the others back by fair share until the
    # window is empty and its mail goes alone.
    shared = [Window(1, 14), DAY]
    own = [Window(1, 100)]
    now = T0
    next_try = dict.fromkeys(["a", "b", "c", "big"], T0)
    sent_big_at = None
    while now < T0 + 30_000 and sent_big_at is None:
        for tenant in ["a", "b", "c", "big"]:
            if next_try[tenant] > now:
                continue
            costs = [20] if tenant == "big" else [1] * 5
            grant = await engine.acquire(tenant, costs, shared, own, weight=1, now_ms=now)
            if tenant == "big" and grant.granted:
                sent_big_at = now
            # As the sender: refused mail comes back after retry_after (SQS whole seconds).
            wait = 20 if grant.granted == len(costs) else max(1000, round(grant.retry_after * 1000))
            next_try[tenant] = now + wait
        now += 10
    assert sent_big_at is not None, "the 20-recipient mail never went"
    assert sent_big_at - T0 <= 10_000
