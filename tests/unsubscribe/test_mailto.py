"""The ``mailto:`` unsubscribe (issue #42): SES receives the mail (a receipt rule's SNS
action into the events queue fairpost reads), and the token in the address it was
sent to unsubscribes at once; any other address, or a bad token, changes nothing.

The real :class:`EventConsumer` acts on the bodies against a real redis-server (no
SQS: ``handle`` is what a received message goes through); the bodies are SNS's as
the SES developer guide documents them (mailer/testing/ses_tenancy.py)."""

from __future__ import annotations

import time
from typing import Any, cast

import pytest
import redis.asyncio

from fairpost.config import Settings
from fairpost.mailer.daemon.events import EventConsumer
from fairpost.mailer.daemon.metrics import Metrics
from fairpost.mailer.quota.reputation import ReputationBook
from fairpost.mailer.sdk.keys import MailKeys
from fairpost.mailer.sdk.unsub_token import Token, sign
from fairpost.mailer.sdk.unsubscribes import Unsubscribes
from fairpost.mailer.testing.ses_publishing import received_record, wrap
from tests.outcomes.support import feed_of
from tests.unsubscribe.support import KEY, MAILTO_DOMAIN, unsubscribe_settings

ADA = "ada@example.org"


@pytest.fixture
def settings(redis_url: str) -> Settings:
    return unsubscribe_settings(redis_url, events_queue_name="events")


def consumer(settings: Settings, client: redis.asyncio.Redis) -> EventConsumer:
    keys = MailKeys(settings.key_prefix)
    return EventConsumer(
        sqs=cast(Any, None), queue_url="", client=client, keys=keys, settings=settings,
        book=ReputationBook(client, keys, settings), metrics=Metrics(),
    )  # fmt: skip


def address(key: str = KEY, expires_in: int = 3600, domain: str = MAILTO_DOMAIN) -> str:
    token = sign(Token("acme", ADA, "digest", int(time.time()) + expires_in), key.encode())
    return f"u-{token}@{domain}"


def listed(settings: Settings) -> list[tuple[str, tuple[str, ...], str]]:
    with Unsubscribes(settings) as unsubscribes:
        return [(u.address, u.topics, u.source) for u in unsubscribes.list("acme")]


async def test_mail_to_the_unsubscribe_address_unsubscribes_at_once(
    settings: Settings, aredis: redis.asyncio.Redis
) -> None:
    events = consumer(settings, aredis)
    # As a mailbox provider sends it: to the address in List-Unsubscribe, whose case it may change.
    body = wrap(received_record(ADA, [address().upper()]), "sns")
    assert await events.handle(body) == "received"
    assert listed(settings) == [(ADA, ("digest",), "mailto")]
    [event] = [e for e in await feed_of(aredis, MailKeys()) if e.type == "recipient.unsubscribed"]
    assert (event.tenant, event.data["recipient"], event.data["source"]) == ("acme", ADA, "mailto")
    # SQS delivers it again: acted on once.
    assert await events.handle(body) == "duplicate"


@pytest.mark.parametrize(
    "to",
    [
        # Named: a token holds its expiry, so its text differs between xdist workers.
        pytest.param(address(key="x" * 40), id="forged"),
        pytest.param(address(expires_in=-5), id="expired"),
        pytest.param(address(domain="elsewhere.example"), id="not-the-unsubscribe-domain"),
        pytest.param(f"u-nottoken@{MAILTO_DOMAIN}", id="not-a-token"),
        pytest.param(f"support@{MAILTO_DOMAIN}", id="another-mailbox"),
    ],
)
async def test_other_mail_changes_nothing(settings: Settings, aredis: redis.asyncio.Redis, to: str) -> None:
    assert await consumer(settings, aredis).handle(wrap(received_record(ADA, [to]), "sns")) == "ignored"
    assert listed(settings) == []
    assert await feed_of(aredis, MailKeys()) == []
