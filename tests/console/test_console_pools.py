"""The console on two sending pools (#43), in a real browser: the tenants page names each
tenant's pool and filters by it; a tenant's page reads its numbers in its own pool, and
its buttons (pause, resume, limits) act there, never in the other pool.

Each tenant's mail is enqueued through the SDK, which writes it to the tenant's pool;
what the buttons did is checked through the admin clients of each pool's keys.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import redis
from playwright.async_api import Page, expect

from fairpost import MailClient
from fairpost.config import Settings, load_settings
from fairpost.config.limits import parse_limits
from fairpost.config.pools import pool_key_prefix, pool_settings
from fairpost.mailer.quota.admin import QuotaAdmin
from fairpost.mailer.sdk.keys import MailKeys
from fairpost.mailer.sdk.pool_admin import Pools
from tests.console.conftest import BROWSER_LOOP, TOKEN, log_in, serve
from tests.console.test_console_pages import command_calls

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
        # A pool the settings do not declare: refused, naming the ones they do.
        response = await page.goto(base + "/tenants?pool=asia")
        assert response is not None and response.status == 400
        assert "pool must be one of default, eu" in await response.text()


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


async def test_a_hundred_thousand_tenants_on_two_pools_come_in_pages(
    page: Page, redis_url: str, redis_client: redis.Redis
) -> None:
    """Half the tenants on eu, as the enqueue script and the directory leave them, written
    in bulk: a page still reads its own 50 tenants, and a pool's filter pages its half."""
    settings = two_pools(redis_url)
    default, eu = MailKeys(settings.key_prefix), MailKeys(pool_key_prefix(settings, "eu"))
    names = [f"t-{i:06d}" for i in range(100_000)]
    on_eu = names[1::2]
    with redis_client.pipeline(transaction=False) as pipe:
        for start in range(0, 50_000, 10_000):
            pipe.sadd(default.tenants(), *names[0::2][start : start + 10_000])
            pipe.sadd(eu.tenants(), *on_eu[start : start + 10_000])
            pipe.hset(default.pool_directory(), mapping=dict.fromkeys(on_eu[start : start + 10_000], "eu"))
        pipe.hset(eu.counts(), mapping={"t-000123": 30, "t-099999": 12})
        pipe.hset(default.counts(), mapping={"t-042000": 7})
        pipe.execute()
    async with serve(settings) as base:
        await log_in(page, base)
        await page.goto(base + "/tenants")
        await expect(page.locator("#count")).to_contain_text("100,000 tenants")
        rows = page.locator("tbody tr")
        await expect(rows).to_have_count(50)
        await expect(page.locator("tr[data-tenant=t-000001] td.pool")).to_have_text("eu")
        await expect(page.locator("tr[data-tenant=t-000002] td.pool")).to_have_text("default")

        # A page reads its own 50 tenants in their pools, not the 100,000.
        before = command_calls(redis_client)
        await page.reload()
        await expect(rows.last).to_have_attribute("data-tenant", "t-000049")
        assert command_calls(redis_client) - before < 2_000

        await page.goto(base + "/tenants?sort=backlog")
        assert (await page.locator("tbody tr th").all_inner_texts())[:3] == [
            "t-000123",
            "t-099999",
            "t-042000",
        ]

        await page.goto(base + "/tenants?pool=eu&page=1000")
        await expect(page.locator("#count")).to_contain_text("50,000 of 100,000 tenants match on pool eu")
        await expect(page.get_by_role("navigation", name="Pages")).to_contain_text("Page 1,000 of 1,000")
        await expect(rows.last).to_have_attribute("data-tenant", "t-099999")


async def test_a_tenant_s_dead_letters_are_found_and_replayed_in_its_pool(
    page: Page, redis_url: str, redis_client: redis.Redis
) -> None:
    settings = two_pools(redis_url, write=True)
    tenants_on_both(settings)
    with MailClient(settings) as client:
        # A replayable dead letter in the eu pool: a job cancelled before its send time.
        job = client.send("euco", **MAIL, send_at=datetime.now(UTC) + timedelta(hours=1))  # type: ignore[arg-type]
        client.cancel(job)
    async with serve(settings) as base:
        await log_in(page, base)
        await page.goto(base + "/tenants/euco")
        await page.get_by_role("link", name="All of its dead letters").click()
        await expect(page.locator("body")).to_contain_text(job)
        await page.goto(base + f"/jobs/{job}")
        await page.get_by_role("button", name="Replay").click()
        await expect(page.get_by_role("status")).to_contain_text(f"job {job}: replayed")
    with MailClient(settings) as client:
        assert client.status(job).state != "dead"
