"""The webhook fan-out costs next to nothing where no endpoint is registered.

Every replica follows the outcome feed (mailer/daemon/webhooks/loop.py). With no
endpoint anywhere, its events go to nobody: the fan-out must pass them by without
reading them out of Redis (a mail's events are most of the feed's bytes, and an
application that never registers a webhook should not pay for them), and still
hand an endpoint registered later the events that follow it.
"""

from __future__ import annotations

from typing import Any

import redis.asyncio
from prometheus_client import CollectorRegistry

from fairpost.mailer.daemon.webhooks.loop import WebhookDeliveries
from fairpost.mailer.daemon.webhooks.metrics import WebhookMetrics
from fairpost.mailer.sdk.keys import MailKeys
from fairpost.mailer.sdk.outcomes import feed
from tests.outcomes.conftest import hook_settings
from tests.outcomes.receiver import Receiver
from tests.outcomes.test_webhooks import endpoint, write

KEYS = MailKeys()
EVENTS = 200


async def sent_bytes(client: redis.asyncio.Redis) -> int:
    return int((await client.info("stats"))["total_net_output_bytes"])


async def test_events_with_no_endpoint_anywhere_are_passed_by_unread(
    redis_url: str, aredis: redis.asyncio.Redis, receiver: Receiver
) -> None:
    settings = hook_settings(redis_url)
    for i in range(EVENTS):
        await write(settings, aredis, "acme", f"j{i}", feed.SENT)
    fanout = WebhookDeliveries(aredis, KEYS, settings, WebhookMetrics(CollectorRegistry()))
    one_event = len(str(await aredis.xrange(KEYS.outcomes(), count=1)))
    before = await sent_bytes(aredis)
    assert await fanout.fanout_once(block_ms=1) == 0
    read = await sent_bytes(aredis) - before
    # The cursor is past every event, and Redis sent far less than the events (its
    # INFO replies included), not all of them.
    newest: Any = await aredis.xrevrange(KEYS.outcomes(), count=1)
    assert await aredis.get(KEYS.webhook_cursor()) == newest[0][0]
    assert read < EVENTS * one_event / 4, f"{read} bytes read to pass {EVENTS} events of ~{one_event} bytes"
    # An endpoint registered now gets what follows, and nothing from before it.
    endpoint(settings, receiver, "acme", "/later")
    await write(settings, aredis, "acme", "after", feed.SENT)
    assert await fanout.fanout_once(block_ms=1) == 1
