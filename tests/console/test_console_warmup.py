"""Warm-up in the console (#31): each warming tenant's step, its limits now, the next
step and when it is due, or why it is held, on its page; a mark on the tenants list.

The places are real: set through the admin API (what ``fairpost tenant warmup`` uses),
and one held by the sender's own judge (the override cache a replica runs) on a
tenant whose bounces are over the warm-up's threshold.
"""

from __future__ import annotations

import re

import redis.asyncio
from playwright.async_api import Page, expect

from fairpost import MailClient
from fairpost.config import Settings
from fairpost.mailer.quota.reputation import ReputationBook
from fairpost.mailer.quota.warmup_admin import WarmupAdmin
from fairpost.mailer.testing.wait import wait_for_async
from tests.console.conftest import BROWSER_LOOP, console_settings, log_in, serve
from tests.warmup.support import KEYS, running_cache, stored

MAIL = {"sender": "no-reply@acme.example", "to": ["ada@example.com"], "subject": "Hi", "text": "Hello"}
SLOW_PLAN = "2/second; 100/day from 0s | 10/second from 1 hour | none from 1 day"
HELD_PLAN = "1/second from 0s | 3/second from 1s | none from 1 day"
WHEN = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC")

pytestmark = BROWSER_LOOP


async def hold(aredis: redis.asyncio.Redis, settings: Settings, tenant: str) -> None:
    """The tenant on HELD_PLAN, held on its first step by the sender's judge: its
    bounces (5 of 10 sends, counted as 200: 2.5 %) are over the warm-up's 2 %."""
    await ReputationBook(aredis, KEYS, settings).read(tenant, sends=10, bounces=5)
    with WarmupAdmin(settings) as admin:
        admin.set_plan(tenant, HELD_PLAN)
    async with running_cache(aredis, settings):

        async def held() -> bool:
            place = await stored(aredis, tenant)
            return place is not None and place.held == "bounce_rate"

        await wait_for_async(held, within=10, what=f"{tenant}'s warm-up held")


async def test_a_warming_tenant_shows_its_step_and_what_comes_next(
    page: Page, redis_url: str, aredis: redis.asyncio.Redis
) -> None:
    settings = console_settings(redis_url, write=True)
    with MailClient(settings) as client:
        client.send("newco", **MAIL)  # type: ignore[arg-type]
        client.send("oldco", **MAIL)  # type: ignore[arg-type]
    with WarmupAdmin(settings) as admin:
        place = admin.set_plan("newco", SLOW_PLAN)
    await hold(aredis, settings, "bouncy")  # never enqueued: listed for its warm-up

    async with serve(settings) as base:
        await log_in(page, base)
        await page.goto(base + "/tenants/newco")
        section = page.get_by_role("region", name="Warm-up")
        await expect(section.locator("#warmup-now")).to_have_text(
            re.compile(r"^warm-up step 1 of 3 \(2/second; 100/day\); next: 10/second in (1h 0m|59m \d+s)$")
        )
        await expect(section.locator("#warmup-plan")).to_have_text(f"{SLOW_PLAN} (set by an operator)")
        due = section.locator("#warmup-next")
        await expect(due).to_contain_text("step 2 (10/second) due ")
        assert WHEN.search(await due.inner_text())
        # The quota the sender applies is the step's, and says so.
        await expect(page.get_by_role("heading", name="Quota")).to_contain_text("from settings + warm-up")
        limits = await page.locator("#quota-table tbody td:nth-child(3)").all_inner_texts()
        assert limits == ["2", "100"]
        # The limits form edits the tenant's own limits, not the step's: saving it
        # unchanged must not make the warm-up's limits its own for good.
        await expect(page.get_by_label("Limits")).to_have_value("5/second; 10000/day")

        await page.goto(base + "/tenants/bouncy")
        section = page.get_by_role("region", name="Warm-up")
        await expect(section.locator("#warmup-now")).to_contain_text(
            "warm-up step 1 of 3 (1/second); held before step 2 (3/second): bounce rate 2.50% over 24h"
        )
        await expect(section.locator("#warmup-next")).to_contain_text("held since ")

        # The list marks each warming tenant, and which is held; the others carry no mark.
        await page.goto(base + "/tenants")
        await expect(page.locator("tr[data-tenant=newco] .warmup")).to_have_text("warm-up 1/3")
        await expect(page.locator("tr[data-tenant=bouncy] .warmup")).to_have_text("warm-up 1/3, held")
        await expect(page.locator("tr[data-tenant=oldco] .warmup")).to_have_count(0)
        await expect(page.locator("tr[data-tenant=newco] .warmup")).to_have_attribute(
            "title", re.compile(r"^warm-up step 1 of 3 .*next: 10/second in ")
        )

        # Its warm-up skipped, the tenant's page says nothing of one.
        with WarmupAdmin(settings) as admin:
            assert admin.skip("newco")
        await page.goto(base + "/tenants/newco")
        await expect(page.get_by_role("heading", name="Tenant newco")).to_be_visible()
        await expect(page.get_by_role("region", name="Warm-up")).to_have_count(0)
        await expect(page.get_by_role("heading", name="Quota")).to_contain_text("from settings)")
    assert place.step == 0
