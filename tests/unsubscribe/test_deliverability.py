"""Every recorded unsubscribe feeds the deliverability rollups' ``unsubscribed`` counter
(#44's ``fairpost analytics``, the console's charts), whichever way it came: the
one-click link, the ``mailto:`` address, or the SDK and CLI; an unsubscribe that
changed nothing (a second click) is not counted again, nor is a re-subscription."""

from __future__ import annotations

import time

import aiohttp
import redis.asyncio

from fairpost.config import Settings
from fairpost.mailer.sdk.rollups import Deliverability
from fairpost.mailer.sdk.unsub_token import Token, sign
from fairpost.mailer.sdk.unsubscribes import Unsubscribes
from fairpost.mailer.testing.ses_publishing import received_record, wrap
from tests.unsubscribe.support import KEY, MAILTO_DOMAIN, unsubscribe_settings
from tests.unsubscribe.test_mailto import consumer
from tests.unsubscribe.test_server import ONE_CLICK, serving

GMAIL = "ann@gmail.com"
OTHER = "bo@example.org"


def signed(address: str, topic: str = "comments") -> str:
    return sign(Token("acme", address, topic, int(time.time()) + 3600), KEY.encode())


def unsubscribed(settings: Settings) -> dict[str, int]:
    """Today's ``unsubscribed`` count of tenant acme, by provider."""
    with Deliverability(settings) as book:
        report = book.report("acme", days=1)
    return {p.provider: p.counts["unsubscribed"] for p in report.providers if p.counts["unsubscribed"]}


async def click(settings: Settings, client: redis.asyncio.Redis, token: str, body: str) -> None:
    async with (
        serving(settings, client) as url,
        aiohttp.ClientSession() as http,
        http.post(f"{url}/u/{token}", data=body, headers=ONE_CLICK) as done,
    ):
        assert done.status == 200


async def test_each_recorded_unsubscribe_is_counted_once_at_its_provider(
    redis_url: str, aredis: redis.asyncio.Redis
) -> None:
    settings = unsubscribe_settings(redis_url, events_queue_name="events")
    # The link: a second click changes nothing and is not counted again.
    await click(settings, aredis, signed(GMAIL), "List-Unsubscribe=One-Click")
    await click(settings, aredis, signed(GMAIL), "List-Unsubscribe=One-Click")
    assert unsubscribed(settings) == {"gmail": 1}
    # Every topic, later: a second unsubscribe of its own (its own event in the feed).
    await click(settings, aredis, signed(GMAIL), "List-Unsubscribe=One-Click&scope=tenant")
    assert unsubscribed(settings) == {"gmail": 2}

    # The mailto: address, through the SES event consumer.
    to = f"u-{signed(OTHER, 'digest')}@{MAILTO_DOMAIN}"
    assert await consumer(settings, aredis).handle(wrap(received_record(OTHER, [to]), "sns")) == "received"
    assert unsubscribed(settings) == {"gmail": 2, "other": 1}

    # The SDK (and so the CLI): counted when it unsubscribes, not when it changes nothing
    # nor when it takes an unsubscribe back.
    with Unsubscribes(settings) as unsubscribes:
        assert unsubscribes.add("acme", "cy@gmail.com", "digest")
        assert not unsubscribes.add("acme", "cy@gmail.com", "digest")
        assert unsubscribes.remove("acme", "cy@gmail.com", "digest")
    assert unsubscribed(settings) == {"gmail": 3, "other": 1}


async def test_with_the_rollups_off_an_unsubscribe_is_recorded_and_not_counted(
    redis_url: str, aredis: redis.asyncio.Redis
) -> None:
    settings = unsubscribe_settings(redis_url, deliverability={"enabled": False})
    await click(settings, aredis, signed(GMAIL), "List-Unsubscribe=One-Click")
    with Unsubscribes(settings) as unsubscribes:
        assert unsubscribes.add("acme", OTHER)
        assert [u.address for u in unsubscribes.list("acme")] == [GMAIL, OTHER]
    assert unsubscribed(settings) == {}
