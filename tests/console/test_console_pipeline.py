"""The console against a running dispatcher and sender (moto's SQS, the recording
SES): what an operator does in the browser changes what the pipeline does.

A throttled tenant and its reason are found; a new quota is saved and the
waiting mail goes; a paused tenant's mail stops while another tenant's goes,
and goes once it is resumed; a replayed dead letter is sent.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from playwright.async_api import Page, expect

from fairpost import AsyncMailClient
from fairpost.mailer.quota.admin import QuotaAdmin
from fairpost.mailer.testing.ses_server import SesServer
from fairpost.mailer.testing.wait import wait_for_async
from tests.console.conftest import BROWSER_LOOP, TOKEN, log_in, serve
from tests.support.pipeline import pipeline, quick_settings

MAIL = {"sender": "no-reply@acme.example", "to": ["ada@example.com"], "subject": "Hi", "text": "Hello"}

pytestmark = BROWSER_LOOP


async def test_what_the_operator_does_in_the_browser_the_pipeline_does(
    page: Page, redis_url: str, ses_env: SesServer
) -> None:
    settings = quick_settings(redis_url, console={"token": TOKEN, "write": True})
    with QuotaAdmin(settings) as admin:
        admin.set_tenant_limits("acme", "1/minute")
    async with pipeline(settings, reputation=True), AsyncMailClient(settings) as client:

        async def sent(job_id: str) -> bool:
            return (await client.status(job_id)).state == "sent"

        async def waiting_for_quota(job_id: str) -> bool:
            return (await client.status(job_id)).waiting_for == "tenant_quota"

        first = await client.send("acme", **MAIL)  # type: ignore[arg-type]
        second = await client.send("acme", **MAIL)  # type: ignore[arg-type]
        await wait_for_async(lambda: sent(first), within=15, what="acme's first mail sent")
        await wait_for_async(
            lambda: waiting_for_quota(second), within=15, what="acme's second mail throttled"
        )

        async with serve(settings) as base:
            await log_in(page, base)
            # The throttled tenant, and why it waits.
            await page.get_by_role("link", name="Tenants").click()
            await page.get_by_role("link", name="Why it waits").click()
            row = page.locator("tr[data-tenant=acme]")
            await expect(row).to_contain_text("tenant quota full (1 of 1 per minute)")
            await page.get_by_label("Job id").fill(second)
            await page.get_by_role("button", name="Find job").click()
            await expect(page.locator(".timeline")).to_contain_text("waits for tenant_quota")

            # A new quota: the mail parked for a minute goes within seconds.
            await page.get_by_role("link", name="acme").click()
            await page.get_by_label("Limits").fill("100/second")
            await page.get_by_role("button", name="Save").click()
            await expect(page.get_by_role("status")).to_contain_text("limits set to 100/second")
            await wait_for_async(
                lambda: sent(second), within=10, what="the throttled mail sent under the new quota"
            )

            # Paused: its mail stops, while mail enqueued after it, of another tenant, goes.
            await page.get_by_role("button", name="Pause").click()
            await expect(page.locator("#waits")).to_contain_text("paused by an operator")
            held = await client.send("acme", **MAIL)  # type: ignore[arg-type]
            other = await client.send("beta", **MAIL)  # type: ignore[arg-type]
            await wait_for_async(lambda: sent(other), within=15, what="beta's mail sent")
            assert (await client.status(held)).state == "queued"

            await page.get_by_role("button", name="Resume").click()
            await expect(page.get_by_role("status")).to_contain_text("resumed")
            await wait_for_async(lambda: sent(held), within=15, what="acme's mail sent once resumed")

            # A dead letter replayed is sent.
            dead = await client.send("acme", **MAIL, send_at=datetime.now(UTC) + timedelta(hours=1))  # type: ignore[arg-type]
            await client.cancel(dead)
            await page.get_by_role("link", name="Dead letters").click()
            await page.locator(f"tr[data-job='{dead}']").get_by_role("button", name="Replay").click()
            await expect(page.get_by_role("status")).to_contain_text(f"job {dead}: replayed")
            await wait_for_async(lambda: sent(dead), within=15, what="the replayed dead letter sent")
            await page.goto(f"{base}/jobs/{dead}")
            await expect(page.locator("#state")).to_have_text("sent")
    assert [m.job_id for m in ses_env.sent] == [first, second, other, held, dead]
