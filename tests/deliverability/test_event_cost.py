"""What the rollups add to an SES event's Redis work: one script call, in the step
that records the outcome, and nothing when they are off. Counted in Redis commands
(``INFO commandstats``), never timed."""

from __future__ import annotations

from typing import Any

import redis.asyncio

from fairpost.config import load_settings
from fairpost.mailer.daemon.deliverability import DeliverabilityCounter
from fairpost.mailer.daemon.events import EventConsumer
from fairpost.mailer.daemon.metrics import Metrics
from fairpost.mailer.quota.reputation import ReputationBook
from fairpost.mailer.sdk.keys import MailKeys
from fairpost.mailer.testing.ses_mail import SentMail
from fairpost.mailer.testing.ses_publishing import ses_event, wrap
from tests.support.deliverability import FakeDns


async def calls(client: redis.asyncio.Redis) -> dict[str, int]:
    stats: dict[str, Any] = await client.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}


async def handle_one(aredis: redis.asyncio.Redis, redis_url: str, enabled: bool, n: int) -> dict[str, int]:
    """The commands one Delivery event for two recipients took; the mail's record as the sender left it."""
    settings = load_settings(redis_url=redis_url, deliverability={"enabled": enabled})
    keys, metrics = MailKeys(settings.key_prefix), Metrics()
    consumer = EventConsumer(
        sqs=None,  # handle() reads no queue
        queue_url="", client=aredis, keys=keys, settings=settings,
        book=ReputationBook(aredis, keys, settings), metrics=metrics,
        deliverability=DeliverabilityCounter(
            aredis, keys, settings, metrics.deliverability, lookup=FakeDns()
        ),
    )  # fmt: skip
    mail = SentMail(message_id=f"m-{n}", from_address="app@example.com", to=("a@gmail.com", "b@m365.example"))
    await aredis.set(keys.ses_message(mail.message_id), f"job-{n}")
    await aredis.hset(keys.job(f"job-{n}"), mapping={"tenant": "acme", "state": "sent"})
    await consumer.handle(wrap(ses_event("Delivery", mail, mail.to), "sns"))  # warms the MX cache
    await consumer.handle(wrap(ses_event("Delivery", mail, mail.to), "sns"))  # a second one: a duplicate
    before = await calls(aredis)
    again = SentMail(message_id=f"m-{n}", from_address="app@example.com", to=mail.to)
    assert await consumer.handle(wrap(ses_event("Delivery", again, again.to), "raw")) == "delivery"
    after = await calls(aredis)
    return {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}


async def test_an_events_count_is_one_script_call_and_none_when_off(
    aredis: redis.asyncio.Redis, redis_url: str
) -> None:
    off = await handle_one(aredis, redis_url, False, 1)
    on = await handle_one(aredis, redis_url, True, 2)
    assert on.pop("evalsha") == off.pop("evalsha") + 1
    # What the script itself runs: Redis's clock, one HINCRBY a (provider, counter); no
    # TTL look, for the day's hash held these counts already (its TTL is set by the
    # call that makes it); the rest as before.
    assert on.pop("time") == off.pop("time") + 1
    assert on.pop("hincrby") == off.pop("hincrby") + 2 and "ttl" not in on
    # Every script opens with a write that adds nothing (WRITES_FIRST, so a full Redis
    # still runs it): one DEL of a key that does not exist.
    assert on.pop("del") == off.pop("del") + 1
    assert on == off
