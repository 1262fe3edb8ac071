"""The pages themselves: 100,000 tenants in server-side pages, the overview
live and with SES's account, a path prefix behind a proxy, a phone's width,
and the screenshot docs/operations.md shows."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import redis
import redis.asyncio
from playwright.async_api import Page, expect

from fairpost import MailClient
from fairpost.config.limits import parse_limits
from fairpost.mailer.quota.admin import QuotaAdmin
from fairpost.mailer.quota.engine import QuotaEngine
from fairpost.mailer.sdk.keys import MailKeys
from fairpost.mailer.testing.ses_server import SesServer
from tests.console.conftest import BROWSER_LOOP, console_settings, log_in, serve

ROOT = Path(__file__).resolve().parents[2]
DOCS_SCREENSHOT = ROOT / "docs" / "console.png"
MAIL = {"sender": "no-reply@acme.example", "to": ["ada@example.com"], "subject": "Hi", "text": "Hello"}
TENANTS = 100_000

pytestmark = BROWSER_LOOP


def command_calls(client: redis.Redis) -> int:
    """Commands Redis has run so far, all kinds together (INFO commandstats)."""
    stats = client.info("commandstats")
    return sum(int(entry["calls"]) for entry in stats.values())


def many_tenants(client: redis.Redis, count: int) -> None:
    """``count`` tenants as the enqueue script leaves them in the set of known tenants,
    three of them with a backlog: written in bulk, not enqueued one by one."""
    keys = MailKeys()
    names = [f"t-{i:06d}" for i in range(count)]
    with client.pipeline(transaction=False) as pipe:
        for start in range(0, count, 10_000):
            pipe.sadd(keys.tenants(), *names[start : start + 10_000])
        pipe.hset(keys.counts(), mapping={"t-042000": 7, "t-000123": 30, "t-099999": 12})
        pipe.execute()


async def test_a_hundred_thousand_tenants_come_in_pages(
    page: Page, redis_url: str, redis_client: redis.Redis
) -> None:
    many_tenants(redis_client, TENANTS)
    async with serve(console_settings(redis_url)) as base:
        await log_in(page, base)
        await page.goto(base + "/tenants")
        await expect(page.locator("#count")).to_contain_text("100,000 tenants")
        rows = page.locator("tbody tr")
        await expect(rows).to_have_count(50)
        await expect(rows.first).to_have_attribute("data-tenant", "t-000000")
        await expect(page.get_by_role("navigation", name="Pages")).to_contain_text("Page 1 of 2,000")

        await page.get_by_role("link", name="Next").click()
        await expect(rows.first).to_have_attribute("data-tenant", "t-000050")
        await expect(rows).to_have_count(50)

        # A page reads its own 50 tenants, not the 100,000: counted in Redis commands.
        before = command_calls(redis_client)
        await page.reload()
        await expect(rows.last).to_have_attribute("data-tenant", "t-000099")
        assert command_calls(redis_client) - before < 2_000

        await page.get_by_label("Tenant id").fill("t-09999")
        await page.get_by_role("button", name="Search").click()
        await expect(page.locator("#count")).to_contain_text("10 of 100,000 tenants match")
        await expect(rows).to_have_count(10)

        await page.goto(base + "/tenants?sort=backlog")
        backlogs = await page.locator("tbody tr th").all_inner_texts()
        assert backlogs[:3] == ["t-000123", "t-099999", "t-042000"]
        await expect(page.locator("tr[data-tenant='t-000123'] td").first).to_have_text("30")

        await page.goto(base + "/tenants?sort=backlog&page=2000")
        await expect(rows).to_have_count(50)
        await expect(page.get_by_role("link", name="Next")).to_have_count(0)


async def test_the_overview_is_live_and_shows_the_ses_account(
    page: Page, redis_url: str, aredis: redis.asyncio.Redis, ses: SesServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    ses.set_quota(max_send_rate=23, max_24_hour_send=80_000)
    monkeypatch.setenv("AWS_ENDPOINT_URL_SESV2", ses.url)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    settings = console_settings(redis_url)
    async with serve(settings, live_seconds=0.3) as base:
        await log_in(page, base)
        await expect(page.locator("#ses-rate")).to_have_text("23.0/s")
        await expect(page.locator("#gate")).to_contain_text("open")
        await expect(page.locator("#total-queued")).to_have_text("0")
        # How full Redis is (this one has no maxmemory), and its policy.
        await expect(page.locator("#redis-memory")).to_contain_text("no maxmemory (policy noeviction)")
        # Mail arrives: the page shows it without being reloaded.
        await page.evaluate("window.marker = 'same page'")
        with MailClient(settings) as client:
            client.send_many("acme", [MAIL, MAIL, MAIL])
        await expect(page.locator("#total-queued")).to_have_text("3", timeout=10_000)
        assert await page.evaluate("window.marker") == "same page"  # never reloaded

        # The global quota spent for the day: the gate closes, and the page says so by itself.
        with QuotaAdmin(settings) as admin:
            admin.set_global_limits("1/day")
        await QuotaEngine(aredis, MailKeys()).acquire(
            "acme", [1], parse_limits("1/day"), parse_limits("5/second")
        )
        await expect(page.locator("#gate")).to_contain_text("closed: the global quota is full")
    assert ses.account_requests == 1  # asked once, however often the page was refreshed


async def test_behind_a_proxy_under_a_prefix(page: Page, redis_url: str) -> None:
    with MailClient(console_settings(redis_url)) as client:
        client.send("acme", **MAIL)  # type: ignore[arg-type]
    async with serve(console_settings(redis_url, prefix="/ops/fairpost/", write=True)) as base:
        assert base.endswith("/ops/fairpost")
        await page.goto(base + "/tenants")
        assert "/ops/fairpost/login?next=/ops/fairpost/tenants" in page.url
        await page.get_by_label("Token").fill(console_settings(redis_url).console.token.get_secret_value())  # type: ignore[union-attr]
        await page.get_by_role("button", name="Log in").click()
        await page.wait_for_url(base + "/tenants")
        # The stylesheet came through the prefix: the header is styled.
        colour = await page.locator("header.top").evaluate("e => getComputedStyle(e).backgroundColor")
        assert colour == "rgb(20, 33, 61)"
        [cookie] = await page.context.cookies()
        assert cookie["path"] == "/ops/fairpost"
        await page.get_by_role("link", name="acme").click()
        await page.get_by_role("button", name="Pause").click()
        await expect(page.get_by_role("status")).to_contain_text("paused")
        assert page.url.startswith(base + "/tenants/acme?done=")


@pytest.mark.parametrize("path", ["/", "/tenants", "/tenants/acme", "/dead"])
async def test_a_phone_width_needs_no_sideways_scrolling(page: Page, redis_url: str, path: str) -> None:
    with MailClient(console_settings(redis_url)) as client:
        client.send("acme", **MAIL)  # type: ignore[arg-type]
        client.suppressions().add("acme", "someone.with.a.long.address@example.com")
    async with serve(console_settings(redis_url, write=True)) as base:
        await page.set_viewport_size({"width": 375, "height": 740})
        await log_in(page, base)
        await page.goto(base + path)
        await expect(page.get_by_role("heading", level=1)).to_be_visible()
        overflow = await page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
        assert overflow <= 0, f"{path} is {overflow}px wider than a 375px phone"
        await expect(page.get_by_role("button", name="Find job")).to_be_in_viewport()


async def test_the_screenshot_in_the_docs(
    page: Page, redis_url: str, aredis: redis.asyncio.Redis, tmp_path: Path
) -> None:
    """docs/operations.md shows the tenants page; ``UPDATE_DOCS_SCREENSHOT=1`` writes it anew."""
    settings = console_settings(redis_url, write=True)
    with MailClient(settings) as client:
        for tenant, count in (("acme", 12), ("globex", 3), ("initech", 40), ("umbrella", 1)):
            client.send_many(tenant, [MAIL] * count)
    with QuotaAdmin(settings) as admin:
        admin.pause("umbrella")
        admin.set_tenant_limits("initech", "1/minute; 5000/day")
    await QuotaEngine(aredis, MailKeys()).acquire(
        "initech", [1], parse_limits("14/second"), parse_limits("1/minute")
    )
    async with serve(settings) as base:
        await log_in(page, base)
        await page.goto(base + "/tenants?sort=backlog")
        await expect(page.locator("tbody tr")).to_have_count(4)
        shot = tmp_path / "console.png"
        await page.screenshot(
            path=str(shot), full_page=False, clip={"x": 0, "y": 0, "width": 1280, "height": 520}
        )
    size = shot.stat().st_size
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and size < 150_000, size
    if os.environ.get("UPDATE_DOCS_SCREENSHOT") == "1":
        DOCS_SCREENSHOT.write_bytes(shot.read_bytes())
    assert DOCS_SCREENSHOT.is_file() and DOCS_SCREENSHOT.stat().st_size < 150_000
