"""A queue RedrivePolicy a throttled tenant reaches: every quota park is a receive.

init-aws and check-config name it and say what to set; /readyz reports it
as a warning. SQS is moto's server over HTTP.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import boto3
import pytest
import redis.asyncio

from fairpost.config import load_settings
from fairpost.mailer.cli import main
from fairpost.mailer.daemon.aws import SQS_CONFIG, session
from fairpost.mailer.daemon.parking import PRECISE_WAIT_MAX
from fairpost.mailer.daemon.ready import readiness
from fairpost.mailer.ops.redrive import SHORTEST_PARK_SECONDS, redrive_warning


def queue_with_redrive(max_receives: int) -> str:
    sqs = boto3.client("sqs")
    dlq = sqs.create_queue(QueueName="fairpost-dlq.fifo", Attributes={"FifoQueue": "true"})["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    policy = json.dumps({"deadLetterTargetArn": arn, "maxReceiveCount": max_receives})
    url: str = sqs.create_queue(
        QueueName="fairpost-mail.fifo", Attributes={"FifoQueue": "true", "RedrivePolicy": policy}
    )["QueueUrl"]
    return url


def test_init_aws_kept_quiet_about_a_redrive_policy_a_throttled_tenant_reaches(
    aws_env: str, capsys: pytest.CaptureFixture[str]
) -> None:
    queue_with_redrive(5)
    assert main(["init-aws"]) == 0
    out = capsys.readouterr().out
    assert "warning: the queue's RedrivePolicy moves a message to fairpost-dlq.fifo after 5 receives" in out
    assert "remove the RedrivePolicy" in out
    assert main(["init-aws", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    [warning] = report["warnings"]
    assert "every quota park is a receive" in warning


def test_check_config_kept_quiet_about_it_too(aws_env: str, capsys: pytest.CaptureFixture[str]) -> None:
    queue_with_redrive(1000)
    assert main(["check-config"]) == 0
    captured = capsys.readouterr()
    assert "settings are valid" in captured.out
    assert "warning: the queue's RedrivePolicy moves a message to fairpost-dlq.fifo after 1000 receives" in (
        captured.err
    )


def test_no_warning_without_a_redrive_policy(aws_env: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["init-aws", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["warnings"] == []
    assert main(["check-config"]) == 0
    assert "warning" not in capsys.readouterr().err


def test_the_warning_counts_receives_from_the_retention_and_the_shortest_park() -> None:
    # Shorter quota waits are timed by the sender itself, not parked in SQS.
    assert SHORTEST_PARK_SECONDS == PRECISE_WAIT_MAX
    policy = json.dumps({"deadLetterTargetArn": "arn:aws:sqs:us-east-1:1:dlq.fifo", "maxReceiveCount": 1000})
    warning = redrive_warning({"RedrivePolicy": policy, "MessageRetentionPeriod": "1209600"})
    assert warning is not None and "about 604,800 times within the retention (14 days)" in warning
    # A retention so short that a message cannot be parked that often: no warning.
    assert redrive_warning({"RedrivePolicy": policy, "MessageRetentionPeriod": "1800"}) is None


@pytest.fixture
async def aredis(redis_url: str) -> AsyncIterator[redis.asyncio.Redis]:
    client = redis.asyncio.Redis.from_url(redis_url)
    yield client
    await client.aclose()


async def test_readyz_said_nothing_of_the_redrive_policy(aws_env: str, aredis: redis.asyncio.Redis) -> None:
    url = queue_with_redrive(5)
    async with session().client("sqs", config=SQS_CONFIG) as sqs:
        check = await readiness(aredis, sqs, url)
    assert check.ok, "a warning, not a failure"
    assert check.detail.startswith("Redis and SQS answer; warning: the queue's RedrivePolicy")
    settings = load_settings()
    assert settings.queue_name == "fairpost-mail.fifo"
