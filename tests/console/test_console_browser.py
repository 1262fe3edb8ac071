"""The console in a real browser: an operator logs in, finds a tenant and why it
waits, pauses and resumes it, edits its quota, replays a dead letter; read-only
mode and CSRF change nothing; 100,000 tenants come in pages.

Each test serves the console on its own Redis (the ``redis_url`` fixture) and
checks what it did in Redis through the same admin clients the CLI uses. The
pipeline's own story (pause stops mail, replay sends it) is in
test_console_pipeline.py.
"""

from __future__ import annotations

import logging
import re
from datetime import UTC, datetime, timedelta

import pytest
import redis
from playwright.async_api import Page, expect

from fairpost import MailClient
from fairpost.config.limits import parse_limits
from fairpost.dispatcher.store import store_limits
from fairpost.mailer.quota.admin import QuotaAdmin
from fairpost.mailer.quota.engine import QuotaEngine
from fairpost.mailer.quota.holds import TenantHolds
from fairpost.mailer.sdk.keys import MailKeys
from tests.console.conftest import BROWSER_LOOP, TOKEN, console_settings, log_in, serve

MAIL = {"sender": "no-reply@acme.example", "to": ["ada@example.com"], "subject": "Hi", "text": "Hello"}

pytestmark = BROWSER_LOOP


def send(redis_url: str, tenant: str, **options: object) -> str:
    with MailClient(console_settings(redis_url)) as client:
        return client.send(tenant, **MAIL, **options)  # type: ignore[arg-type]


def paused(redis_url: str) -> frozenset[str]:
    with QuotaAdmin(console_settings(redis_url)) as admin:
        return admin.overrides().paused


# -- access -------------------------------------------------------------------------------


async def test_login_sets_a_strict_httponly_cookie_and_logout_ends_it(page: Page, redis_url: str) -> None:
    async with serve(console_settings(redis_url)) as base:
        await page.goto(base + "/tenants?q=acme")
        # Not logged in: the login page, which comes back to where the operator was going.
        await expect(page.get_by_role("button", name="Log in")).to_be_visible()
        assert "/login?next=/tenants" in page.url
        await page.get_by_label("Token").fill("not-the-token-at-all")
        await page.get_by_role("button", name="Log in").click()
        await expect(page.get_by_role("alert")).to_contain_text("not the console's token")
        await page.get_by_label("Token").fill(TOKEN)
        await page.get_by_role("button", name="Log in").click()
        await page.wait_for_url(re.compile(re.escape(base) + r"/tenants\?q=acme$"))
        await expect(page.get_by_role("heading", name="Tenants")).to_be_visible()

        [cookie] = await page.context.cookies()
        assert cookie["httpOnly"] is True and cookie["sameSite"] == "Strict"
        assert TOKEN not in cookie["value"]

        await page.get_by_role("button", name="Log out").click()
        await expect(page.get_by_role("button", name="Log in")).to_be_visible()
        await page.goto(base + "/")
        await expect(page.get_by_role("button", name="Log in")).to_be_visible()


# -- finding a tenant, and why it waits ------------------------------------------------------


async def test_find_a_throttled_tenant_and_its_reasons(
    page: Page, redis_url: str, aredis: redis.asyncio.Redis
) -> None:
    settings = console_settings(redis_url, write=True)
    for tenant in ("acme", "beta", "gamma"):
        send(redis_url, tenant)
    # acme's quota is spent: one recipient fits a minute, and it had one.
    with QuotaAdmin(settings) as admin:
        admin.set_tenant_limits("acme", "1/minute")
        admin.pause("gamma")
    grant = await QuotaEngine(aredis, MailKeys()).acquire(
        "acme", [1], parse_limits("14/second"), parse_limits("1/minute")
    )
    assert grant.granted == 1
    await TenantHolds(aredis, MailKeys(), store_limits(settings)).hold(
        "beta", "ses_MailFromDomainNotVerified", first_seconds=60, most_seconds=60
    )

    async with serve(settings) as base:
        await log_in(page, base)
        await page.get_by_role("link", name="Tenants").click()
        await page.get_by_label("Tenant id").fill("acm")
        await page.get_by_role("button", name="Search").click()
        row = page.locator("tr", has=page.get_by_role("link", name="acme", exact=True))
        await expect(row).to_contain_text("tenant quota full (1 of 1 per minute)")
        await expect(row).to_contain_text(
            re.compile(r"until \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC \(in \d+\.\d s\)")
        )
        await expect(page.locator("#count")).to_contain_text("1 of 3 tenants match")

        # Sorted by hold: the paused tenant first, then the SES hold, then the quota wait.
        await page.goto(base + "/tenants?sort=hold")
        tenants = await page.locator("tbody tr th").all_inner_texts()
        assert tenants == ["gamma", "beta", "acme"]
        await expect(page.locator("tr[data-tenant=gamma]")).to_contain_text("paused by an operator")
        await expect(page.locator("tr[data-tenant=beta]")).to_contain_text(
            "held: SES refused its own set-up (ses_MailFromDomainNotVerified)"
        )

        await page.get_by_role("link", name="acme", exact=True).click()
        await expect(page.get_by_role("heading", name="Tenant acme")).to_be_visible()
        await expect(page.locator("#waits")).to_contain_text("tenant quota full")
        await expect(page.locator("#backlog")).to_have_text("1")


async def test_pause_and_resume(page: Page, redis_url: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="fairpost.console")
    send(redis_url, "acme")
    async with serve(console_settings(redis_url, write=True)) as base:
        await log_in(page, base)
        await page.goto(base + "/tenants/acme")
        await page.get_by_role("button", name="Pause").click()
        await expect(page.get_by_role("status")).to_contain_text("Done: paused")
        await expect(page.locator("#waits")).to_contain_text("paused by an operator")
        assert paused(redis_url) == {"acme"}

        await page.get_by_role("button", name="Resume").click()
        await expect(page.get_by_role("status")).to_contain_text("Done: resumed")
        await expect(page.get_by_role("button", name="Pause")).to_be_visible()
        await expect(page.locator("#waits")).to_have_text("nothing holds it")
        assert paused(redis_url) == frozenset()
    # Each action is logged: what, which tenant, and who (a digest of the session, never the cookie).
    actions = [
        (r.getMessage(), getattr(r, "tenant", None))
        for r in caplog.records
        if " by session " in r.getMessage()
    ]
    assert [(m.split(" by ")[0], t) for m, t in actions] == [
        ("console: paused", "acme"),
        ("console: resumed", "acme"),
    ]
    [cookie] = await page.context.cookies()
    assert all(cookie["value"].split(".")[0] not in m for m, _ in actions)


async def test_edit_a_quota(page: Page, redis_url: str) -> None:
    settings = console_settings(redis_url, write=True)
    send(redis_url, "acme")
    async with serve(settings) as base:
        await log_in(page, base)
        await page.goto(base + "/tenants/acme")
        limits = page.get_by_label("Limits")
        await expect(limits).to_have_value("5/second; 10000/day")  # the settings' defaults

        # A rule broken: the page says which, and nothing is written.
        await limits.fill("1 per 0 seconds")
        await page.get_by_role("button", name="Save").click()
        await expect(page.get_by_role("alert")).to_contain_text("limits:")
        await expect(page.get_by_label("Limits")).to_have_value("1 per 0 seconds")
        with QuotaAdmin(settings) as admin:
            assert admin.tenant_limits("acme").source == "settings"

        await page.get_by_label("Limits").fill("100/minute; 5000/day")
        await page.get_by_role("button", name="Save").click()
        await expect(page.get_by_role("status")).to_contain_text("limits set to 100/minute; 5000/day")
        await expect(page.get_by_label("Limits")).to_have_value("100/minute; 5000/day")
        await expect(page.get_by_role("heading", name="Quota")).to_contain_text("from override")
        with QuotaAdmin(settings) as admin:
            applied = admin.tenant_limits("acme")
        assert (applied.source, applied.windows) == ("override", parse_limits("100/minute; 5000/day"))

        await page.get_by_role("button", name="Reset to the settings").click()
        await expect(page.get_by_role("status")).to_contain_text("limits back to the settings")
        with QuotaAdmin(settings) as admin:
            assert admin.tenant_limits("acme").source == "settings"


# -- dead letters ------------------------------------------------------------------------------


def dead_letter(redis_url: str, tenant: str) -> str:
    """A replayable dead letter: a job cancelled before its send time."""
    job_id = send(redis_url, tenant, send_at=datetime.now(UTC) + timedelta(hours=1))
    with MailClient(console_settings(redis_url)) as client:
        client.cancel(job_id)
    return job_id


def state(redis_url: str, job_id: str) -> str:
    with MailClient(console_settings(redis_url)) as client:
        return client.status(job_id).state


async def test_replay_a_dead_letter_and_replay_all_with_a_count(page: Page, redis_url: str) -> None:
    first = dead_letter(redis_url, "acme")
    others = [dead_letter(redis_url, "acme"), dead_letter(redis_url, "beta"), dead_letter(redis_url, "beta")]
    async with serve(console_settings(redis_url, write=True)) as base:
        await log_in(page, base)
        await page.get_by_role("link", name="Dead letters").click()
        await expect(page.locator("#count")).to_have_text("4 dead letters.")
        await page.locator(f"tr[data-job='{first}']").get_by_role("button", name="Replay").click()
        await expect(page.get_by_role("status")).to_contain_text(f"job {first}: replayed")
        assert state(redis_url, first) == "queued"

        # Everything the filter matches, after a confirmation that says how many.
        await page.get_by_label("Tenant").fill("beta")
        await page.get_by_role("button", name="Filter").click()
        await expect(page.locator("#count")).to_have_text("2 dead letters match.")
        await page.get_by_role("button", name="Replay all").click()
        await expect(page.locator("#confirm-question")).to_contain_text(
            "Replay 2 dead letters of tenant beta"
        )
        await page.get_by_role("button", name="Yes, replay 2").click()
        await expect(page.get_by_role("status")).to_contain_text("replayed 2 dead letters (tenant beta)")
        assert [state(redis_url, j) for j in others] == ["dead", "queued", "queued"]

        # Purge all: the last one, for good.
        await page.goto(base + "/dead")
        await page.get_by_role("button", name="Purge all").click()
        await page.get_by_role("button", name="Yes, purge 1").click()
        await expect(page.get_by_role("status")).to_contain_text("purged 1 dead letters")
        await expect(page.locator("#count")).to_have_text("0 dead letters.")


async def test_replay_all_when_the_letters_changed_since_the_count_acts_on_none(
    page: Page, redis_url: str
) -> None:
    confirmed = [dead_letter(redis_url, "acme"), dead_letter(redis_url, "acme")]
    async with serve(console_settings(redis_url, write=True)) as base:
        await log_in(page, base)
        await page.goto(base + "/dead/confirm?action=replay&tenant=acme")
        await expect(page.locator("#confirm-question")).to_contain_text("Replay 2 dead letters")
        later = dead_letter(redis_url, "acme")  # while the operator reads the question
        await page.get_by_role("button", name="Yes, replay 2").click()
        await expect(page.get_by_role("alert")).to_contain_text(
            "3 dead letters match now, not the 2 confirmed"
        )
        await expect(page.get_by_role("button", name="Yes, replay 3")).to_be_visible()
        assert [state(redis_url, j) for j in [*confirmed, later]] == ["dead", "dead", "dead"]


async def test_a_job_from_the_search_box(page: Page, redis_url: str) -> None:
    job_id = dead_letter(redis_url, "acme")
    async with serve(console_settings(redis_url, write=True)) as base:
        await log_in(page, base)
        await page.get_by_label("Job id").fill(job_id)
        await page.get_by_role("button", name="Find job").click()
        await expect(page.get_by_role("heading", name=f"Job {job_id}")).to_be_visible()
        await expect(page.locator("#state")).to_have_text("dead")
        await expect(page.locator(".timeline")).to_contain_text("finished: dead: cancelled")
        await page.get_by_role("button", name="Replay").click()
        await expect(page.locator("#state")).to_have_text("queued")

        await page.get_by_label("Job id").fill("no/such job?")
        await page.get_by_role("button", name="Find job").click()
        await expect(page.get_by_role("heading", name="No such job")).to_be_visible()
