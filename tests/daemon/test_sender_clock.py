"""One clock: every time the sender stores is Redis time, whatever the replica's clock says.

Each test runs the sender on a replica whose clock is an hour fast
(``time.time`` patched); what it writes must still agree with Redis ``TIME``,
which is what the scripts trim, expire and compare by.
"""

from __future__ import annotations

import time

import boto3
import pytest
import redis.asyncio

from fairpost import AsyncMailClient
from fairpost.dispatcher.jobs import JobState
from fairpost.dispatcher.replies import time_ms
from fairpost.mailer.daemon.sender import Received
from fairpost.mailer.ops.queue_setup import init_queue
from fairpost.mailer.quota.overrides import StaticLimits
from fairpost.mailer.testing.ses_server import SesServer
from tests.support import message_body
from tests.support.pipeline import quick_settings, sender_only

# Every test here runs the pipeline against moto (SQS) and the recording SES.
pytestmark = pytest.mark.usefixtures("ses_env")

SKEW = 3600.0


@pytest.fixture
def fast_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + SKEW)


async def redis_now_ms(client: redis.asyncio.Redis) -> int:
    return time_ms(await client.time())


async def scores(client: redis.asyncio.Redis, key: str) -> list[tuple[str, float]]:
    pairs: list[tuple[bytes, float]] = await client.zrange(key, 0, -1, withscores=True)  # type: ignore[assignment]
    return [(member.decode(), score) for member, score in pairs]


def near(stored: float, expected: float, within_ms: float = 60_000) -> bool:
    return abs(stored - expected) < within_ms


class PausedAcme(StaticLimits):
    def is_paused(self, tenant: str) -> bool:
        return tenant == "acme"


def sqs_message(url: str, body: str, group: str, dedup: str) -> Received:
    sqs = boto3.client("sqs")
    sqs.send_message(QueueUrl=url, MessageBody=body, MessageGroupId=group, MessageDeduplicationId=dedup)
    [got] = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=1, VisibilityTimeout=60)["Messages"]
    return Received(message_id=got["MessageId"], receipt=got["ReceiptHandle"], group=group, body=got["Body"])


async def test_a_poison_dead_letter_was_scored_by_the_replicas_clock(
    redis_url: str, ses: SesServer, fast_clock: None
) -> None:
    settings = quick_settings(redis_url)
    url, _ = init_queue(boto3.client("sqs"), settings)
    async with sender_only(settings, url) as sender:
        await sender.process([sqs_message(url, "not json", "acme", "p1")])
        now = await redis_now_ms(sender.store.redis)
        [(job_id, score)] = await scores(sender.store.redis, sender.keys.dead())
        record = await sender.store.job(job_id)
    assert near(score, now), score - now
    assert near(int(record["finished_ms"]), now)
    assert near(int(record["created_ms"]), now)


async def test_a_sent_job_was_stamped_by_the_replicas_clock(
    redis_url: str, ses: SesServer, fast_clock: None
) -> None:
    settings = quick_settings(redis_url)
    url, _ = init_queue(boto3.client("sqs"), settings)
    async with AsyncMailClient(settings) as client, sender_only(settings, url) as sender:
        job_id = await client.send(
            "acme", sender="app@example.com", to=["a@example.org"], subject="s", text="t"
        )
        body = await message_body(sender.store.redis, job_id, sender.keys)
        await sender.process([sqs_message(url, body, "acme", job_id)])
        now = await redis_now_ms(sender.store.redis)
        record = await sender.store.job(job_id)
    assert record["state"] == JobState.SENT
    assert near(int(record["sent_ms"]), now), int(record["sent_ms"]) - now


async def test_a_paused_tenants_slots_were_kept_by_the_replicas_clock(
    redis_url: str, ses: SesServer, fast_clock: None
) -> None:
    settings = quick_settings(redis_url)
    url, _ = init_queue(boto3.client("sqs"), settings)
    limits = PausedAcme(settings)
    async with AsyncMailClient(settings) as client, sender_only(settings, url, limits=limits) as sender:
        job_id = await client.send(
            "acme", sender="app@example.com", to=["a@example.org"], subject="s", text="t"
        )
        [job] = await sender.store.claim(1)
        await sender.store.handed_off([job.id])
        body = await message_body(sender.store.redis, job_id, sender.keys)
        await sender.process([sqs_message(url, body, "acme", job_id)])
        now = await redis_now_ms(sender.store.redis)
        [(_, expiry)] = await scores(sender.store.redis, sender.keys.inflight("acme"))
    # Kept for the pause's recheck plus a slot's lifetime, from Redis's now.
    longest = 60_000 + settings.dispatcher.inflight_ttl_seconds * 1000
    assert expiry - now <= longest + 60_000, (expiry - now) / 1000
