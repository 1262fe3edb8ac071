"""A throttled tenant holds one message in flight in SQS, however many it had received.

Each message in flight counts against SQS FIFO's 120,000 in-flight limit;
in a FIFO group one message in flight already holds the rest back. So the
sender parks the refused group's head and hands the rest straight back,
where FIFO order keeps them behind it.
"""

from __future__ import annotations

import boto3

from fairpost import AsyncMailClient
from fairpost.mailer.daemon.sender import Received
from fairpost.mailer.ops.queue_setup import init_queue
from fairpost.mailer.sdk.mail import Mail
from fairpost.mailer.testing.ses_server import SesServer
from fairpost.mailer.testing.wait import wait_for_async
from tests.support import message_body
from tests.support.pipeline import pipeline, quick_settings, sender_only


def queue_depth(url: str) -> tuple[int, int]:
    """(visible, in flight) messages of the queue."""
    attrs = boto3.client("sqs").get_queue_attributes(
        QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
    )["Attributes"]
    return int(attrs["ApproximateNumberOfMessages"]), int(attrs["ApproximateNumberOfMessagesNotVisible"])


async def test_a_throttled_tenant_kept_every_refused_message_in_flight(
    redis_url: str, ses_env: SesServer
) -> None:
    ses = ses_env
    settings = quick_settings(redis_url, tenant_limits="2/minute")
    url, _ = init_queue(boto3.client("sqs"), settings)
    sqs = boto3.client("sqs")
    async with AsyncMailClient(settings) as client, sender_only(settings, url) as sender:
        mails = [
            Mail(sender="app@example.com", to=[f"u{i}@example.org"], subject=f"m{i}", text="t")
            for i in range(6)
        ]
        ids = await client.send_many("noisy", mails)
        for job_id in ids:
            body = await message_body(sender.store.redis, job_id, sender.keys)
            sqs.send_message(
                QueueUrl=url, MessageBody=body, MessageGroupId="noisy", MessageDeduplicationId=job_id
            )
        got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=60)["Messages"]
        assert len(got) == 6
        await sender.process([
            Received(message_id=m["MessageId"], receipt=m["ReceiptHandle"], group="noisy", body=m["Body"])
            for m in got
        ])  # fmt: skip
        throttled = [(await client.status(i)).throttled for i in ids]
        depth = queue_depth(url)
    assert ses.sent_count == 2
    # The first refused mail waits in flight for the quota; the other three are
    # back in the queue, behind it in their group.
    assert depth == (3, 1)
    assert throttled == [0, 0, 1, 0, 0, 0]


async def test_a_parked_tenant_holds_one_message_in_flight_while_its_backlog_waits(
    redis_url: str, ses_env: SesServer
) -> None:
    """The whole loop, receive after receive: once the head is parked it holds the
    group, so the sender's next receives bring none of the tenant's mail, nothing
    more is parked, and the tenant's SQS depth is its in-flight cap at most.

    On moto with one receiver (quick_settings): LocalStack re-opens a group when a
    message of it is handed back (tests/contract/test_sqs_fifo.py), and moto's
    concurrent receives can share a group, so neither shows what SQS does here.
    """
    cap = 8
    settings = quick_settings(redis_url, tenant_limits="1/minute", inflight_cap=cap)
    mails = [
        Mail(sender="app@example.com", to=[f"u{i}@example.org"], subject=f"m{i}", text="t") for i in range(20)
    ]
    async with AsyncMailClient(settings) as client, pipeline(settings) as running:
        await client.send_many("noisy", mails)
        stats, receives = running.sender.stats, running.receives
        await wait_for_async(
            lambda: ses_env.sent_count == 1 and stats.throttled_by_quota >= 1,
            within=30,
            what="the tenant's first mail sent and its next one parked",
        )
        calls, received = len(receives.calls), len(receives.bodies)
        await wait_for_async(
            lambda: len(receives.calls) >= calls + 3, within=30, what="three receives after the park"
        )
        await wait_for_async(
            lambda: sum(queue_depth(running.queue_url)) == cap,
            within=30,
            what="the dispatcher to refill the sent mail's slot",
        )
        depth = queue_depth(running.queue_url)
        again = receives.bodies[received:]
        parked = stats.throttled_by_quota
    assert again == []
    assert parked == 1
    assert depth == (cap - 1, 1)
    assert ses_env.sent_count == 1
