"""``fairpost unsubscribe-server`` over real HTTP (issue #42): a GET unsubscribes
nobody, only the RFC 8058 POST does, at once; bad tokens change nothing; every
answer is the same whether the address was known; the event reaches the tenant's
webhook, signed (verified by the ``standardwebhooks`` package, tests/outcomes)."""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest
import redis.asyncio
from aiohttp import web

from fairpost.config import Settings, load_settings
from fairpost.mailer.daemon.unsubscribe_server import build_app
from fairpost.mailer.daemon.unsubscriber import Unsubscriber
from fairpost.mailer.sdk.keys import MailKeys
from fairpost.mailer.sdk.unsub_token import Token, sign
from fairpost.mailer.sdk.unsubscribes import Unsubscribes
from fairpost.mailer.testing.wait import wait_for_async
from tests.outcomes.conftest import delivering
from tests.outcomes.receiver import Receiver
from tests.outcomes.support import feed_of
from tests.unsubscribe.support import BASE, KEY

ADA = "ada@example.org"
ONE_CLICK = {"Content-Type": "application/x-www-form-urlencoded"}


def server_settings(redis_url: str, **section: Any) -> Settings:
    options: dict[str, Any] = {"keys": [KEY], "base_url": BASE, "rate_per_minute": 1000}
    options.update(section)
    webhook = {"allow_private": True, "retry_schedule": "50ms,100ms", "timeout_seconds": 3}
    return load_settings(redis_url=redis_url, unsubscribe=options, webhook=webhook)


def token(tenant: str = "acme", topic: str = "comments", *, key: str = KEY, expires_in: int = 3600) -> str:
    return sign(Token(tenant, ADA, topic, int(time.time()) + expires_in), key.encode())


@asynccontextmanager
async def serving(settings: Settings, client: redis.asyncio.Redis) -> AsyncIterator[str]:
    runner = web.AppRunner(build_app(settings, Unsubscriber(settings, client)), access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


def listed(settings: Settings) -> list[tuple[str, tuple[str, ...], str]]:
    with Unsubscribes(settings) as unsubscribes:
        return [(u.address, u.topics, u.source) for u in unsubscribes.list("acme")]


async def test_a_get_unsubscribes_nobody_and_its_page_posts_the_one_click_body(
    redis_url: str, aredis: redis.asyncio.Redis
) -> None:
    settings = server_settings(redis_url)
    async with serving(settings, aredis) as url, aiohttp.ClientSession() as http:
        async with http.get(f"{url}/u/{token()}") as page:
            assert page.status == 200
            body = await page.text()
            assert page.headers["Referrer-Policy"] == "no-referrer"
        assert "comments" in body and "acme" in body and ADA not in body
        assert body.count('method="post"') == 2
        assert '<input type="hidden" name="List-Unsubscribe" value="One-Click">' in body
        assert 'name="scope" value="tenant"' in body
    assert listed(settings) == []
    assert await feed_of(aredis, MailKeys()) == []


async def test_only_a_post_with_the_rfc_8058_body_unsubscribes_and_at_once(
    redis_url: str, aredis: redis.asyncio.Redis
) -> None:
    settings = server_settings(redis_url)
    link = f"/u/{token()}"
    async with serving(settings, aredis) as url, aiohttp.ClientSession() as http:
        for body in ("", "List-Unsubscribe=Yes", "unsubscribe=1"):
            async with http.post(url + link, data=body, headers=ONE_CLICK) as refused:
                assert refused.status == 400
        assert listed(settings) == []
        async with http.post(url + link, data="List-Unsubscribe=One-Click", headers=ONE_CLICK) as done:
            assert done.status == 200
            first = await done.text()
        assert listed(settings) == [(ADA, ("comments",), "link")]
        # The body sent bare, as some clients do, and as multipart form data: both count.
        bare = {"Content-Type": "text/plain"}
        async with http.post(url + link, data="List-Unsubscribe=One-Click", headers=bare) as plain:
            assert plain.status == 200
        multipart = aiohttp.MultipartWriter("form-data")
        multipart.append("One-Click").set_content_disposition("form-data", name="List-Unsubscribe")
        async with http.post(url + link, data=multipart) as parts:
            assert parts.status == 200
        # A second click reads the same: nothing says whether the address was on the list.
        async with http.post(url + link, data="List-Unsubscribe=One-Click", headers=ONE_CLICK) as again:
            assert again.status == 200 and await again.text() == first
        body = "List-Unsubscribe=One-Click&scope=tenant"
        async with http.post(url + link, data=body, headers=ONE_CLICK) as whole:
            assert whole.status == 200
    assert listed(settings) == [(ADA, ("*",), "link")]
    events = [e for e in await feed_of(aredis, MailKeys()) if e.type == "recipient.unsubscribed"]
    assert [(e.tenant, e.data["recipient"], e.data["topic"]) for e in events] == [
        ("acme", ADA, "comments"),
        ("acme", ADA, None),
    ]


@pytest.mark.parametrize(
    "bad",
    [
        # Named: a token holds its expiry, so its text differs between xdist workers.
        pytest.param(token(key="x" * 40), id="another-deployments-key"),
        pytest.param(token(expires_in=-10), id="expired"),
        pytest.param(token()[:-4] + "aaaa", id="tampered-with"),
        pytest.param("not-a-token", id="malformed"),
    ],
)
async def test_a_forged_expired_or_broken_token_is_refused_and_changes_nothing(
    redis_url: str, aredis: redis.asyncio.Redis, bad: str
) -> None:
    settings = server_settings(redis_url)
    async with serving(settings, aredis) as url, aiohttp.ClientSession() as http:
        async with http.get(f"{url}/u/{bad}") as page:
            assert page.status == 400
            refusal = await page.text()
        async with http.post(f"{url}/u/{bad}", data="List-Unsubscribe=One-Click", headers=ONE_CLICK) as post:
            assert post.status == 400 and await post.text() == refusal
    assert listed(settings) == []
    assert await feed_of(aredis, MailKeys()) == []


async def test_the_old_key_still_verifies_after_a_rotation(
    redis_url: str, aredis: redis.asyncio.Redis
) -> None:
    old = "o" * 40
    settings = server_settings(redis_url, keys=[KEY, old])
    async with serving(settings, aredis) as url, aiohttp.ClientSession() as http:
        link = f"{url}/u/{token(key=old)}"
        async with http.post(link, data="List-Unsubscribe=One-Click", headers=ONE_CLICK) as done:
            assert done.status == 200
    assert listed(settings) == [(ADA, ("comments",), "link")]


async def test_a_client_over_its_rate_is_refused(redis_url: str, aredis: redis.asyncio.Redis) -> None:
    settings = server_settings(redis_url, rate_per_minute=3)
    async with serving(settings, aredis) as url, aiohttp.ClientSession() as http:
        codes = []
        for _ in range(5):
            async with http.get(f"{url}/u/{token()}") as page:
                codes.append(page.status)
    assert codes == [200, 200, 200, 429, 429]


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
async def test_curl_as_a_mailbox_provider_does_it(redis_url: str, aredis: redis.asyncio.Redis) -> None:
    settings = server_settings(redis_url)
    async with serving(settings, aredis) as url:
        # RFC 8058's request, as a provider sends it: a POST with the one-click body.
        curl = await asyncio.create_subprocess_exec(
            "curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "-X", "POST",
            "-d", "List-Unsubscribe=One-Click", f"{url}/u/{token()}",
            stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, _ = await asyncio.wait_for(curl.communicate(), timeout=30)
    assert out == b"200"
    assert listed(settings) == [(ADA, ("comments",), "link")]


async def test_the_unsubscribe_reaches_the_tenants_webhook_signed(
    redis_url: str, aredis: redis.asyncio.Redis, receiver: Receiver
) -> None:
    from fairpost.mailer.sdk.outcomes.endpoints import Webhooks

    settings = server_settings(redis_url)
    with Webhooks(settings) as hooks:
        made = hooks.add("acme", receiver.url("/acme"))
        other = hooks.add("globex", receiver.url("/globex"))
    receiver.secret("/acme", made.secret)
    receiver.secret("/globex", other.secret)
    async with delivering(settings), serving(settings, aredis) as url, aiohttp.ClientSession() as http:
        async with http.post(
            f"{url}/u/{token()}", data="List-Unsubscribe=One-Click", headers=ONE_CLICK
        ) as done:
            assert done.status == 200
        await wait_for_async(lambda: len(receiver.verified("/acme")) >= 1, within=20, what="the event")
    [delivery] = receiver.verified("/acme")
    assert delivery.event is not None and delivery.headers["webhook-signature"].startswith("v1,")
    assert delivery.event["type"] == "recipient.unsubscribed"
    assert delivery.event["data"]["recipient"] == ADA and delivery.event["data"]["tenant_id"] == "acme"
    assert receiver.at("/globex") == []
