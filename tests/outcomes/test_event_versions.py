"""Outcome events say their format version (#38): an entry a newer fairpost wrote is
left for a newer reader, by the webhooks' fan-out and by the SDK's group readers,
never passed over or acknowledged."""

from __future__ import annotations

from typing import Any

import pytest
import redis.asyncio
from prometheus_client import CollectorRegistry

from fairpost import MailClient
from fairpost.config import Settings
from fairpost.mailer.daemon.webhooks.loop import WebhookDeliveries
from fairpost.mailer.daemon.webhooks.metrics import WebhookMetrics
from fairpost.mailer.errors import NewerFormat
from fairpost.mailer.sdk.keys import MailKeys
from fairpost.mailer.sdk.outcomes import feed
from tests.outcomes.conftest import hook_settings
from tests.outcomes.receiver import Receiver
from tests.outcomes.test_webhooks import endpoint, write

KEYS = MailKeys()
NEWER = {"job": "j-new", "type": feed.SENT, "tenant": "acme", "v": "2", "data": "{}"}


def test_an_entry_without_a_version_is_version_1_and_a_newer_one_is_refused() -> None:
    assert feed.from_entry("1-0", {"job": "j", "type": feed.SENT, "tenant": "acme"}) is not None
    assert feed.from_entry("1-0", {"job": "j", "type": feed.SENT, "v": "1", "later": "x"}) is not None
    with pytest.raises(
        NewerFormat, match="outcome_event in format version 2; this fairpost reads up to version 1"
    ):
        feed.from_entry("2-0", NEWER)
    events, last, newer = feed.readable(
        [("1-0", {"job": "a", "type": feed.SENT}), ("2-0", NEWER), ("3-0", {})]
    )
    assert ([e.job_id for e in events], last, newer is not None) == (["a"], "1-0", True)


async def test_the_fan_out_stops_before_an_event_a_newer_fairpost_wrote(
    redis_url: str, aredis: redis.asyncio.Redis, receiver: Receiver
) -> None:
    settings = hook_settings(redis_url)
    endpoint(settings, receiver, "acme", "/hook")
    for job_id in ("j1", "j2"):
        await write(settings, aredis, "acme", job_id, feed.SENT)
    await aredis.xadd(KEYS.outcomes(), NEWER)  # type: ignore[arg-type]
    await write(settings, aredis, "acme", "j3", feed.SENT)
    told: list[tuple[str, int, int]] = []
    fanout = WebhookDeliveries(
        aredis, KEYS, settings, WebhookMetrics(CollectorRegistry()), on_newer=lambda *a: told.append(a)
    )
    entries: Any = await aredis.xrange(KEYS.outcomes())
    assert await fanout.fanout_once(block_ms=1) == 2
    assert await aredis.get(KEYS.webhook_cursor()) == entries[1][0]
    # Again: it waits there, for a newer replica's fan-out to go on past it.
    assert await fanout.fanout_once(block_ms=1) == 0
    assert await aredis.get(KEYS.webhook_cursor()) == entries[1][0]
    assert told == [("outcome_event", 2, 1)] * 2


async def test_a_group_reader_leaves_a_newer_event_pending_for_a_newer_reader(
    settings: Settings, client: MailClient, aredis: redis.asyncio.Redis
) -> None:
    hooks = hook_settings(settings.redis_url)
    await write(hooks, aredis, "acme", "j1", feed.SENT)
    newer_id = await aredis.xadd(KEYS.outcomes(), NEWER)  # type: ignore[arg-type]
    await write(hooks, aredis, "acme", "j2", feed.SENT)
    seen = []
    for event in client.events(group="billing", consumer="w1", block=False):
        seen.append(event.job_id)
        event.ack()
    assert seen == ["j1", "j2"]
    pending: Any = await aredis.xpending_range(KEYS.outcomes(), "billing", "-", "+", 10)
    assert [p["message_id"] for p in pending] == [newer_id]
