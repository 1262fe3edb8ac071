"""The console served in the test's event loop, and a real browser to drive it.

The browser is Debian's Chromium (``apt-get install chromium``, which
scripts/bootstrap.sh does with the test extra), driven by Playwright at the
binary the package installs: /usr/bin/chromium is a shell launcher, and
``playwright install`` would download a browser of its own. Without it the
browser tests skip, saying so; in CI (``CI`` set) they fail.

A browser test that fails leaves a screenshot of its page in its tmp_path,
named in its report (pytest keeps the tmp_path of failed tests).

The browser is started once (starting Playwright's driver and Chromium took
about a second a test) and each test gets a context of its own, so no cookie or
page outlives its test. Playwright's objects belong to the event loop they were
made in: a test that drives the browser runs in the session's loop
(``BROWSER_LOOP``), as do the async fixtures it uses.
"""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator, Generator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import redis.asyncio
from aiohttp import web
from playwright.async_api import Browser, BrowserContext, Page, async_playwright

from fairpost.config import Settings, load_settings
from fairpost.mailer.console.app import build_app

CHROMIUM = Path("/usr/lib/chromium/chromium")
BROWSER_LOOP = pytest.mark.asyncio(loop_scope="session")
"""The mark of every test that drives the browser: it runs in the browser's event loop."""
TOKEN = "test-console-token-0123456789abcdef"

# Chromium as root in a container, with no network beyond loopback: no sandbox
# (root), and none of the background calls home that the closed network refuses.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-features=Translate,OptimizationHints,MediaRouter",
]


def console_settings(redis_url: str, **console: Any) -> Settings:
    """Settings on the test's Redis with a console section: the token, and what the test says."""
    return load_settings(redis_url=redis_url, console={"token": TOKEN, **console})


@asynccontextmanager
async def serve(settings: Settings, **options: Any) -> AsyncIterator[str]:
    """The console on a free port of 127.0.0.1 until the block ends: its base URL (with the prefix)."""
    runner = web.AppRunner(build_app(settings, **options), access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        yield f"http://127.0.0.1:{port}{settings.console.prefix}"
    finally:
        await runner.cleanup()


@pytest.fixture(scope="session")
def chromium() -> Path:
    if CHROMIUM.is_file() and os.access(CHROMIUM, os.X_OK):
        return CHROMIUM
    message = (
        f"Chromium is not installed at {CHROMIUM} (Debian's package `chromium`; "
        "scripts/bootstrap.sh installs it with the test extra when run as root)"
    )
    if os.environ.get("CI"):
        pytest.fail(message + ": CI must run the console's browser tests")
    pytest.skip(message)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Keeps each phase's report on the test, for the screenshot fixture to see a failure."""
    report = yield
    item.stash.setdefault(_REPORTS, {})[report.when] = report
    return report


_REPORTS = pytest.StashKey[dict[str, pytest.TestReport]]()


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def browser(chromium: Path) -> AsyncIterator[Browser]:
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(executable_path=str(chromium), args=CHROMIUM_ARGS)
        try:
            yield launched
        finally:
            await launched.close()


@pytest_asyncio.fixture(loop_scope="session")
async def context(browser: Browser) -> AsyncIterator[BrowserContext]:
    made = await browser.new_context(viewport={"width": 1280, "height": 900})
    made.set_default_timeout(10_000)
    try:
        yield made
    finally:
        await made.close()


@pytest_asyncio.fixture(loop_scope="session")
async def page(
    context: BrowserContext, request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[Page]:
    """A page; if the test fails, a screenshot of it in tmp_path, named on stderr."""
    opened = await context.new_page()
    yield opened
    reports = request.node.stash.get(_REPORTS, {})
    if any(r.failed for r in reports.values()):
        shot = tmp_path / "failure.png"
        try:
            await opened.screenshot(path=str(shot), full_page=True)
            print(f"console test failed: screenshot of the page at {shot} ({opened.url})", file=sys.stderr)
        except Exception as exc:  # the page may be what broke
            print(f"console test failed; no screenshot ({exc})", file=sys.stderr)


@pytest_asyncio.fixture(loop_scope="session")
async def aredis(redis_url: str) -> AsyncIterator[redis.asyncio.Redis]:
    """tests/conftest.py's ``aredis``, made in the browser's loop, where the tests that use it here run."""
    client = redis.asyncio.Redis.from_url(redis_url, decode_responses=True)
    yield client
    await client.aclose()


async def log_in(page: Page, base: str, token: str = TOKEN) -> None:
    """Through the login page, as a person would."""
    await page.goto(base + "/")
    await page.get_by_label("Token").fill(token)
    await page.get_by_role("button", name="Log in").click()
    await page.wait_for_url(base + "/")
