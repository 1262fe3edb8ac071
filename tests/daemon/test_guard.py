"""The reputation guard and the suppression lists against a real Redis (no AWS)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest
import redis
import redis.asyncio

from fairpost.config import Settings, load_settings
from fairpost.config.limits import format_limits, parse_limits
from fairpost.mailer.cli import main
from fairpost.mailer.daemon.ses import send_email_request
from fairpost.mailer.errors import InvalidSuppression
from fairpost.mailer.quota.admin import QuotaAdmin
from fairpost.mailer.quota.reputation import GuardState, ReputationBook, lift_guard, throttled
from fairpost.mailer.sdk.envelope import Envelope
from fairpost.mailer.sdk.keys import MailKeys
from fairpost.mailer.sdk.mail import Mail, validate
from fairpost.mailer.sdk.suppression import Suppressions

KEYS = MailKeys()


@pytest.fixture
def settings(redis_url: str) -> Settings:
    return load_settings(redis_url=redis_url, reputation={"throttle_limits": "3/second"})


@pytest.fixture
async def book(settings: Settings) -> AsyncIterator[ReputationBook]:
    """The reputation book on an asyncio client of its own, as the daemon has."""
    async with redis.asyncio.Redis.from_url(settings.redis_url) as client:
        yield ReputationBook(client, KEYS, settings)


def guard(client: redis.Redis, tenant: str) -> GuardState | None:
    return GuardState.from_json(client.hget(KEYS.guard(), tenant))


async def test_the_guard_throttles_at_half_the_threshold_then_pauses_at_it(
    book: ReputationBook, redis_client: redis.Redis
) -> None:
    await book.record("bouncy", sends=100)
    # 3 bounces in 100 sends weigh as 3 in 200 (1.5 %): nothing yet.
    await book.record("bouncy", bounces=3)
    assert guard(redis_client, "bouncy") is None
    await book.record("bouncy", bounces=1)  # 4 of 200: 2 %, half the 4 % threshold
    state = guard(redis_client, "bouncy")
    # Its own limits (the default 5/second; 10000/day) with the throttle's lower rate.
    assert state is not None and state.level == "throttled" and state.override == "3/second; 10000/day"
    assert redis_client.hget(KEYS.limit_overrides(), "t:bouncy") == "3/second; 10000/day"
    assert not redis_client.sismember(KEYS.paused(), "bouncy")
    rep = await book.record("bouncy", bounces=4)  # 8 of 200: 4 %
    state = guard(redis_client, "bouncy")
    assert state is not None and state.level == "paused", state
    assert "8 of 100 sends, counted as 200" in state.reason
    assert redis_client.sismember(KEYS.paused(), "bouncy")
    assert rep.window(86_400) is not None
    # Other tenants are untouched.
    await book.record("good", sends=50, bounces=0)
    assert guard(redis_client, "good") is None


async def test_a_list_gone_bad_after_a_good_day_is_paused_by_its_last_200_sends(
    book: ReputationBook, redis_client: redis.Redis
) -> None:
    await book.record("acme", sends=1000)  # a good day: 1,000 sends, no bounce
    redis_client.set(KEYS.send_seq("acme"), 1000)  # what the sender numbered
    for i in range(7):
        await book.record("acme", bounces=1, bounced=(f"job{i}", 990 + i))
    state = guard(redis_client, "acme")
    assert state is not None and state.level == "throttled", state  # 7 of the last 200: 3.5 %
    rep = await book.record("acme", bounces=1, bounced=("job7", 999))
    state = guard(redis_client, "acme")
    assert state is not None and state.level == "paused", state  # 8 of the last 200: 4 %
    assert rep.recent_bounces == 8 and "last 200 sends" in state.reason
    assert (state.window, state.bounce_rate) == ("last 200 sends", 0.04)
    # Over the day it is only 8 in 1,000 (0.8 %): the windows alone would have waited.
    window = rep.window(86_400)
    assert window is not None and window.bounce_rate < 0.01
    # The same event again adds nothing to the last-sends count.
    rep = await book.record("acme", bounces=1, bounced=("job7", 999))
    assert rep.recent_bounces == 8


async def test_a_throttle_from_the_last_sends_holds_while_they_stay_bad(
    book: ReputationBook, redis_client: redis.Redis
) -> None:
    await book.record("acme", sends=1000)
    redis_client.set(KEYS.send_seq("acme"), 1000)
    for i in range(5):
        await book.record("acme", bounces=1, bounced=(f"job{i}", 995 + i))
    assert (state := guard(redis_client, "acme")) is not None and state.level == "throttled"
    # More sends: the day's windows say all is well, the last 200 sends do not.
    redis_client.incrby(KEYS.send_seq("acme"), 10)
    await book.record("acme", sends=10)
    assert (state := guard(redis_client, "acme")) is not None and state.level == "throttled"
    # 200 clean sends later the bounces have left the last 200: the throttle lifts.
    redis_client.incrby(KEYS.send_seq("acme"), 200)
    await book.record("acme", sends=200)
    assert guard(redis_client, "acme") is None


async def test_an_operators_resume_lifts_the_guard_which_then_judges_only_what_follows(
    settings: Settings, book: ReputationBook, redis_client: redis.Redis
) -> None:
    await book.record("bouncy", sends=100)
    await book.record("bouncy", bounces=9)
    assert (state := guard(redis_client, "bouncy")) is not None and state.level == "paused"
    with QuotaAdmin(settings) as admin:
        assert admin.resume("bouncy")
    assert guard(redis_client, "bouncy") is None
    assert not redis_client.sismember(KEYS.paused(), "bouncy")
    assert redis_client.hget(KEYS.limit_overrides(), "t:bouncy") is None  # the guard's throttle went too
    # The stats still see the whole window; the guard only what came after the lift.
    rep = await book.record("bouncy", sends=10, bounces=1)
    window = rep.window(86_400)
    assert window is not None and (window.bounces, window.judged_bounces) == (10, 1)
    assert guard(redis_client, "bouncy") is None


async def test_an_operators_own_override_is_never_replaced_by_the_guards_throttle(
    settings: Settings, book: ReputationBook, redis_client: redis.Redis
) -> None:
    with QuotaAdmin(settings) as admin:
        admin.set_tenant_limits("acme", "7/second")
    await book.record("acme", sends=200, bounces=5)
    state = guard(redis_client, "acme")
    assert state is not None and state.level == "throttled" and state.override is None
    assert redis_client.hget(KEYS.limit_overrides(), "t:acme") == "7/second"
    assert lift_guard(redis_client, KEYS, "acme") is not None
    assert redis_client.hget(KEYS.limit_overrides(), "t:acme") == "7/second"


async def test_a_throttle_lifts_by_itself_when_the_rates_fall_back(
    book: ReputationBook, redis_client: redis.Redis
) -> None:
    await book.record("acme", sends=200, bounces=5)  # 2.5 %: throttled
    assert guard(redis_client, "acme") is not None
    await book.record("acme", sends=200)  # 5 of 400: 1.25 %
    assert guard(redis_client, "acme") is None
    assert redis_client.hget(KEYS.limit_overrides(), "t:acme") is None


# -- suppression lists ----------------------------------------------------------------------


def test_a_throttle_only_ever_lowers_a_tenants_limits() -> None:
    own = parse_limits("2/second; 500/day")
    assert format_limits(throttled(own, parse_limits("3/second"))) == "2/second; 500/day"
    assert (
        format_limits(throttled(own, parse_limits("1/second; 60/minute"))) == "1/second; 60/minute; 500/day"
    )


def test_suppression_admin_adds_lists_removes_and_refuses_bad_input(settings: Settings) -> None:
    with Suppressions(settings) as lists:
        assert lists.add("acme", "Ada <Ada@Example.org>")
        assert not lists.add("acme", "ada@example.org")  # already, whatever the case
        assert [(e.address, e.reason) for e in lists.list("acme")] == [("ada@example.org", "manual")]
        assert lists.list("globex") == []
        with pytest.raises(InvalidSuppression) as bad:
            lists.add("acme", "not an address")
        assert bad.value.field == "address" and "not an address" not in str(bad.value)
        with pytest.raises(InvalidSuppression) as bad:
            lists.add("no/such", "a@example.org")
        assert bad.value.field == "tenant"
        assert lists.remove("acme", "ada@example.org")
        assert not lists.remove("acme", "ada@example.org")


def test_suppression_commands(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("FAIRPOST_REDIS_URL", settings.redis_url)
    assert main(["suppression", "add", "acme", "ada@example.org"]) == 0
    assert main(["suppression", "list", "acme", "--json"]) == 0
    out = capsys.readouterr().out
    listed = json.loads(out[out.index("{") :])
    assert [e["address"] for e in listed["suppressed"]] == ["ada@example.org"]
    assert main(["suppression", "remove", "acme", "ada@example.org"]) == 0
    with pytest.raises(SystemExit) as usage:
        main(["suppression", "add", "acme"])  # no address
    assert usage.value.code == 2


# -- SES tenant names on every send -----------------------------------------------------------


def test_every_send_names_the_tenants_ses_tenant(redis_url: str) -> None:
    mail, _ = validate(
        Mail(sender="a@example.com", to=["b@example.org"], subject="s", text="t"), max_bytes=10_000
    )
    env = Envelope(job_id="j1", tenant="eu.shop", created_ms=1, mail=mail)
    derived = load_settings(redis_url=redis_url, ses_tenant_names="tenant_id")
    assert send_email_request(env, derived.tenant("eu.shop"))["TenantName"] == "eu_2Eshop"
    own = load_settings(redis_url=redis_url, tenants={"eu.shop": {"ses_tenant_name": "shop"}})
    assert send_email_request(env, own.tenant("eu.shop"))["TenantName"] == "shop"
    assert "TenantName" not in send_email_request(env, load_settings(redis_url=redis_url).tenant("eu.shop"))
    assert parse_limits("3/second")  # the throttle limits parse as limits do


def test_the_mail_client_administers_suppressions_on_its_connection(settings: Settings) -> None:
    from fairpost import MailClient

    with MailClient(settings) as client:
        lists = client.suppressions()
        assert lists.add("acme", "ada@example.org")
        assert lists.is_suppressed("acme", "ADA@example.org")
        assert not lists.is_suppressed("globex", "ada@example.org")
