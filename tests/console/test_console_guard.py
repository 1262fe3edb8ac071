"""The console's doors: a login goes on only to the console itself (``next`` is
parsed, control characters refused); wrong tokens are slowed, logged and counted
per client address without locking the right token out; a session ends on the
server at logout; the console binds 127.0.0.1 unless told otherwise; a link to a
tenant whose id is ``.`` or ``..`` leads to that tenant, not elsewhere.

The slowing is asserted on what the server announces (``Retry-After``) and on
a count of the tokens it actually checked, with the guard's clock in the test's
hands: no wall-clock budget that a busy machine could use up.
"""

from __future__ import annotations

import logging
import re
from html import unescape
from urllib.parse import urljoin, urlsplit

import aiohttp
import pytest
from playwright.async_api import Page

from fairpost import MailClient
from fairpost.config import load_settings
from fairpost.mailer.console.auth import Auth, safe_next
from fairpost.mailer.console.guard import Guard
from tests.console.conftest import BROWSER_LOOP, TOKEN, console_settings, serve

BEARER = {"Authorization": f"Bearer {TOKEN}"}

OFF_SITE = [
    "/\t/evil.example/",
    "/\n/evil.example/",
    "/\r/evil.example/",
    "/\t\t/evil.example/ops/",
    "/\x00/evil.example/",
    "/\x0b/evil.example/",
    "/\\/evil.example/",
    "\\\\evil.example/",
    "//evil.example/",
    "///evil.example/",
    "https://evil.example/",
    "https:evil.example",
    "javascript:alert(1)",
    " //evil.example/",
    "/%09/evil.example/",
    "/ops/\t/evil.example/",
    "/ops/../../evil",
]


class Clock:
    """The guard's clock, moved by the test."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("prefix", ["", "/ops"])
@pytest.mark.parametrize("wanted", OFF_SITE)
def test_next_is_a_path_of_this_console_or_home(prefix: str, wanted: str) -> None:
    goes_to = safe_next(prefix, wanted)
    assert goes_to.startswith(prefix + "/") and not goes_to.startswith("//")
    assert all(32 < ord(c) < 127 for c in goes_to), repr(goes_to)
    # However a browser resolves it, it stays on the console's origin.
    base = f"https://console.example{prefix}/login"
    parts = urlsplit(urljoin(base, goes_to))
    assert (parts.scheme, parts.netloc) == ("https", "console.example")


@pytest.mark.parametrize("prefix", ["", "/ops"])
async def test_a_login_never_leads_off_the_console(redis_url: str, prefix: str) -> None:
    settings = console_settings(redis_url, prefix=prefix)
    async with serve(settings, guard=Guard()) as base, aiohttp.ClientSession() as http:
        for wanted in [*OFF_SITE, f"{prefix}/tenants?q=a"]:
            form = {"token": TOKEN, "next": wanted}
            async with http.post(base + "/login", data=form, allow_redirects=False) as response:
                assert response.status == 303, wanted
                location = response.headers["Location"]
            assert all(32 < ord(c) < 127 for c in location), (wanted, location)
            landed = urlsplit(urljoin(base + "/login", location))
            assert landed.netloc == urlsplit(base).netloc, (wanted, location)
            assert landed.path.startswith(prefix + "/"), (wanted, location)
        assert location == f"{prefix}/tenants?q=a"  # a path of its own is kept


@BROWSER_LOOP
@pytest.mark.parametrize("wanted", ["/%09/evil.example/", "/%0A/evil.example/", "/%5C/evil.example/"])
async def test_a_browser_logging_in_from_a_crafted_link_stays_on_the_console(
    page: Page, redis_url: str, wanted: str
) -> None:
    # The link a phisher would send: the console's own login page, with next carrying a
    # tab, a line break or a backslash that the browser itself would drop or turn into '/'.
    async with serve(console_settings(redis_url), guard=Guard()) as base:
        await page.goto(f"{base}/login?next={wanted}")
        await page.get_by_label("Token").fill(TOKEN)
        await page.get_by_role("button", name="Log in").click()
        await page.wait_for_url(base + "/")
        assert urlsplit(page.url).netloc == urlsplit(base).netloc


async def test_a_logged_out_cookie_is_refused_by_every_console(redis_url: str) -> None:
    settings = console_settings(redis_url)
    async with (
        serve(settings) as base,
        serve(settings) as other,
        aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as http,
    ):
        async with http.post(base + "/login", data={"token": TOKEN}, allow_redirects=False) as response:
            assert response.status == 303
            cookie = response.cookies["fairpost_console"].value
        headers = {"Cookie": f"fairpost_console={cookie}"}
        for where in (base, other):
            async with http.get(where + "/tenants", headers=headers, allow_redirects=False) as response:
                assert response.status == 200
        session = Auth(settings).session_from_cookie(cookie)
        assert session is not None
        async with http.post(
            base + "/logout", data={"csrf": session.csrf}, headers=headers, allow_redirects=False
        ) as response:
            assert response.status == 303
        for where in (base, other):
            async with http.get(where + "/tenants", headers=headers, allow_redirects=False) as response:
                assert response.status == 302 and "/login" in response.headers["Location"]
            async with http.post(
                where + "/tenants/acme/pause", data={"csrf": session.csrf}, headers=headers
            ) as response:
                assert response.status == 401
        # A new login is a new session, not the old one back.
        async with http.post(base + "/login", data={"token": TOKEN}, allow_redirects=False) as response:
            assert response.cookies["fairpost_console"].value != cookie


async def test_wrong_tokens_are_slowed_logged_and_counted_and_the_right_one_still_works(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock()
    guard = Guard(clock=clock)
    settings = console_settings(redis_url)
    checked = announced = 0
    caplog.set_level(logging.WARNING, "fairpost.console")
    async with serve(settings, guard=guard) as base, aiohttp.ClientSession() as http:
        # 1,000 wrong tokens, half by the login form, half as Bearer, at 100 a second.
        for i in range(1000):
            clock.now += 0.01
            if i % 2:
                call = http.post(base + "/login", data={"token": f"wrong-{i:016d}"}, allow_redirects=False)
            else:
                call = http.get(base + "/tenants", headers={"Authorization": f"Bearer wrong-{i:016d}"})
            async with call as response:
                assert response.status in (401, 429), i
                if response.status == 401:
                    checked += 1  # its token was compared, and was wrong
                else:
                    announced += 1
                    assert float(response.headers["Retry-After"]) > 0
        # Ten seconds of guessing: a handful of tokens checked, not a thousand.
        assert checked <= Guard.FREE + 5, checked
        assert announced == 1000 - checked
        wait = guard.wait("127.0.0.1")
        assert 0 < wait <= Guard.MAX_DELAY
        # The right token waits its turn, like any other...
        async with http.get(base + "/tenants", headers=BEARER) as response:
            assert response.status == 429
        # ...and works once the announced delay has passed: slowed, never locked out.
        clock.now += wait
        async with http.get(base + "/tenants", headers=BEARER) as response:
            assert response.status == 200
        async with http.post(base + "/login", data={"token": TOKEN}, allow_redirects=False) as response:
            assert response.status == 303
        async with http.get(base + "/metrics", headers=BEARER) as response:
            metrics = await response.text()
    assert f'fairpost_console_auth_failures_total{{via="login"}} {float(checked // 2)}' in metrics
    assert f'fairpost_console_auth_failures_total{{via="bearer"}} {float(checked - checked // 2)}' in metrics
    assert f"fairpost_console_auth_throttled_total {float(announced + 1)}" in metrics
    failures = [r.getMessage() for r in caplog.records if "wrong token" in r.getMessage()]
    assert failures and all("127.0.0.1" in m for m in failures)
    assert any("Bearer" in m for m in failures) and any("login" in m for m in failures)
    assert all(TOKEN not in r.getMessage() and "wrong-0" not in r.getMessage() for r in caplog.records)


def test_the_guard_forgets_a_quiet_address_and_keys_ipv6_by_its_64() -> None:
    clock = Clock()
    guard = Guard(clock=clock)
    for _ in range(20):
        clock.now += guard.wait("2001:db8:1:2::5")  # each token once its wait is over
        guard.failed("2001:db8:1:2::5")
    assert guard.wait("2001:db8:1:2::ffff") > 0  # the same /64
    assert guard.wait("2001:db8:1:3::5") == 0.0
    assert guard.wait("192.0.2.7") == 0.0
    clock.now += Guard.FORGET_AFTER + 1
    assert guard.wait("2001:db8:1:2::5") == 0.0


def test_the_console_binds_localhost_unless_told_otherwise() -> None:
    assert load_settings().console.host == "127.0.0.1"
    assert load_settings(console={"host": "0.0.0.0"}).console.host == "0.0.0.0"


@pytest.mark.parametrize("prefix", ["", "/ops"])
async def test_a_tenant_named_dot_dot_is_linked_to_itself(redis_url: str, prefix: str) -> None:
    settings = console_settings(redis_url, prefix=prefix, write=True)
    mail = {"sender": "no-reply@acme.example", "to": ["ada@example.com"], "subject": "Hi", "text": "Hello"}
    with MailClient(settings) as client:
        for tenant in ("..", ".", "..."):
            client.send(tenant, **mail)  # type: ignore[arg-type]
    async with serve(settings) as base, aiohttp.ClientSession() as http:
        async with http.get(base + "/tenants", headers=BEARER) as response:
            listing = await response.text()
        for tenant in ("..", ".", "..."):
            [href] = [
                unescape(h)
                for h, text in re.findall(r'<a href="([^"]*)">([^<]*)</a>', listing)
                if unescape(text) == tenant
            ]
            # As a browser resolves it (dot segments too): the tenant's own page.
            target = urljoin(base + "/tenants", href)
            own = urlsplit(target).path
            assert own.startswith(prefix + "/tenants/") and own != prefix + "/tenants/", (tenant, href)
            async with http.get(target, headers=BEARER) as response:
                assert response.status == 200, (tenant, href)
                page = await response.text()
            assert f"<h1>Tenant {tenant}</h1>" in page
            # Its forms post to it too: pausing it pauses this tenant, not another.
            actions = [unescape(a) for a in re.findall(r'<form[^>]*action="([^"]*/tenants/[^"]*)"', page)]
            assert actions and all(urlsplit(urljoin(target, a)).path.startswith(own + "/") for a in actions)
