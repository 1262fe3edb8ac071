"""Who may do what: without the token nothing is shown or changed; in read-only
mode there are no buttons and every action answers 403; an action made with
the session cookie but without its CSRF token answers 403; a Bearer token
needs none. Each refusal is checked in Redis too: nothing changed."""

from __future__ import annotations

import re

import aiohttp
import pytest
from playwright.async_api import Page, expect

from fairpost import MailClient
from fairpost.mailer.console.auth import Auth, safe_next
from fairpost.mailer.quota.admin import QuotaAdmin
from fairpost.mailer.sdk.suppression import Suppressions
from tests.console.conftest import BROWSER_LOOP, TOKEN, console_settings, log_in, serve

MAIL = {"sender": "no-reply@acme.example", "to": ["ada@example.com"], "subject": "Hi", "text": "Hello"}
BEARER = {"Authorization": f"Bearer {TOKEN}"}


def seed(redis_url: str) -> str:
    """A tenant with mail waiting, a suppressed address and a dead letter; the dead job's id."""
    settings = console_settings(redis_url)
    with MailClient(settings) as client:
        client.send("acme", **MAIL)  # type: ignore[arg-type]
        dead = client.send("acme", **MAIL)  # type: ignore[arg-type]
        client.cancel(dead)
        client.suppressions().add("acme", "grace.hopper@example.com")
    return dead


def unchanged(redis_url: str) -> None:
    """What :func:`seed` wrote, as it was: nothing paused or overridden, the address still suppressed."""
    settings = console_settings(redis_url)
    with QuotaAdmin(settings) as admin:
        overrides = admin.overrides()
    assert (overrides.paused, dict(overrides.tenants)) == (frozenset(), {})
    with Suppressions(settings) as lists:
        assert [e.address for e in lists.list("acme")] == ["grace.hopper@example.com"]
    with MailClient(settings) as client:
        assert [d.tenant_id for d in client.dead_letters().list()] == ["acme"]


ACTIONS: list[tuple[str, dict[str, str | float | bool]]] = [
    ("/tenants/acme/pause", {}),
    ("/tenants/acme/limits", {"limits": "1/minute"}),
    ("/tenants/acme/suppressions", {"address": "ada@example.com"}),
    ("/dead/replay-all", {"count": "1"}),
    ("/dead/purge-all", {"count": "1"}),
]


async def test_without_the_token_pages_go_to_login_and_the_rest_is_401(redis_url: str) -> None:
    seed(redis_url)
    async with serve(console_settings(redis_url, write=True)) as base, aiohttp.ClientSession() as http:
        for path in ("/", "/tenants", "/tenants/acme", "/dead"):
            async with http.get(base + path, allow_redirects=False) as response:
                assert response.status == 302, path
                assert response.headers["Location"].startswith("/login?next=")
        async with http.get(base + "/fragments/overview") as response:
            assert response.status == 401
        for path, form in ACTIONS:
            async with http.post(base + path, data=form, allow_redirects=False) as response:
                assert response.status == 401, path
            async with http.post(
                base + path, data=form, headers={"Authorization": "Bearer wrong-token-0123456789"}
            ) as response:
                assert response.status == 401, path
        # Anyone may ask whether it is up, and nothing more.
        async with http.get(base + "/healthz") as response:
            assert (response.status, await response.text()) == (200, "ok\n")
        async with http.get(base + "/tenants", headers=BEARER) as response:
            assert response.status == 200 and "acme" in await response.text()
    unchanged(redis_url)


@BROWSER_LOOP
async def test_read_only_shows_no_buttons_and_refuses_every_action(page: Page, redis_url: str) -> None:
    dead = seed(redis_url)
    async with serve(console_settings(redis_url)) as base:
        await log_in(page, base)
        await expect(page.get_by_text("read-only", exact=True)).to_be_visible()
        for path in ("/tenants/acme", "/dead", f"/jobs/{dead}"):
            await page.goto(base + path)
            await expect(page.get_by_role("heading", level=1)).to_be_visible()
            for name in ("Pause", "Resume", "Save", "Suppress", "Remove", "Replay", "Purge", "Replay all"):
                await expect(page.get_by_role("button", name=name, exact=True)).to_have_count(0)
            await expect(page.get_by_label("Limits")).to_have_count(0)

        # A good session and its CSRF token: still 403, for the browser's session and for a Bearer token.
        csrf = await page.locator("input[name=csrf]").first.get_attribute("value")
        assert csrf
        for path, form in [*ACTIONS, (f"/dead/{dead}/replay", {}), (f"/dead/{dead}/purge", {})]:
            response = await page.request.post(base + path, form={**form, "csrf": csrf}, max_redirects=0)
            assert response.status == 403, path
            assert "read-only" in await response.text()
            response = await page.request.post(base + path, form=form, headers=BEARER, max_redirects=0)
            assert response.status == 403, path
    unchanged(redis_url)


@BROWSER_LOOP
async def test_an_action_without_the_csrf_token_is_refused(page: Page, redis_url: str) -> None:
    dead = seed(redis_url)
    async with serve(console_settings(redis_url, write=True)) as base:
        await log_in(page, base)
        # A forged request carries the cookie but not the token (or a wrong one).
        for path, form in [*ACTIONS, (f"/dead/{dead}/replay", {})]:
            for csrf in ({}, {"csrf": "0" * 32}):
                response = await page.request.post(base + path, form={**form, **csrf}, max_redirects=0)
                assert response.status == 403, (path, csrf)
                assert "CSRF" in await response.text()
        # The console's own form, with its token taken out.
        await page.goto(base + "/tenants/acme")
        await page.locator("form:has(button:text-is('Pause')) input[name=csrf]").evaluate("e => e.remove()")
        await page.get_by_role("button", name="Pause").click()
        await expect(page.locator("body")).to_contain_text("missing or wrong CSRF token")
        unchanged(redis_url)

        # A script with the token itself needs no CSRF token: it carries no cookie.
        async with (
            aiohttp.ClientSession() as http,
            http.post(base + "/tenants/acme/pause", headers=BEARER, allow_redirects=False) as answer,
        ):
            assert answer.status == 303
            assert re.fullmatch(r"/tenants/acme\?done=\S+", answer.headers["Location"])
    with QuotaAdmin(console_settings(redis_url)) as admin:
        assert admin.overrides().paused == {"acme"}


@BROWSER_LOOP
async def test_addresses_are_masked_unless_shown(page: Page, redis_url: str) -> None:
    seed(redis_url)
    async with serve(console_settings(redis_url, write=True)) as base:
        await log_in(page, base)
        await page.goto(base + "/tenants/acme")
        suppressions = page.get_by_role("region", name=re.compile("Suppression list"))
        await expect(suppressions).to_contain_text("g***@example.com")
        await expect(page.locator("body")).not_to_contain_text("grace.hopper")
        # Removing works on the masked entry; adding one says nothing of it either.
        await page.get_by_role("button", name="Remove").click()
        await expect(page.get_by_role("status")).to_contain_text("address removed from the suppression list")
        await page.get_by_label("Address to suppress").fill("alan.turing@example.com")
        await page.get_by_role("button", name="Suppress").click()
        await expect(page.get_by_role("status")).to_contain_text("address suppressed")
        await expect(suppressions).to_contain_text("a***@example.com")
        await expect(page.locator("body")).not_to_contain_text("alan.turing")
    with Suppressions(console_settings(redis_url)) as lists:
        assert [e.address for e in lists.list("acme")] == ["alan.turing@example.com"]

    # Sessions are signed, not stored: the cookie of the console above logs in to this one.
    async with serve(console_settings(redis_url, show_addresses=True)) as base:
        await page.goto(base + "/tenants/acme")
        await expect(page.locator("body")).to_contain_text("alan.turing@example.com")


def test_session_cookies_are_signed_and_expire(redis_url: str) -> None:
    auth = Auth(console_settings(redis_url))
    cookie = auth.new_cookie(now=1000.0)
    session = auth.session_from_cookie(cookie, now=1001.0)
    assert session is not None and session.via == "cookie" and len(session.csrf) == 32
    session_id, expires, signature = cookie.split(".")
    assert auth.session_from_cookie(cookie, now=float(expires) + 1) is None  # expired
    assert auth.session_from_cookie(f"{session_id}.{int(expires) + 3600}.{signature}", now=1001.0) is None
    assert auth.session_from_cookie(f"{session_id}x.{expires}.{signature}", now=1001.0) is None
    # The same token in another process reads it; another token ends every session of the old one.
    assert Auth(console_settings(redis_url)).session_from_cookie(cookie, now=1001.0) == session
    assert Auth(console_settings(redis_url, token="x" * 40)).session_from_cookie(cookie, now=1001.0) is None
    assert TOKEN not in session.who and session_id not in session.who


@pytest.mark.parametrize(
    ("wanted", "goes_to"),
    [
        ("/ops/tenants?q=a", "/ops/tenants?q=a"),
        (None, "/ops/"),
        ("https://evil.example/", "/ops/"),
        ("//evil.example/ops/", "/ops/"),
        ("/elsewhere", "/ops/"),
        ("/ops/\\evil", "/ops/"),
    ],
)
def test_login_goes_on_only_to_the_console_itself(wanted: str | None, goes_to: str) -> None:
    assert safe_next("/ops", wanted) == goes_to


async def test_odd_cookies_and_csrf_tokens_are_refused_not_a_crash(redis_url: str) -> None:
    settings = console_settings(redis_url, write=True)
    seed(redis_url)
    cookie = Auth(settings).new_cookie()
    session_id, expires, _ = cookie.split(".")
    async with serve(settings) as base, aiohttp.ClientSession() as http:
        for odd in (f"{session_id}.{expires}.é", "é", "...", f"{session_id}.-1.x"):
            headers = {"Cookie": f"fairpost_console={odd}".encode().decode("latin-1")}
            async with http.get(base + "/tenants", headers=headers, allow_redirects=False) as response:
                assert response.status == 302, odd
        headers = {"Cookie": f"fairpost_console={cookie}"}
        for csrf in ("ü" * 32, "x", "0" * 1000):
            async with http.post(
                base + "/tenants/acme/pause", data={"csrf": csrf}, headers=headers, allow_redirects=False
            ) as response:
                assert response.status == 403, csrf
        # The same cookie with the page's own CSRF token does act: the refusals above were the token's.
        session = Auth(settings).session_from_cookie(cookie)
        assert session is not None
        async with http.post(
            base + "/tenants/acme/pause", data={"csrf": session.csrf}, headers=headers, allow_redirects=False
        ) as response:
            assert response.status == 303
    with QuotaAdmin(settings) as admin:
        assert admin.overrides().paused == {"acme"}
