"""The configuration is the source of truth for per-tenant weights and caps."""

from __future__ import annotations

import redis
import redis.asyncio

from fairpost.config import load_settings
from fairpost.dispatcher.store import JobStore, store_limits
from fairpost.mailer.daemon.parts import publish_tenant_settings
from fairpost.mailer.quota.admin import QuotaAdmin
from fairpost.mailer.sdk.keys import MailKeys


async def test_a_weight_and_cap_removed_from_the_config_stayed_in_redis(
    redis_url: str, redis_client: redis.Redis, aredis: redis.asyncio.Redis
) -> None:
    before = load_settings(
        redis_url=redis_url,
        tenants={
            "acme": {"weight": 3, "inflight_cap": 7},
            "beta": {"weight": 2},
            "gamma": {"inflight_cap": 4},
        },
    )
    after = load_settings(redis_url=redis_url, tenants={"beta": {"weight": 5}})
    keys = MailKeys(before.key_prefix)
    await publish_tenant_settings(JobStore(aredis, keys, store_limits(before)), before)
    with QuotaAdmin(before) as admin:
        admin.set_tenant_limits("acme", "7/minute")  # a live override: not a setting
        admin.pause("gamma")
    # The next start-up, with acme and gamma gone from FAIRPOST_TENANTS and beta changed.
    await publish_tenant_settings(JobStore(aredis, keys, store_limits(after)), after)
    assert redis_client.hgetall(keys.weights()) == {"beta": "5"}
    # beta's cap is the default scaled by its weight (ceil(5 / 1) * 20).
    assert redis_client.hgetall(keys.caps()) == {"beta": "100"}
    with QuotaAdmin(after) as admin:
        assert admin.tenant_limits("acme").source == "override"
        assert admin.tenant_limits("gamma").paused
