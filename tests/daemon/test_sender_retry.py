"""A tenant over a per-second quota is asked again the moment its quota frees.

The sender times waits under ``PRECISE_WAIT_MAX`` itself (fairpost.mailer.daemon.sender),
because SQS counts visibility in whole seconds. Every millisecond a timed retry
comes late is a millisecond of the tenant's quota unused, in every window it
waits: a deep backlog then gets less than its quota (BENCHMARKS.md,
"Utilisation"). When a timed retry is due is the group decision's, tested alone in
tests/daemon/unit/test_group.py.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import boto3

from fairpost import AsyncMailClient
from fairpost.mailer.daemon.sender import Received, Sender
from fairpost.mailer.ops.queue_setup import init_queue
from fairpost.mailer.sdk.mail import Mail
from fairpost.mailer.testing.ses_server import SesServer
from fairpost.mailer.testing.wait import wait_for_async
from tests.support import message_body
from tests.support.pipeline import pipeline, quick_settings, sender_only


class HeldDeletes:
    """An SQS client whose deletes wait until the test lets them through."""

    def __init__(self, real: Any) -> None:
        self._real = real
        self.go = asyncio.Event()
        self.waiting = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    async def delete_message_batch(self, **kwargs: Any) -> Any:
        self.waiting += 1
        await self.go.wait()
        return await self._real.delete_message_batch(**kwargs)


async def received(sender: Sender, client: AsyncMailClient, url: str, tenant: str, n: int) -> list[Received]:
    """``n`` mails of ``tenant`` enqueued, put in SQS by hand and received in one batch."""
    mails = [
        Mail(sender="app@example.com", to=[f"u{i}@example.org"], subject=f"m{i}", text="t") for i in range(n)
    ]
    sqs = boto3.client("sqs")
    for job_id in await client.send_many(tenant, mails):
        body = await message_body(sender.store.redis, job_id, sender.keys)
        sqs.send_message(QueueUrl=url, MessageBody=body, MessageGroupId=tenant, MessageDeduplicationId=job_id)
    got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=60)["Messages"]
    assert len(got) == n
    return [
        Received(message_id=m["MessageId"], receipt=m["ReceiptHandle"], group=tenant, body=m["Body"],
                 hidden_until=time.monotonic() + 60)
        for m in got
    ]  # fmt: skip


async def test_a_timed_retry_does_not_wait_for_its_batchs_deletes(redis_url: str, ses_env: SesServer) -> None:
    """The granted head's delete lingers for company (inbox._Deletes) and then takes an
    SQS call; the refused rest is due back when its quota frees, which may be sooner.
    Here the delete never ends until the second mail is sent: a retry timed only
    after the batch settled would never come."""
    settings = quick_settings(redis_url, tenant_limits="1/second")
    url, _ = init_queue(boto3.client("sqs"), settings)
    async with AsyncMailClient(settings) as client, sender_only(settings, url) as sender:
        held = HeldDeletes(sender.inbox.sqs)
        sender.inbox.sqs = held
        sender.inbox._deletes._sqs = held
        batch = await received(sender, client, url, "t", 2)
        processing = asyncio.create_task(sender.process(batch))
        try:
            await wait_for_async(
                lambda: ses_env.sent_count == 2, within=10, what="the refused mail, sent as the delete waits"
            )
            assert held.waiting >= 1
        finally:
            held.go.set()
            await processing
            await asyncio.gather(*sender.inbox.timers)
    assert ses_env.max_in_window(1.0) <= 1


async def test_a_throttled_group_freed_by_its_timed_retry_is_received_again_at_once(
    redis_url: str, ses_env: SesServer
) -> None:
    """While a timed retry holds a throttled tenant's group, SQS delivers none of its
    backlog; the retry that sends the group's last mail frees it. The deletes that
    free it and the next receive must not wait for company (both linger otherwise:
    inbox._Deletes, sender.linger_seconds), or the tenant's quota, free again by
    then, goes unused meanwhile. Here both lingers last an hour.

    The tenant's window is full before its first mail comes: a first receive that
    found the quota open would send all it got, and lingering then is right (the
    tenant is not throttled), but here it would hold the group for the hour."""
    settings = quick_settings(redis_url, tenant_limits="2/second", inflight_cap=4)
    # model_copy does not validate: a linger far past what settings allow, so that
    # only a receive that does not linger can ever bring the backlog.
    sender_settings = settings.sender.model_copy(update={"linger_seconds": 3600.0})
    settings = settings.model_copy(update={"sender": sender_settings})
    mails = [
        Mail(sender="app@example.com", to=[f"u{i}@example.org"], subject=f"m{i}", text="t") for i in range(8)
    ]
    async with AsyncMailClient(settings) as client, pipeline(settings) as running:
        sender = running.sender
        deletes = sender.inbox._deletes
        deletes._linger = 3600.0
        earlier = await sender.quota.acquire("deep", [2], *sender.ctx.windows("deep"))
        assert earlier.granted == 1
        await client.send_many("deep", mails)
        try:
            await wait_for_async(lambda: ses_env.sent_count == 8, within=30, what="the whole backlog")
        finally:
            # Whatever an hour's linger still holds goes now: the shutdown must not wait for it.
            deletes._linger = 0.05
            deletes._flush()
    assert ses_env.max_in_window(1.0) <= 2
