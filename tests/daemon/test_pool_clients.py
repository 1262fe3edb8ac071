"""A pool's AWS clients (#43): its own region, endpoints and credentials, a role assumed."""

from __future__ import annotations

import boto3
import pytest

from fairpost.config import load_settings
from fairpost.mailer.daemon.pools import pool_clients, task_name
from fairpost.mailer.ops.pool_aws import pool_client

ROLE = "arn:aws:iam::123456789012:role/fairpost-eu"


@pytest.mark.parametrize("credentials", [{"role_arn": ROLE, "external_id": "xyz"}, {}])
async def test_pool_clients_reach_its_queue(aws_env: str, credentials: dict[str, str]) -> None:
    eu = boto3.client("sqs", region_name="eu-west-1", endpoint_url=aws_env)
    made = eu.create_queue(QueueName="eu.fifo", Attributes={"FifoQueue": "true"})["QueueUrl"]
    pool = {"region": "eu-west-1", "queue_name": "eu.fifo", "sqs_endpoint_url": aws_env, **credentials}
    settings = load_settings(pools={"eu": pool})
    async with pool_clients(settings, "eu") as clients:
        assert clients.queue_url == made
        assert clients.sqs.meta.region_name == clients.ses.meta.region_name == "eu-west-1"
        if credentials:  # the role's credentials (moto's STS hands out its own), not the process's
            signer = clients.sqs._request_signer._credentials
            assert (await signer.get_frozen_credentials()).access_key != "testing"
    with pool_client(settings, "eu", "sqs") as sqs:
        assert sqs.get_queue_url(QueueName="eu.fifo")["QueueUrl"] == made
    # The default pool's queue is another (us-east-1, by the AWS_* variables).
    with pool_client(settings, "default", "sqs") as sqs:
        assert sqs.meta.region_name == "us-east-1"


def test_the_default_pool_keeps_today_s_task_names() -> None:
    assert task_name("default", "sender") == "sender"
    assert task_name("eu", "sender") == "eu/sender"
