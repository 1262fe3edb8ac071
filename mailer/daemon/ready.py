"""``/readyz``: Redis answers ``PING``, SQS answers for the queue; a queue
setting that loses mail (fairpost.mailer.ops.redrive) is reported as a warning."""

from __future__ import annotations

import asyncio

import redis.asyncio

from fairpost.mailer.daemon.aws import SqsClient
from fairpost.mailer.daemon.http import Check
from fairpost.mailer.ops.redrive import redrive_warning


async def readiness(client: redis.asyncio.Redis, sqs: SqsClient, queue_url: str) -> Check:
    try:
        await asyncio.wait_for(client.ping(), timeout=2.0)
    except Exception as exc:
        return Check(False, f"Redis does not answer: {type(exc).__name__}")
    try:
        response = await asyncio.wait_for(
            sqs.get_queue_attributes(
                QueueUrl=queue_url, AttributeNames=["QueueArn", "RedrivePolicy", "MessageRetentionPeriod"]
            ),
            timeout=3.0,
        )
    except Exception as exc:
        return Check(False, f"SQS does not answer: {type(exc).__name__}")
    warning = redrive_warning(response.get("Attributes", {}))
    # Ready all the same: the replica works; the queue needs an operator's change.
    return Check(True, "Redis and SQS answer" + (f"; warning: {warning}" if warning else ""))
