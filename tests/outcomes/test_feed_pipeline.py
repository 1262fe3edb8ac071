"""Every outcome of a mail reaches the feed, from the real pipeline: SDK → Redis →
dispatcher → SQS (moto) → sender → the recording SES, and SES's events back through
the events queue (SNS-wrapped) to the event consumer.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator

import boto3
import pytest

from fairpost import AsyncMailClient, Suppressions
from fairpost.config import Settings
from fairpost.mailer.ops.queue_setup import init_events_queue
from fairpost.mailer.sdk.keys import MailKeys
from fairpost.mailer.sdk.outcomes.feed import Outcome
from fairpost.mailer.testing.ses_publishing import EventSink
from fairpost.mailer.testing.ses_server import Faults, SesServer
from fairpost.mailer.testing.wait import wait_for_async
from tests.outcomes.support import feed_of
from tests.support.pipeline import Running, pipeline, quick_settings

EVENTS_QUEUE = "fairpost-events"
KEYS = MailKeys()


@pytest.fixture
def settings(redis_url: str) -> Settings:
    return quick_settings(redis_url, events_queue_name=EVENTS_QUEUE)


@pytest.fixture
def events(ses_env: SesServer, settings: Settings) -> Iterator[EventSink]:
    """SES publishes its events to the events queue, as SNS delivers them."""
    sqs = boto3.client("sqs")
    url, _ = init_events_queue(sqs, settings)
    sink = EventSink(sqs, url, envelope="sns")
    ses_env.events = sink
    yield sink
    sink.close()


def mail(*to: str, key: str | None = None) -> dict[str, object]:
    return {"sender": "app@example.com", "to": list(to), "subject": "s", "text": "t", "idempotency_key": key}


async def of_job(run: Running, job_id: str) -> list[Outcome]:
    return [e for e in await feed_of(run.store.redis, KEYS) if e.job_id == job_id]


async def test_sent_suppressed_and_ses_events_reach_the_feed_in_order(
    settings: Settings, ses: SesServer, events: EventSink
) -> None:
    with Suppressions(settings) as lists:
        lists.add("acme", "gone@example.org")
    async with pipeline(settings, reputation=True) as run, AsyncMailClient(settings) as client:
        [sent, suppressed, partial] = await client.send_many(
            "acme",
            [
                mail("ada@example.org", key="order-1"),
                mail("gone@example.org"),
                mail("bo@example.org", "gone@example.org"),
            ],
        )
        for job_id, state in ((sent, "sent"), (suppressed, "suppressed"), (partial, "sent")):
            await wait_for_async(_state_is(client, job_id, state), within=20, what=f"{job_id} {state}")
        status = await client.status(sent)
        assert status.ses_message_id is not None
        ses.emit("Delivery", status.ses_message_id)
        ses.emit("Bounce", status.ses_message_id)
        await wait_for_async(lambda: _has(run, sent, 3), within=20, what="the SES events in the feed")

        [was_sent, delivered, bounced] = await of_job(run, sent)
        assert [e.type for e in (was_sent, delivered, bounced)] == [
            "mail.sent",
            "mail.delivered",
            "mail.bounced",
        ]
        assert was_sent.data["ses_message_id"] == status.ses_message_id
        assert was_sent.data["recipients"] == ["ada@example.org"]
        assert was_sent.data["idempotency_key"] == "order-1" and was_sent.tenant == "acme"
        assert bounced.data["bounce_type"] == "Permanent"
        assert bounced.data["recipients"] == ["ada@example.org"]
        assert bounced.data["ses_message_id"] == status.ses_message_id
        assert delivered.timestamp <= bounced.timestamp and was_sent.id < delivered.id < bounced.id

        [dropped] = await of_job(run, suppressed)
        assert dropped.type == "mail.suppressed"
        assert dropped.data["recipients"] == ["gone@example.org"] and dropped.data["partial"] is False
        # A mail that lost some recipients is sent to the rest, after saying so.
        assert [e.type for e in await of_job(run, partial)] == ["mail.suppressed", "mail.sent"]
        [some, rest] = await of_job(run, partial)
        assert some.data["partial"] is True and rest.data["recipients"] == ["bo@example.org"]


async def test_a_mail_ses_refuses_is_mail_dead_with_the_reason(
    settings: Settings, ses: SesServer, events: EventSink
) -> None:
    ses.fail_next(1, Faults.BAD_REQUEST)
    async with pipeline(settings, reputation=True) as run, AsyncMailClient(settings) as client:
        job_id = await client.send("acme", **mail("ada@example.org"))  # type: ignore[arg-type]
        await wait_for_async(lambda: _has(run, job_id, 1), within=20, what="the dead letter's event")
        [dead] = await of_job(run, job_id)
        status = await client.status(job_id)
    assert dead.type == "mail.dead"
    assert dead.data["reason"] == status.dead_reason and Faults.BAD_REQUEST.code in dead.data["reason"]


def _state_is(client: AsyncMailClient, job_id: str, state: str) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return (await client.status(job_id)).state == state

    return check


async def _has(run: Running, job_id: str, count: int) -> bool:
    return len(await of_job(run, job_id)) >= count
