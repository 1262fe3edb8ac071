"""The console's tenant page shows who unsubscribed, from which topics and how, apart
from the suppression list, addresses masked (issue #42). Read over HTTP with the
console's bearer token; no browser needed for a table."""

from __future__ import annotations

import aiohttp

from fairpost.mailer.sdk.unsubscribes import Unsubscribes
from tests.console.conftest import TOKEN, console_settings, serve


async def test_the_tenant_page_lists_its_unsubscribes(redis_url: str) -> None:
    settings = console_settings(redis_url)
    with Unsubscribes(settings) as unsubscribes:
        unsubscribes.add("acme", "ada@example.com", topic="digest")
        unsubscribes.add("acme", "grace@example.com")
    async with serve(settings) as base, aiohttp.ClientSession() as http:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with http.get(f"{base}/tenants/acme", headers=headers) as page:
            assert page.status == 200
            body = await page.text()
    section = body[body.index('id="unsub-h"') : body.index('id="jobs-h"')]
    assert "2 addresses" in section
    assert "digest" in section and "every topic" in section and "admin" in section
    assert "ada@example.com" not in section and "a***@example.com" in section
