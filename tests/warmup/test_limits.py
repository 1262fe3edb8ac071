"""A warming tenant's limits, through the real quota engine against a real Redis:
each step's rate and never more, held while its mail bounces, kept across restarts."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
import redis.asyncio
from prometheus_client import CollectorRegistry

from fairpost.config import Settings, load_settings
from fairpost.config.limits import parse_limits
from fairpost.config.warmup import parse_plan
from fairpost.mailer.daemon.metrics import Metrics
from fairpost.mailer.ops.stats import collect_stats
from fairpost.mailer.ops.stats_render import render_text
from fairpost.mailer.quota.engine import QuotaEngine
from fairpost.mailer.quota.overrides import Overrides, changed_scopes
from fairpost.mailer.quota.reputation import ReputationBook
from fairpost.mailer.quota.warmup_admin import WarmupAdmin
from fairpost.mailer.testing.wait import wait_for_async
from tests.warmup.support import KEYS, redis_now_ms, running_cache, stored

OWN = "10/second"


@pytest.fixture
def settings(redis_url: str) -> Settings:
    return load_settings(redis_url=redis_url, global_limits="1000/second", tenant_limits=OWN)


@pytest.fixture
def admin(settings: Settings) -> Iterator[WarmupAdmin]:
    with WarmupAdmin(settings) as warmup_admin:
        yield warmup_admin


def gauge(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


async def test_each_step_limits_the_rate_and_never_more(
    settings: Settings, admin: WarmupAdmin, aredis: redis.asyncio.Redis
) -> None:
    plan = parse_plan("2/second from 0s | 5/second from 2s | none from 4s")
    started = admin.set_plan("newco", plan).started_ms
    engine = QuotaEngine(aredis, KEYS)
    grants: list[int] = []  # the Redis time of every granted mail
    async with running_cache(aredis, settings) as cache:
        while await redis_now_ms(aredis) < started + 5_500:
            grant = await engine.acquire("newco", [1], cache.global_limits(), cache.limits_for("newco"))
            if grant.granted:
                grants.append(grant.at_ms)
            else:
                # Asked again soon after the quota frees, or a step starts.
                await asyncio.sleep(min(grant.retry_after, 0.05))
        assert await stored(aredis, "newco") is None  # "none from 4s" ended it
        assert cache.limits_for("newco") == parse_limits(OWN)

    def limit_at(ms: int) -> int:
        steps = [s for s in plan.steps if started + s.offset * 1000 <= ms]
        return steps[-1].limits[0].limit if steps[-1].limits else 10

    def in_window(end: int) -> int:
        return sum(1 for t in grants if end - 1000 < t <= end)

    # Never above: every window of a second ending at a grant holds no more than the
    # limit in force then (the limits only grow in this plan).
    over = [(t - started, in_window(t), limit_at(t)) for t in grants if in_window(t) > limit_at(t)]
    assert not over, over

    # And each step's rate is reached: its limit fills some second that lies within it.
    def busiest(start: int, end: int) -> int:
        ends = [t for t in grants if started + start + 1000 <= t < started + end]
        return max(sum(1 for g in grants if t - 1000 < g <= t and g >= started + start) for t in ends)

    assert busiest(0, 2000) == 2
    assert busiest(2000, 4000) == 5
    assert busiest(4000, 5500) == 10


async def test_a_bouncing_tenant_holds_its_step_while_a_clean_one_advances(
    settings: Settings, admin: WarmupAdmin, aredis: redis.asyncio.Redis
) -> None:
    book = ReputationBook(aredis, KEYS, settings)
    await book.read("bouncy", sends=10, bounces=5)  # 5 of 200 counted: 2.5 % >= 2 %
    plan = "1/second from 0s | 3/second from 1s | 5/second from 2s"
    admin.set_plan("clean", plan)
    admin.set_plan("bouncy", plan)
    engine = QuotaEngine(aredis, KEYS)
    async with running_cache(aredis, settings) as cache:

        async def clean_on_step_3() -> bool:
            place = await stored(aredis, "clean")
            return place is not None and place.step == 2

        await wait_for_async(clean_on_step_3, within=10, what="the clean tenant on its third step")
        bouncy = await stored(aredis, "bouncy")
        assert bouncy is not None and (bouncy.step, bouncy.held) == (0, "bounce_rate")
        assert bouncy.why == "bounce rate 2.50% over 24h (5 of 10 sends, counted as 200) >= 2.00%"
        assert cache.limits_for("bouncy") == parse_limits("1/second")
        assert cache.limits_for("clean") == parse_limits("5/second")

        # A refusal says which: the step (held, for the bouncing tenant), not the own limits.
        grant = await engine.acquire("bouncy", [1, 1, 1], cache.global_limits(), cache.limits_for("bouncy"))
        assert (grant.granted, grant.blocked_by) == (1, "tenant")
        assert cache.refusal_reason("bouncy", grant.binding) == "warmup_held"
        grant = await engine.acquire("clean", [1] * 6, cache.global_limits(), cache.limits_for("clean"))
        assert grant.granted == 5 and cache.refusal_reason("clean", grant.binding) == "warmup"

        # Seen: in stats (text and JSON) and the metrics.
        stats = await collect_stats(aredis, KEYS, settings)
        shown = stats.tenant("bouncy")
        assert shown is not None and shown.warmup is not None
        assert shown.limits_source == "settings + warm-up"
        assert [(w.seconds, w.limit) for w in shown.windows] == [(1, 1)]
        text = render_text(stats)
        assert (
            "bouncy: warm-up step 1 of 3 (1/second); held before step 2 (3/second): "
            "bounce rate 2.50% over 24h" in text
        ), text
        assert "clean: warm-up step 3 of 3 (5/second), the last" in text
        as_json = stats.to_json()["tenants"]["bouncy"]["warmup"]
        assert (as_json["step"], as_json["held"], as_json["next"]["limits"]) == (1, "bounce_rate", "3/second")
        metrics = Metrics()
        metrics.update(stats)
        assert (
            gauge(
                metrics.registry,
                "fairpost_tenant_warmup_held",
                tenant="bouncy",
                pool="default",
                reason="bounce_rate",
            )
            == 1
        )
        assert gauge(metrics.registry, "fairpost_tenant_warmup_step", tenant="bouncy", pool="default") == 1
        assert gauge(metrics.registry, "fairpost_tenant_warmup_step", tenant="clean", pool="default") == 3

        # Its rates back under (sends dilute the bounces): it moves on, and the next
        # step keeps its length from then.
        await book.read("bouncy", sends=1000)

        async def bouncy_moved() -> bool:
            place = await stored(aredis, "bouncy")
            return place is not None and place.step == 1 and place.held is None

        await wait_for_async(bouncy_moved, within=10, what="the bouncing tenant's next step once clean")
        moved = await stored(aredis, "bouncy")
        assert moved is not None and moved.due_ms() == moved.entered_ms + 1000


async def test_a_restart_keeps_each_tenants_place(
    redis_url: str, admin: WarmupAdmin, aredis: redis.asyncio.Redis
) -> None:
    settings = load_settings(
        redis_url=redis_url,
        tenant_limits=OWN,
        warmup={"plan": "2/second from 0s | 4/second from 1s | 6/second from 1 hour"},
    )
    admin.set_plan("acme", "1/second from 0s | 2/second from 1s | 3/second from 1 hour")
    async with running_cache(aredis, settings) as first:
        assert first.limits_for("newco") == parse_limits("2/second")  # met: the default plan's first step

        async def both_on_step_2() -> bool:
            places = [await stored(aredis, t) for t in ("acme", "newco")]
            return all(p is not None and p.step == 1 for p in places)

        await wait_for_async(both_on_step_2, within=10, what="both tenants on their second step")
    before = {t: await stored(aredis, t) for t in ("acme", "newco")}
    # A new replica (or the same daemon restarted) reads each place back, and starts nothing over.
    async with running_cache(aredis, settings) as second:
        assert second.warmups.place("acme") == before["acme"]
        assert second.warmups.place("newco") == before["newco"]
        assert second.limits_for("acme") == parse_limits("2/second")
        assert second.limits_for("newco") == parse_limits("4/second")
        await second.refresh()
        assert {t: await stored(aredis, t) for t in ("acme", "newco")} == before


async def test_a_default_plan_starts_for_new_tenants_only(
    redis_url: str, admin: WarmupAdmin, aredis: redis.asyncio.Redis
) -> None:
    await aredis.sadd(KEYS.tenants(), "oldco")  # enqueued before any default plan
    settings = load_settings(
        redis_url=redis_url, tenant_limits=OWN, warmup={"plan": "2/second from 0s | none from 1 day"}
    )
    async with running_cache(aredis, settings) as cache:
        assert cache.limits_for("oldco") == parse_limits(OWN)
        # Met for the first time: its first step at once; the refresh it wakes starts the plan.
        assert cache.limits_for("newco") == parse_limits("2/second")
        await wait_for_async(lambda: stored(aredis, "newco"), within=5, what="newco's warm-up started")
        place = await stored(aredis, "newco")
        assert place is not None and (place.source, place.step) == ("default", 0)
        assert cache.limits_for("newco") == parse_limits("2/second")
        assert await stored(aredis, "oldco") is None
        # Skipped: its own limits, and a default plan never starts for it again.
        assert admin.skip("newco")

        async def own_limits() -> bool:
            return cache.limits_for("newco") == parse_limits(OWN)

        await wait_for_async(own_limits, within=5, what="newco's own limits once skipped")
    changed: set[str] = set()

    async def on_change(old: Overrides, new: Overrides) -> None:
        changed.update(changed_scopes(old, new)[1])

    async with running_cache(aredis, settings, on_change) as again:
        assert again.limits_for("newco") == parse_limits(OWN)
        # Known since this replica started (another one met it): the first step until a
        # refresh says otherwise, then its own limits, and its parked mail is looked at again.
        await aredis.sadd(KEYS.warmup_known(), "lateco")
        assert again.limits_for("lateco") == parse_limits("2/second")
        await wait_for_async(lambda: "lateco" in changed, within=5, what="lateco known to be old")
        assert again.limits_for("lateco") == parse_limits(OWN)
        assert await stored(aredis, "newco") is None and await stored(aredis, "lateco") is None


async def test_without_a_default_plan_nothing_is_seeded_or_started(
    settings: Settings, aredis: redis.asyncio.Redis
) -> None:
    async with running_cache(aredis, settings) as cache:
        assert cache.limits_for("newco") == parse_limits(OWN)
        await cache.refresh()
    assert not await aredis.exists(KEYS.warmup(), KEYS.warmup_known())
