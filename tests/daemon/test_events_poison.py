"""Poison on the events queue: one bad SES event never stops the events task.

The real :class:`EventConsumer` task reads moto's SQS: a poison body, then a good
event. Whatever the poison raises, it is dropped (logged, counted) and deleted,
the good event behind it is acted on, and the task lives on. A Redis outage is
not poison: the event stays in SQS to be read again.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import boto3
import pytest
import redis.asyncio
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError

from fairpost.config import Settings
from fairpost.mailer.daemon.aws import SQS_CONFIG, session
from fairpost.mailer.daemon.events import EventConsumer
from fairpost.mailer.daemon.metrics import Metrics
from fairpost.mailer.daemon.ses_events import parse_event
from fairpost.mailer.ops.queue_setup import init_events_queue
from fairpost.mailer.quota.reputation import ReputationBook
from fairpost.mailer.sdk.keys import MailKeys
from fairpost.mailer.testing.ses_publishing import ses_event, wrap
from fairpost.mailer.testing.ses_server import SentMail
from fairpost.mailer.testing.wait import wait_for_async as wait_for
from tests.support.pipeline import quick_settings

QUEUE = "fairpost-events-poison"
GOOD_MESSAGE_ID = "0100018c-good-000000"


def _event_with_message_id(message_id: str, kind: str = "Delivery", recipient: str = "a@example.org") -> str:
    mail = SentMail(message_id="placeholder", from_address="app@example.com", to=("a@example.org",))
    record = ses_event(kind, mail, [recipient])
    record["mail"]["messageId"] = message_id
    return json.dumps(record)  # ASCII: a lone surrogate travels as the escape \ud800


GOOD_EVENT = wrap(json.loads(_event_with_message_id(GOOD_MESSAGE_ID)), "sns")

POISON = {
    # The C JSON decoder recurses once per level: RecursionError, not ValueError.
    "deep_nesting": ("[" * 20_000, "poison"),
    # Decodes to a str Redis cannot encode (UTF-8 has no lone surrogates): refused as read.
    "surrogate_message_id": (_event_with_message_id("\ud800"), "unparseable"),
    "surrogate_in_sns_message": (
        json.dumps(
            {"Type": "Notification", "MessageId": "\ud800", "Message": _event_with_message_id("0100-x")}
        ),
        "unparseable",
    ),
    # Reads well; suppressing the address raises while acting on it.
    "surrogate_recipient": (_event_with_message_id("0100-bad", "Bounce", "\ud800@example.org"), "poison"),
}


@pytest.fixture
def events_queue(aws_env: str, redis_url: str) -> Iterator[tuple[Any, str, Settings]]:
    settings = quick_settings(redis_url, events_queue_name=QUEUE)
    sqs = boto3.client("sqs")
    url, _ = init_events_queue(sqs, settings)
    yield sqs, url, settings


@asynccontextmanager
async def consumer_task(
    settings: Settings, url: str, client: redis.asyncio.Redis
) -> AsyncIterator[tuple[EventConsumer, asyncio.Task[None]]]:
    keys = MailKeys(settings.key_prefix)
    async with session().client("sqs", config=SQS_CONFIG) as sqs:
        consumer = EventConsumer(
            sqs=sqs, queue_url=url, client=client, keys=keys, settings=settings,
            book=ReputationBook(client, keys, settings), metrics=Metrics(),
        )  # fmt: skip
        stop = asyncio.Event()
        task = asyncio.create_task(consumer.run(stop), name="events")
        try:
            yield consumer, task
        finally:
            stop.set()
            await asyncio.wait({task}, timeout=10)
            if not task.done():
                task.cancel()


def _left_in_queue(sqs: Any, url: str) -> int:
    attributes = sqs.get_queue_attributes(
        QueueUrl=url,
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )["Attributes"]
    return int(attributes["ApproximateNumberOfMessages"]) + int(
        attributes["ApproximateNumberOfMessagesNotVisible"]
    )


def _round_failed(consumer: EventConsumer, task: asyncio.Task[None]) -> bool:
    """The events task counted a failed round, and lives."""
    _alive(task)
    value = consumer.metrics.registry.get_sample_value("fairpost_task_errors_total", {"task": "events"})
    return (value or 0) >= 1


def _alive(task: asyncio.Task[None]) -> None:
    if task.done():
        raise AssertionError(f"the events task died: {task.exception()!r}")


@pytest.mark.parametrize("poison", sorted(POISON))
async def test_a_poison_event_is_deleted_and_the_next_event_is_acted_on(
    events_queue: tuple[Any, str, Settings], poison: str
) -> None:
    sqs, url, settings = events_queue
    keys = MailKeys(settings.key_prefix)
    client = redis.asyncio.Redis.from_url(settings.redis_url)
    try:
        await client.set(keys.ses_message(GOOD_MESSAGE_ID), "job-1")
        await client.hset(keys.job("job-1"), mapping={"tenant": "acme", "state": "sent"})
        await client.set(keys.ses_message("0100-bad"), "job-2")
        await client.hset(keys.job("job-2"), mapping={"tenant": "acme", "state": "sent"})
        body, outcome = POISON[poison]
        sqs.send_message(QueueUrl=url, MessageBody=body)
        sqs.send_message(QueueUrl=url, MessageBody=GOOD_EVENT)
        async with consumer_task(settings, url, client) as (consumer, task):

            async def good_event_acted_on_and_queue_empty() -> bool:
                _alive(task)
                delivery = await client.hget(keys.job("job-1"), "delivery")
                return delivery == b"delivered" and _left_in_queue(sqs, url) == 0

            await wait_for(
                good_event_acted_on_and_queue_empty, within=20, what="the good event, the poison deleted"
            )
            _alive(task)
            assert consumer.handled == {outcome: 1, "delivery": 1}
    finally:
        await client.aclose()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


async def test_an_event_read_while_redis_is_down_stays_in_sqs(
    events_queue: tuple[Any, str, Settings],
) -> None:
    sqs, url, settings = events_queue
    settings = settings.model_copy(update={"max_outage_seconds": 600.0})
    sqs.send_message(QueueUrl=url, MessageBody=GOOD_EVENT)
    # No retries of its own: the consumer's back-off is what is tested.
    down = redis.asyncio.Redis(host="127.0.0.1", port=_closed_port(), retry=Retry(NoBackoff(), 0))
    try:
        async with consumer_task(settings, url, down) as (consumer, task):
            await wait_for(lambda: _round_failed(consumer, task), within=20, what="a round to fail on Redis")
            _alive(task)
            assert _left_in_queue(sqs, url) == 1  # received, not deleted: SQS gives it back
            assert consumer.handled == {}
    finally:
        await down.aclose()


@pytest.mark.parametrize("poison", ["surrogate_message_id", "surrogate_in_sns_message"])
def test_an_event_whose_ids_are_not_ascii_is_refused_naming_the_rule(poison: str) -> None:
    with pytest.raises(ValueError, match="printable ASCII"):
        parse_event(POISON[poison][0])


def test_tags_that_could_not_name_a_key_are_ignored() -> None:
    record = json.loads(_event_with_message_id(GOOD_MESSAGE_ID))
    record["mail"]["tags"] = {"fairpost-job-id": ["job\ud800"], "fairpost-tenant": ["ac me"]}
    event = parse_event(json.dumps(record))
    assert (event.message_id, event.job_id, event.tenant) == (GOOD_MESSAGE_ID, None, None)


async def test_a_redis_blip_while_acting_on_an_event_leaves_it_in_sqs(
    events_queue: tuple[Any, str, Settings], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A bounce lost to a blip would be a suppression never made: a blip is not poison.
    sqs, url, settings = events_queue
    keys = MailKeys(settings.key_prefix)
    client = redis.asyncio.Redis.from_url(settings.redis_url)
    try:
        await client.set(keys.ses_message(GOOD_MESSAGE_ID), "job-1")
        await client.hset(keys.job("job-1"), mapping={"tenant": "acme", "state": "sent"})
        real_pipeline = client.pipeline
        blips: list[tuple[Any, ...]] = []

        async def reset(*args: Any, **kwargs: Any) -> Any:
            raise RedisConnectionError("Connection reset by peer (injected)")

        def pipeline_once_failing(*args: Any, **kwargs: Any) -> Any:
            # The outcome and its event are written in one MULTI (mailer/daemon/events.py):
            # a mock of the network for its one call; the server itself is real.
            pipe = real_pipeline(*args, **kwargs)
            if not blips:
                blips.append(args)
                monkeypatch.setattr(pipe, "execute", reset)
            return pipe

        monkeypatch.setattr(client, "pipeline", pipeline_once_failing)
        sqs.send_message(QueueUrl=url, MessageBody=GOOD_EVENT)
        async with consumer_task(settings, url, client) as (consumer, task):
            await wait_for(
                lambda: _round_failed(consumer, task), within=20, what="the round to fail on the blip"
            )
            _alive(task)
            assert "poison" not in consumer.handled
            assert _left_in_queue(sqs, url) == 1  # SQS gives it back after its visibility timeout
    finally:
        await client.aclose()
