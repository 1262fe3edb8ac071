"""What SES events leave in Redis: the outcome a job shows, and keys that go away.

The real :class:`EventConsumer` acts on event bodies against a real redis-server
(no SQS: ``handle`` is what a received message goes through); the reputation
counters are written by the real scripts, as the sender's record of a sent mail
and a bounce write them.
"""

from __future__ import annotations

import json
from typing import Any, cast

import pytest
import redis.asyncio

from fairpost.config import Settings
from fairpost.dispatcher.store import JobStore, store_limits
from fairpost.mailer.daemon.events import EventConsumer
from fairpost.mailer.daemon.feedback import Feedback
from fairpost.mailer.daemon.metrics import Metrics
from fairpost.mailer.quota.reputation import ReputationBook
from fairpost.mailer.sdk.keys import MailKeys
from fairpost.mailer.testing.ses_publishing import ses_event, wrap
from fairpost.mailer.testing.ses_server import SentMail
from tests.support.pipeline import quick_settings

JOB = "job-1"
MESSAGE_ID = "0100018c-aaaa-000000"


@pytest.fixture
def settings(redis_url: str) -> Settings:
    return quick_settings(redis_url, events_queue_name="events")


def consumer(settings: Settings, client: redis.asyncio.Redis) -> EventConsumer:
    keys = MailKeys(settings.key_prefix)
    return EventConsumer(
        sqs=cast(Any, None),  # handle() reads no queue
        queue_url="",
        client=client,
        keys=keys,
        settings=settings,
        book=ReputationBook(client, keys, settings),
        metrics=Metrics(),
    )


def event(kind: str, event_id: str) -> str:
    mail = SentMail(message_id=MESSAGE_ID, from_address="app@example.com", to=("a@example.org",))
    record = ses_event(kind, mail, ["a@example.org"])
    body = json.loads(wrap(record, "sns"))
    body["MessageId"] = event_id  # each delivery its own event
    return json.dumps(body)


async def sent_job(client: redis.asyncio.Redis, keys: MailKeys) -> None:
    await client.set(keys.ses_message(MESSAGE_ID), JOB)
    await client.hset(keys.job(JOB), mapping={"tenant": "acme", "state": "sent"})


async def test_a_mail_delayed_then_delivered_shows_delivered(
    settings: Settings, aredis: redis.asyncio.Redis
) -> None:
    keys = MailKeys(settings.key_prefix)
    await sent_job(aredis, keys)
    events = consumer(settings, aredis)
    assert await events.handle(event("DeliveryDelay", "e-1")) == "delivery_delay"
    assert await aredis.hget(keys.job(JOB), "delivery") == "delayed"
    assert await events.handle(event("Delivery", "e-2")) == "delivery"
    assert await aredis.hget(keys.job(JOB), "delivery") == "delivered"


async def test_a_delay_reported_after_the_delivery_does_not_undo_it(
    settings: Settings, aredis: redis.asyncio.Redis
) -> None:
    # SNS and SQS keep no order: the delay may arrive last.
    keys = MailKeys(settings.key_prefix)
    await sent_job(aredis, keys)
    events = consumer(settings, aredis)
    await events.handle(event("Delivery", "e-1"))
    await events.handle(event("DeliveryDelay", "e-2"))
    assert await aredis.hget(keys.job(JOB), "delivery") == "delivered"


async def test_a_bounce_still_outranks_a_delivery(settings: Settings, aredis: redis.asyncio.Redis) -> None:
    keys = MailKeys(settings.key_prefix)
    await sent_job(aredis, keys)
    events = consumer(settings, aredis)
    await events.handle(event("Bounce", "e-1"))
    await events.handle(event("Delivery", "e-2"))
    assert await aredis.hget(keys.job(JOB), "delivery") == "bounced"


async def test_a_tenants_send_numbers_and_recent_bounces_expire_with_its_mail(
    settings: Settings, aredis: redis.asyncio.Redis
) -> None:
    # Past job_ttl no event can find its mail (its SES message id is gone too), so
    # numbers kept for a tenant that stopped sending would only pile up.
    keys = MailKeys(settings.key_prefix)
    await sent_job(aredis, keys)
    store = JobStore(aredis, keys, store_limits(settings))
    feedback = Feedback(store=store, settings=settings, book=ReputationBook(aredis, keys, settings))
    async with aredis.pipeline(transaction=True) as pipe:
        await feedback.index_sent(pipe, "acme", [(JOB, MESSAGE_ID, 3)])
        await pipe.execute()
    await consumer(settings, aredis).handle(event("Bounce", "e-1"))
    job_ttl_ms = settings.job_ttl * 1000
    for key in (keys.send_seq("acme"), keys.recent_bounces("acme"), keys.ses_message(MESSAGE_ID)):
        ttl = await aredis.pttl(key)
        assert 0 < ttl <= job_ttl_ms, f"{key}: {ttl}"


async def test_a_groups_sends_are_numbered_in_order_and_indexed_in_one_call(
    settings: Settings, aredis: redis.asyncio.Redis
) -> None:
    keys = MailKeys(settings.key_prefix)
    await aredis.set(keys.send_seq("acme"), 10)  # the tenant's earlier sends
    for job in ("j-1", "j-3"):
        await aredis.hset(keys.job(job), mapping={"tenant": "acme", "state": "sent"})
    store = JobStore(aredis, keys, store_limits(settings))
    feedback = Feedback(store=store, settings=settings, book=ReputationBook(aredis, keys, settings))
    # j-2 has no record any more (purged): numbered and indexed all the same.
    sent: list[tuple[str, str | None, int]] = [("j-1", "m-1", 2), ("j-2", "m-2", 1), ("j-3", "m-3", 4)]
    async with aredis.pipeline(transaction=False) as pipe:
        await feedback.index_sent(pipe, "acme", [*sent, ("j-4", None, 5)])  # j-4: no message id
        assert len(pipe.command_stack) == 1, "one script call for the group"
        assert await pipe.execute() == [[12, 13, 17]]
    assert await aredis.get(keys.send_seq("acme")) == "17"
    assert await aredis.hget(keys.job("j-1"), "send_seq") == "12"
    assert await aredis.hget(keys.job("j-3"), "send_seq") == "17"
    assert not await aredis.exists(keys.job("j-2"))
    assert [await aredis.get(keys.ses_message(m)) for m in ("m-1", "m-2", "m-3")] == ["j-1", "j-2", "j-3"]
    ttl = await aredis.ttl(keys.ses_message("m-2"))
    assert 0 < ttl <= settings.job_ttl
