"""A message whose job record is gone (purged, expired, never written) is never sent."""

from __future__ import annotations

import boto3
import pytest

from fairpost import AsyncMailClient
from fairpost.mailer.daemon.sender import Received
from fairpost.mailer.ops.queue_setup import init_queue
from fairpost.mailer.testing.ses_server import SesServer
from tests.support import message_body
from tests.support.pipeline import quick_settings, sender_only

# Every test here runs the pipeline against moto (SQS) and the recording SES.
pytestmark = pytest.mark.usefixtures("ses_env")


async def test_a_message_whose_job_record_is_gone_was_sent(redis_url: str, ses: SesServer) -> None:
    settings = quick_settings(redis_url)
    url, _ = init_queue(boto3.client("sqs"), settings)
    async with AsyncMailClient(settings) as client, sender_only(settings, url) as sender:
        job_id = await client.send(
            "acme", sender="app@example.com", to=["ada@example.org"], subject="s", text="t"
        )
        body = await message_body(sender.store.redis, job_id, sender.keys)
        # `fairpost dead purge` or the record's TTL took the record; its message is still in SQS.
        await sender.store.redis.delete(sender.keys.job(job_id))
        sqs = boto3.client("sqs")
        sqs.send_message(QueueUrl=url, MessageBody=body, MessageGroupId="acme", MessageDeduplicationId=job_id)
        [got] = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=60)["Messages"]
        await sender.process([Received(message_id=got["MessageId"], receipt=got["ReceiptHandle"],
                                       group="acme", body=got["Body"])])  # fmt: skip
        assert ses.sent_count == 0
        # Dropped: deleted from SQS, counted, and the quota units went back.
        attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
        assert attrs["ApproximateNumberOfMessages"] == "0"
        assert attrs["ApproximateNumberOfMessagesNotVisible"] == "0"
        dropped = sender.metrics.dropped_total.labels("acme", "no_record")._value.get()
        assert dropped == 1
        assert not await sender.store.redis.exists(sender.keys.job(job_id))
        assert not await sender.store.redis.exists(sender.keys.sending(job_id))
