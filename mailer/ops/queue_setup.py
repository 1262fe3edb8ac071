"""``fairpost init-aws``: the SQS FIFO queue, created idempotently with the right attributes."""

from __future__ import annotations

from typing import Any

from botocore.exceptions import ClientError

from fairpost.config import Settings
from fairpost.mailer.ops.redrive import redrive_warning

RETENTION_SECONDS = 14 * 86400
"""SQS's maximum: a throttled backlog must not outlive it (the in-flight cap
keeps only a few seconds' worth of each tenant in SQS anyway)."""


def wanted_attributes(settings: Settings) -> dict[str, str]:
    return {
        "FifoQueue": "true",
        "DeduplicationScope": "messageGroup",
        "FifoThroughputLimit": "perMessageGroupId",
        "ContentBasedDeduplication": "false",
        "VisibilityTimeout": str(settings.sender.visibility_timeout),
        "ReceiveMessageWaitTimeSeconds": "20",
        "MessageRetentionPeriod": str(RETENTION_SECONDS),
        "MaximumMessageSize": str(1024 * 1024),
    }


def init_queue(sqs: Any, settings: Settings) -> tuple[str, dict[str, tuple[str, str]]]:
    """Create the queue if missing (boto3, blocking). Returns its URL and the
    attributes that differ from what fairpost wants: name → (have, want)."""
    return _ensure_queue(sqs, settings.queue_name, wanted_attributes(settings))


def wanted_events_attributes() -> dict[str, str]:
    """The SES events queue: a standard queue (SNS and EventBridge deliver to those)."""
    return {
        "VisibilityTimeout": "60",
        "ReceiveMessageWaitTimeSeconds": "20",
        "MessageRetentionPeriod": str(RETENTION_SECONDS),
    }


def init_events_queue(sqs: Any, settings: Settings) -> tuple[str, dict[str, tuple[str, str]]]:
    """Create ``FAIRPOST_EVENTS_QUEUE_NAME`` if missing (``init-aws --events``). Returns its
    URL and the attributes that differ. Subscribing it to the SNS topic or EventBridge
    rule of a configuration set's event destination is the operator's
    (docs/operations.md, "Reputation")."""
    if not settings.events_queue_name:
        from fairpost.config import ConfigError

        raise ConfigError([("FAIRPOST_EVENTS_QUEUE_NAME", "must be set for init-aws --events")])
    return _ensure_queue(sqs, settings.events_queue_name, wanted_events_attributes())


def _ensure_queue(sqs: Any, name: str, wanted: dict[str, str]) -> tuple[str, dict[str, tuple[str, str]]]:
    """The queue's URL, creating it with ``wanted`` if missing, and the attributes
    that differ from ``wanted`` (name -> (have, want)); an existing queue is never changed."""
    try:
        url: str = sqs.get_queue_url(QueueName=name)["QueueUrl"]
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") not in {
            "AWS.SimpleQueueService.NonExistentQueue",
            "QueueDoesNotExist",
        }:
            raise
        url = sqs.create_queue(QueueName=name, Attributes=wanted)["QueueUrl"]
    have = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    differ = {
        attr: (have.get(attr, "(unset)"), want) for attr, want in wanted.items() if have.get(attr) != want
    }
    return url, differ


def queue_warnings(sqs: Any, url: str) -> list[str]:
    """What in the queue's settings can lose mail fairpost holds (boto3, blocking)."""
    have = sqs.get_queue_attributes(
        QueueUrl=url, AttributeNames=["RedrivePolicy", "MessageRetentionPeriod"]
    ).get("Attributes", {})
    warning = redrive_warning(have)
    return [warning] if warning else []
