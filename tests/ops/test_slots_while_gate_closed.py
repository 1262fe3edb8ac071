"""While the global quota is spent for longer than the in-flight TTL, a tenant's
mail in SQS never grows past its in-flight cap (issue 12, item 4): a real daemon
process, moto's SQS over HTTP, a short in-flight TTL."""

from __future__ import annotations

import asyncio
import time

import boto3
import pytest
import redis.asyncio

from fairpost.config.limits import Window
from fairpost.mailer.quota.engine import QuotaEngine
from fairpost.mailer.sdk.client import MailClient
from fairpost.mailer.testing.wait import wait_for
from tests.support.operator import Ops

TTL = 2.0


def _sqs_depth() -> int:
    sqs = boto3.client("sqs")
    url = sqs.get_queue_url(QueueName="fairpost-mail.fifo")["QueueUrl"]
    attributes = sqs.get_queue_attributes(
        QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
    )["Attributes"]
    return int(attributes["ApproximateNumberOfMessages"]) + int(
        attributes["ApproximateNumberOfMessagesNotVisible"]
    )


async def _spend_the_day(redis_url: str, ops: Ops) -> None:
    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        grant = await QuotaEngine(client, ops.keys).acquire("earlier", [2], [Window(86_400, 2)], [])
        assert grant.granted == 1
    finally:
        await client.aclose()


def test_sqs_holds_no_more_than_the_cap_while_the_global_day_is_spent(
    ops: Ops, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The day's global quota was spent before this replica started: it never receives.
    asyncio.run(_spend_the_day(redis_url, ops))
    monkeypatch.setenv("FAIRPOST_GLOBAL_LIMITS", "100/second; 2/day")
    monkeypatch.setenv("FAIRPOST_INFLIGHT_CAP", "2")
    monkeypatch.setenv("FAIRPOST_DISPATCHER__INFLIGHT_TTL_SECONDS", str(TTL))
    monkeypatch.setenv("FAIRPOST_DISPATCHER__LEASE_SECONDS", "1")  # the slot is the TTL from the hand-off
    with ops.daemon(replica="s1"), MailClient() as client:
        for i in range(8):
            client.send("acme", sender="app@example.com", to=[f"a{i}@example.org"], subject="a", text="a")
        started = time.monotonic()
        depths: list[int] = []

        def four_ttls_watched() -> bool:
            depths.append(_sqs_depth())
            return time.monotonic() - started > 4 * TTL

        wait_for(four_ttls_watched, within=60, what="four in-flight TTLs", interval=0.2)
    # Today each TTL moved another cap's worth of acme's backlog into SQS.
    assert max(depths) == 2, depths
    assert ops.ses.sent == []
