"""A stopping sender lets its long polls in flight land and hands back what they bring
(issue 27, defect 12).

SQS keeps a long poll open on its side even when the client gives up on it,
and hands the next messages to the closed connection: they stay hidden for
the visibility timeout, and in a FIFO queue their whole group waits behind
them. moto's server does the same (its poll runs on in its own thread and
marks what it finds received), so a real sender is driven here against it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import boto3
import pytest

from fairpost.config import Settings
from fairpost.dispatcher.connect import async_redis_client
from fairpost.dispatcher.store import JobStore, store_limits
from fairpost.mailer.daemon.aws import SES_CONFIG, SQS_CONFIG, session
from fairpost.mailer.daemon.sender import Sender
from fairpost.mailer.ops.queue_setup import init_queue
from fairpost.mailer.quota.engine import QuotaEngine
from fairpost.mailer.sdk.keys import MailKeys
from fairpost.mailer.testing.wait import wait_for_async
from tests.support.pipeline import quick_settings

WAIT_SECONDS = 10
"""The sender's long-poll wait: long enough that a poll is still open well after the stop."""
LATE = 2.5
"""When, after the stop, the message reaches the queue: late in the poll's wait, past the
moment a poll used to be cut off (1.5 s)."""
VISIBILITY_TIMEOUT = 60


class PollWatch:
    """The real SQS client, passed through; counts the receives open right now and
    keeps what each brought (no behaviour changed)."""

    def __init__(self, real: Any) -> None:
        self._real = real
        self.open = 0
        self.brought: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    async def receive_message(self, **kwargs: Any) -> Any:
        self.open += 1
        try:
            response = await self._real.receive_message(**kwargs)
        finally:
            self.open -= 1
        self.brought += [m["MessageId"] for m in response.get("Messages", [])]
        return response


@asynccontextmanager
async def sender(settings: Settings, url: str) -> AsyncIterator[tuple[Sender, PollWatch]]:
    client = async_redis_client(settings)
    keys = MailKeys(settings.key_prefix)
    store = JobStore(client, keys, store_limits(settings))
    aws = session()
    try:
        async with aws.client("sqs", config=SQS_CONFIG) as sqs, aws.client("sesv2", config=SES_CONFIG) as ses:
            watch = PollWatch(sqs)
            yield (
                Sender(
                    sqs=watch,
                    ses_client=ses,
                    queue_url=url,
                    store=store,
                    quota=QuotaEngine(client, keys),
                    settings=settings,
                ),
                watch,
            )
    finally:
        await client.aclose()


async def test_a_message_reaching_a_poll_in_flight_at_the_stop_is_handed_back_at_once(
    redis_url: str, aws_env: str
) -> None:
    settings = quick_settings(
        redis_url,
        sender={"wait_seconds": WAIT_SECONDS, "visibility_timeout": VISIBILITY_TIMEOUT, "receivers": 1},
    )
    sqs = boto3.client("sqs")
    url, _ = init_queue(sqs, settings)
    stop = asyncio.Event()
    async with sender(settings, url) as (stopping, watch):
        running = asyncio.create_task(stopping.run(stop))
        # The queue is empty: the poll stays open for its whole wait.
        await wait_for_async(lambda: watch.open == 1, within=10, what="a long poll in flight")
        stop.set()
        # Not a wait for an outcome: where in the poll's wait the message arrives.
        await asyncio.sleep(LATE)
        sent = await asyncio.to_thread(
            sqs.send_message,
            QueueUrl=url,
            MessageBody="late",
            MessageGroupId="acme",
            MessageDeduplicationId="late-1",
        )
        # The stopping replica's shutdown, as `fairpost run` does it: the loops end,
        # then everything it received goes back.
        await running
        await stopping.release_held()

    # Another receiver gets it at once, not after the visibility timeout ...
    other = await asyncio.to_thread(
        sqs.receive_message,
        QueueUrl=url,
        WaitTimeSeconds=0,
        MessageSystemAttributeNames=["ApproximateReceiveCount"],
    )
    got = other.get("Messages", [])
    assert [m["MessageId"] for m in got] == [sent["MessageId"]], (
        "the message is hidden for its visibility timeout"
    )
    # ... because the poll in flight at the stop received it and handed it back.
    assert watch.brought == [sent["MessageId"]], "the poll in flight at the stop did not land"
    assert got[0]["Attributes"]["ApproximateReceiveCount"] == "2"


@pytest.mark.parametrize("receivers", [1, 3])
async def test_every_poll_in_flight_lands_before_the_hand_back_is_done(
    redis_url: str, aws_env: str, receivers: int
) -> None:
    """With nothing to bring, each poll in flight still lands (at its wait's end) and
    none is left open on SQS's side when the replica is gone."""
    settings = quick_settings(
        redis_url,
        sender={"wait_seconds": 2, "visibility_timeout": VISIBILITY_TIMEOUT, "receivers": receivers},
    )
    url, _ = init_queue(boto3.client("sqs"), settings)
    stop = asyncio.Event()
    async with sender(settings, url) as (stopping, watch):
        running = asyncio.create_task(stopping.run(stop))
        await wait_for_async(lambda: watch.open == receivers, within=10, what="every loop polling")
        stop.set()
        # A supervisor's grace period may end first and cancel the loops.
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
        await stopping.release_held()
        assert watch.open == 0, "a poll was left open on SQS's side"
