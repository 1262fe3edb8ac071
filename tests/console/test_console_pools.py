"""The console on two sending pools (#43), in a real browser: the tenants page names each
tenant's pool and filters by it; a tenant's page reads its numbers in its own pool, and
its buttons (pause, resume, limits) act there, never in the other pool.

Each tenant's mail is enqueued through the SDK, which writes it to the tenant's pool;
what the buttons did is checked through the admin clients of each pool's keys.
"""

from __future__ import annotations

from typing import Any

import redis
from playwright.async_api import Page, expect

from fairpost import MailClient
from fairpost.config import Settings, load_settings
from fairpost.config.limits import parse_limits
from fairpost.config.pools import pool_settings
from fairpost.mailer.quota.admin import QuotaAdmin
from fairpost.mailer.sdk.pool_admin import Pools
from tests.console.conftest import BROWSER_LOOP, TOKEN, log_in, serve

MAIL = {"sender": "no-reply@acme.example", "to": ["ada@example.com"], "subject": "Hi", "text": "Hello"}
EU = {"queue_name": "fairpost-eu.fifo", "region": "eu-west-1"}

pytestmark = BROWSER_LOOP


def two_pools(redis_url: str, **console: Any) -> Settings:
    return load_settings(redis_url=redis_url, pools={"eu": EU}, console={"token": TOKEN, **console})


def admin_of(settings: Settings, pool: str, client: redis.Redis) -> QuotaAdmin:
    """The quota admin of one pool's keys."""
    return QuotaAdmin(pool_settings(settings, pool), redis_client=client)


def tenants_on_both(settings: Settings) -> None:
    """acme and beta on the default pool, euco and eudo on eu; euco with the most mail."""
    with Pools(settings) as pools:
        pools.directory.place("euco", "eu")
        pools.directory.place("eudo", "eu")
    with MailClient(settings) as client:
        for tenant, count in (("acme", 1), ("beta", 2), ("euco", 3), ("eudo", 1)):
            for _ in range(count):
                client.send(tenant, **MAIL)  # type: ignore[arg-type]


async def test_the_tenants_page_shows_each_tenant_s_pool_and_filters_by_it(
    page: Page, redis_url: str, redis_client: redis.Redis
) -> None:
    settings = two_pools(redis_url)
    tenants_on_both(settings)
    # The mail sits in each tenant's own pool's keys.
    eu_counts = admin_of(settings, "eu", redis_client).keys.counts()
    assert redis_client.hget(eu_counts, "euco") == "3" and redis_client.hget(eu_counts, "acme") is None
    async with serve(settings) as base:
        await log_in(page, base)
        await page.goto(base + "/tenants")
        for tenant, pool in (("acme", "default"), ("beta", "default"), ("euco", "eu"), ("eudo", "eu")):
            await expect(page.locator(f"tr[data-tenant={tenant}] td.pool")).to_have_text(pool)
        await expect(page.locator("#count")).to_contain_text("4 tenants")
        # The backlogs are each pool's own, and a sort by backlog goes over both pools.
        await expect(page.locator("tr[data-tenant=euco] td.backlog")).to_have_text("3")
        await page.goto(base + "/tenants?sort=backlog")
        assert await page.locator("tbody tr th").all_inner_texts() == ["euco", "beta", "acme", "eudo"]

        await page.get_by_label("Pool").select_option("eu")
        await page.get_by_role("button", name="Search").click()
        await expect(page.locator("#count")).to_contain_text("2 of 4 tenants")
        assert await page.locator("tbody tr th").all_inner_texts() == ["euco", "eudo"]
        assert "pool=eu" in page.url
        # The pool is kept across the pages' sort links.
        await page.get_by_role("link", name="Backlog").click()
        assert await page.locator("tbody tr th").all_inner_texts() == ["euco", "eudo"]


async def test_a_tenant_s_page_reads_and_acts_in_its_own_pool(
    page: Page, redis_url: str, redis_client: redis.Redis
) -> None:
    settings = two_pools(redis_url, write=True)
    tenants_on_both(settings)
    default, eu = admin_of(settings, "default", redis_client), admin_of(settings, "eu", redis_client)
    async with serve(settings) as base:
        await log_in(page, base)
        await page.goto(base + "/tenants/euco")
        await expect(page.locator("#pool")).to_have_text("eu")
        await expect(page.locator("#backlog")).to_have_text("3")

        await page.get_by_role("button", name="Pause").click()
        await expect(page.get_by_role("status")).to_contain_text("Done: paused")
        await expect(page.locator("#waits")).to_contain_text("paused by an operator")
        assert eu.overrides().paused == {"euco"}
        assert default.overrides().paused == frozenset()

        await page.get_by_label("Limits").fill("7/minute")
        await page.get_by_role("button", name="Save").click()
        await expect(page.get_by_role("status")).to_contain_text("limits set to 7/minute")
        await expect(page.get_by_role("heading", name="Quota")).to_contain_text("from override")
        assert eu.tenant_limits("euco").windows == parse_limits("7/minute")
        assert default.tenant_limits("euco").source == "settings"

        await page.get_by_role("button", name="Resume").click()
        await expect(page.get_by_role("status")).to_contain_text("Done: resumed")
        assert eu.overrides().paused == frozenset()

        # A tenant of the default pool: its own numbers, its own keys.
        await page.goto(base + "/tenants/beta")
        await expect(page.locator("#pool")).to_have_text("default")
        await expect(page.locator("#backlog")).to_have_text("2")
        await page.get_by_role("button", name="Pause").click()
        await expect(page.get_by_role("status")).to_contain_text("Done: paused")
        assert default.overrides().paused == {"beta"}
        assert eu.overrides().paused == frozenset()

        # The overview lists the held tenants of every pool, and each pool's totals.
        eu.pause("eudo")
        await page.goto(base + "/")
        held = page.locator("ul.held")
        await expect(held).to_contain_text("beta")
        await expect(held).to_contain_text("eudo")
        await expect(page.locator("tr[data-pool=eu] td.backlog")).to_have_text("4")
        await expect(page.locator("tr[data-pool=default] td.backlog")).to_have_text("3")
