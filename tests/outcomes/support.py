"""What the outcome tests share: reading the feed as it is in Redis."""

from __future__ import annotations

from typing import Any

import redis
import redis.asyncio

from fairpost.mailer.sdk.keys import MailKeys
from fairpost.mailer.sdk.outcomes.feed import Outcome, from_entry


async def feed_of(client: redis.asyncio.Redis, keys: MailKeys) -> list[Outcome]:
    """Every event in the feed, oldest first (entries that are no event left out)."""
    entries: Any = await client.xrange(keys.outcomes())
    return [e for e in (from_entry(i, f) for i, f in entries) if e is not None]


def feed_now(client: redis.Redis, keys: MailKeys) -> list[Outcome]:
    entries: Any = client.xrange(keys.outcomes())
    return [e for e in (from_entry(i, f) for i, f in entries) if e is not None]
