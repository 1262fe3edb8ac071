"""The console's charts in a real browser, against a running pipeline (moto's SQS,
the recording SES) with SES events played onto the events queue: the overview's
and a tenant's sends per minute against their limits, and the tenant's
deliverability by mailbox provider, each data point read off the page and
checked against the rollups (the SDK's admin API) and SES's recording. MX
records come from a local fake (tests/support/deliverability.py): no DNS here.

``UPDATE_DOCS_SCREENSHOT=1`` writes the screenshots docs/operations.md shows.
"""

from __future__ import annotations

import os
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from playwright.async_api import Page, expect

from fairpost import AsyncMailClient
from fairpost.config import Settings
from fairpost.mailer.quota.admin import QuotaAdmin
from fairpost.mailer.sdk.rollups import Deliverability, SendHistory
from fairpost.mailer.testing.ses_server import SesServer
from fairpost.mailer.testing.wait import wait_for_async as wait_for
from tests.console.conftest import BROWSER_LOOP, TOKEN, log_in, serve
from tests.support.deliverability import EVENTS_QUEUE, FakeDns, events_to
from tests.support.pipeline import pipeline, quick_settings

ROOT = Path(__file__).resolve().parents[2]
SHOTS = {
    "overview": ROOT / "docs" / "console-overview.png",
    "tenant": ROOT / "docs" / "console-tenant.png",
    "phone": ROOT / "docs" / "console-tenant-phone.png",
    "overview-phone": ROOT / "docs" / "console-overview-phone.png",
}
GMAIL = ["ann@gmail.com", "bob@gmail.com", "cy@workspace.example", "di@gmail.com"]
OUTLOOK = ["ed@outlook.com", "flo@m365.example", "gus@hotmail.com"]

pytestmark = BROWSER_LOOP


def mail_to(address: str) -> dict[str, Any]:
    return {"sender": "app@example.com", "to": [address], "subject": "hi", "text": "hello"}


async def bars(page: Page, chart: str) -> dict[str, int]:
    """The chart's bars as drawn: minute (HH:MM) → value, the empty minutes left out."""
    drawn = await page.locator(f"#{chart} rect.bar").evaluate_all(
        "rects => rects.map(r => [r.dataset.minute, Number(r.dataset.value)])"
    )
    assert len(drawn) == 60
    return {minute: value for minute, value in drawn if value}


def stored(history: SendHistory) -> dict[str, int]:
    return {_hhmm(at_ms / 1000): n for at_ms, n in history.minutes if n}


def _hhmm(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, tz=UTC).strftime("%H:%M")


async def test_the_charts_show_the_hours_rate_against_the_limit_and_deliverability_by_provider(
    page: Page, redis_url: str, ses_env: SesServer, tmp_path: Path
) -> None:
    settings = quick_settings(
        redis_url, events_queue_name=EVENTS_QUEUE, console={"token": TOKEN},
        global_limits="30/minute; 5000/day", reputation={"bounce_threshold": 1, "complaint_threshold": 1},
    )  # fmt: skip
    with QuotaAdmin(settings) as admin:
        admin.set_tenant_limits("acme", "20/minute")
    with events_to(ses_env, redis_url):
        async with (
            pipeline(settings, reputation=True, mx_lookup=FakeDns()),
            AsyncMailClient(settings) as client,
        ):
            for address in GMAIL + OUTLOOK:
                await client.send("acme", **mail_to(address))
            await client.send("globex", **mail_to("hal@yahoo.com"))
            await wait_for(lambda: _sent(ses_env, 8), within=20, what="every mail at SES")
            at_ses = {m.recipients[0]: m.message_id for m in ses_env.sent}
            for address in GMAIL[:3]:
                ses_env.emit("Bounce", at_ses[address])
            for address in [GMAIL[3], *OUTLOOK]:
                ses_env.emit("Delivery", at_ses[address])
            ses_env.emit("Complaint", at_ses["ed@outlook.com"])
            await wait_for(lambda: _counted(settings), within=20, what="the events counted")
            with QuotaAdmin(settings) as admin:
                admin.pause("globex")
            async with serve(settings, live_seconds=0.5) as base:
                await log_in(page, base)
                await _overview(page, settings, ses_env, tmp_path)
                await page.goto(base + "/tenants/acme")
                await _tenant(page, settings, ses_env, tmp_path)
                # Live: a mail sent while the page is open shows without a reload.
                await client.send("acme", **mail_to("ivy@gmail.com"))
                await expect(page.locator("#tenant-minutes")).to_have_attribute(
                    "data-total", "8", timeout=20_000
                )
                await page.set_viewport_size({"width": 390, "height": 844})
                await page.reload()
                overflow = await page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
                assert overflow <= 0, f"the tenant page is {overflow}px wider than a 390px phone"
                await expect(page.locator("#tenant-minutes svg")).to_be_visible()
                await _shot(page, tmp_path, "phone", full_page=False)
                await page.goto(base + "/")
                overflow = await page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
                assert overflow <= 0, f"the overview is {overflow}px wider than a 390px phone"
                await expect(page.locator("#global-minutes svg")).to_be_visible()
                await _shot(page, tmp_path, "overview-phone", full_page=False)


async def _overview(page: Page, settings: Settings, ses: SesServer, tmp_path: Path) -> None:
    chart = page.locator("#global-minutes")
    await expect(chart).to_have_attribute("data-total", "8")
    await expect(chart).to_have_attribute("data-limit", "30.00")
    await expect(chart.locator("line.limit")).to_have_count(1)
    await expect(chart.locator("figcaption")).to_contain_text("limit 30/min (from 30/minute)")
    drawn = await bars(page, "global-minutes")
    with Deliverability(settings) as book:
        assert drawn == stored(book.send_history())
    # SES's recording, minute by minute (the daemon counts a send when it records SES's
    # answer, a moment after SES took it: a send may fall in the next minute).
    at_ses = Counter(_hhmm(m.wall_time) for m in ses.sent)
    assert sum(drawn.values()) == sum(at_ses.values()) == 8
    assert all(m in drawn or _next(m) in drawn for m in at_ses), (at_ses, drawn)
    await expect(page.locator("#held-count")).to_have_text("1")
    await expect(page.locator("ul.held")).to_have_text("globex: paused by an operator")
    await _shot(page, tmp_path, "overview")


async def _tenant(page: Page, settings: Settings, ses: SesServer, tmp_path: Path) -> None:
    chart = page.locator("#tenant-minutes")
    await expect(chart).to_have_attribute("data-total", "7")
    await expect(chart).to_have_attribute("data-limit", "20.00")
    with Deliverability(settings) as book:
        assert await bars(page, "tenant-minutes") == stored(book.send_history("acme"))
        report = book.report("acme", days=14)
    assert sum(1 for m in ses.sent if m.tags.get("fairpost-tenant") == "acme") == 7
    gmail, outlook = page.locator("tr[data-provider=gmail]"), page.locator("tr[data-provider=outlook]")
    await expect(gmail.locator(".bounce-rate")).to_contain_text("75.00% 3 / 4")
    await expect(gmail.locator(".complaint-rate")).to_have_text("no data")
    await expect(outlook.locator(".bounce-rate")).to_contain_text("0.00% 0 / 3")
    await expect(outlook.locator(".complaint-rate")).to_contain_text("33.333% 1 / 3")
    # The 14-day bars: each day's numbers are the rollup's.
    for provider, series in report.daily.items():
        drawn = await page.locator(f"tr[data-provider={provider}] svg.days g").evaluate_all(
            "gs => gs.map(g => [g.dataset.day, Number(g.dataset.sent), Number(g.dataset.bounced)])"
        )
        want = [
            [day, p.counts["sent"], p.counts["hard_bounced"] + p.counts["soft_bounced"]]
            for day, p in zip(report.days, series, strict=True)
        ]
        assert drawn == want
    assert report.days[-1] == datetime.now(UTC).date().isoformat() or report.days[-1] < "9"
    await _shot(page, tmp_path, "tenant")


async def _shot(page: Page, tmp_path: Path, name: str, *, full_page: bool = True) -> None:
    shot = tmp_path / SHOTS[name].name
    await page.screenshot(path=str(shot), full_page=full_page)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    if os.environ.get("UPDATE_DOCS_SCREENSHOT") == "1":
        SHOTS[name].write_bytes(shot.read_bytes())
    assert SHOTS[name].is_file()


def _next(minute: str) -> str:
    h, m = (int(x) for x in minute.split(":"))
    return f"{(h + (m + 1) // 60) % 24:02d}:{(m + 1) % 60:02d}"


def _sent(ses: SesServer, n: int) -> bool:
    return len(ses.sent) >= n


def _counted(settings: Settings) -> bool:
    with Deliverability(settings) as book:
        rows = {p.provider: p.counts for p in book.report("acme", days=1).providers}
    return rows.get("gmail", {}).get("hard_bounced") == 3 and rows.get("outlook", {}).get("complained") == 1
