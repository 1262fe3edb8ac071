"""Two sending pools (#43) for the end-to-end tests: the default pool and ``eu``, each with
its own recording SES server, its own SQS queue (moto, in its own region) and its own
global quota, under one ``fairpost run`` (tests/e2e/conftest.py's ``pools_env``)."""

from __future__ import annotations

import boto3
import pytest

from fairpost.mailer.cli import main
from fairpost.mailer.sdk.client import MailClient
from fairpost.mailer.testing.ses_server import JOB_ID_TAG, SentMail, SesServer

__all__ = ["DEFAULT_LIMIT", "EU_LIMIT", "EU_QUEUE", "PREFIX", "job_ids", "send", "two_pools"]

PREFIX = "pools"
EU_QUEUE = "fairpost-eu.fifo"
EU_LIMIT = 4  # a second: the eu pool's own global window
DEFAULT_LIMIT = 50


def two_pools(
    monkeypatch: pytest.MonkeyPatch, redis_url: str, aws_env: str, ses: SesServer, eu_ses: SesServer
) -> None:
    """Set the environment of both pools (the default pool's SES is ``ses``, eu's is
    ``eu_ses``) and create their queues, each in its region."""
    for name, value in {
        "FAIRPOST_REDIS_URL": redis_url,
        "FAIRPOST_KEY_PREFIX": PREFIX,
        "FAIRPOST_SENDER__WAIT_SECONDS": "1",
        "FAIRPOST_GLOBAL_LIMITS": f"{DEFAULT_LIMIT}/second",
        "FAIRPOST_TENANT_LIMITS": "100/second",
        "FAIRPOST_POOLS__EU__REGION": "eu-west-1",
        "FAIRPOST_POOLS__EU__QUEUE_NAME": EU_QUEUE,
        "FAIRPOST_POOLS__EU__SQS_ENDPOINT_URL": aws_env,
        "FAIRPOST_POOLS__EU__SES_ENDPOINT_URL": eu_ses.url,
        "FAIRPOST_POOLS__EU__GLOBAL_LIMITS": f"{EU_LIMIT}/second",
        "AWS_ENDPOINT_URL_SESV2": ses.url,
        "FAIRPOST_WEBHOOK_ALLOW_PRIVATE": "true",  # the receiver, on 127.0.0.1
    }.items():
        monkeypatch.setenv(name, value)
    assert main(["init-aws"]) == 0  # the default pool's queue
    assert main(["init-aws", "--pool", "eu"]) == 0  # the eu pool's, in its region
    eu_sqs = boto3.client("sqs", region_name="eu-west-1", endpoint_url=aws_env)
    assert eu_sqs.get_queue_url(QueueName=EU_QUEUE)["QueueUrl"].endswith(EU_QUEUE)


def send(client: MailClient, tenant: str, n: int) -> list[str]:
    """``n`` mails of ``tenant``; their job ids."""
    return [
        client.send(tenant, sender="app@example.com", to=[f"r{i}@example.org"], subject=tenant, text="hi")
        for i in range(n)
    ]


def job_ids(mails: list[SentMail]) -> list[str]:
    """The job ids of mails an SES server recorded, in the order it accepted them."""
    return [m.tags[JOB_ID_TAG] for m in mails]
