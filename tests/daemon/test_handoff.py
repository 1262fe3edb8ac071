"""The mail worker hands jobs to SQS FIFO (moto's server over HTTP)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import boto3
import pytest
import redis.asyncio

from fairpost.config import load_settings
from fairpost.dispatcher.jobs import Job, NewJob
from fairpost.dispatcher.replies import time_ms
from fairpost.dispatcher.runner import Dispatcher
from fairpost.dispatcher.store import JobStore, StoreLimits
from fairpost.dispatcher.worker import Dead, HandedOff, Requeue
from fairpost.mailer.daemon.aws import SQS_CONFIG, session
from fairpost.mailer.daemon.handoff import MailWorker
from fairpost.mailer.ops.queue_setup import init_queue
from fairpost.mailer.sdk.keys import MailKeys
from fairpost.mailer.sdk.mail import Mail, validate
from fairpost.mailer.testing.wait import wait_for_async


def mail_job(job_id: str, tenant: str) -> Job:
    _, payload = validate(
        Mail(sender="app@example.com", to=["ada@example.org"], subject="hi", text="hello"), max_bytes=100_000
    )
    return Job(id=job_id, tenant=tenant, kind="mail", payload=payload, attempts=0, created_ms=1)


@pytest.fixture
async def sqs(aws_env: str) -> AsyncIterator[Any]:
    async with session().client("sqs", config=SQS_CONFIG) as client:
        yield client


@pytest.fixture
def queue_url(aws_env: str) -> str:
    url, differ = init_queue(boto3.client("sqs"), load_settings())
    assert differ == {}
    return url


class CountingSqs:
    """Wraps the real client to count batches and, when told, fail some entries
    the way SQS reports a partial failure (moto cannot be made to)."""

    def __init__(self, real: Any, fail_ids: set[str] | None = None, sender_fault: bool = False) -> None:
        self.real = real
        self.fail_ids = set(fail_ids or ())
        self.sender_fault = sender_fault
        self.batches: list[list[str]] = []

    async def send_message_batch(self, QueueUrl: str, Entries: list[dict[str, str]]) -> dict[str, Any]:
        self.batches.append([e["Id"] for e in Entries])
        failing = [e for e in Entries if e["Id"] in self.fail_ids]
        passing = [e for e in Entries if e["Id"] not in self.fail_ids]
        response: dict[str, Any] = {"Successful": [], "Failed": []}
        if passing:
            response = dict(await self.real.send_message_batch(QueueUrl=QueueUrl, Entries=passing))
            response.setdefault("Failed", [])
        for entry in failing:
            response["Failed"].append(
                {
                    "Id": entry["Id"],
                    "Code": "InternalError",
                    "Message": "try again",
                    "SenderFault": self.sender_fault,
                }
            )
        if not self.sender_fault:
            self.fail_ids.clear()  # fails once, then recovers
        return response


def receive_all(url: str, expected: int) -> list[dict[str, Any]]:
    client = boto3.client("sqs")
    got: list[dict[str, Any]] = []
    for _ in range(20):
        response = client.receive_message(
            QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=0, VisibilityTimeout=60,
            MessageSystemAttributeNames=["MessageGroupId", "MessageDeduplicationId"],
        )  # fmt: skip
        batch = response.get("Messages", [])
        got += batch
        # FIFO: a group with a message in flight delivers nothing more, so take them out.
        for message in batch:
            client.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
        if len(got) >= expected:
            break
    return got


async def test_jobs_land_in_sqs_grouped_by_tenant(sqs: Any, queue_url: str) -> None:
    counting = CountingSqs(sqs)
    worker = MailWorker(counting, queue_url)
    jobs = [mail_job(f"job{i:02d}", "acme" if i % 2 else "globex") for i in range(25)]
    outcomes = await worker.handle(jobs[:10])
    outcomes = [*outcomes, *await worker.handle(jobs[10:20]), *await worker.handle(jobs[20:])]
    assert outcomes == [HandedOff()] * 25
    assert [len(b) for b in counting.batches] == [10, 10, 5]
    messages = receive_all(queue_url, 25)
    assert len(messages) == 25
    for message in messages:
        body = json.loads(message["Body"])
        assert body["v"] == 1
        assert message["Attributes"]["MessageGroupId"] == body["tenant"]
        assert message["Attributes"]["MessageDeduplicationId"] == body["job_id"]
        assert body["mail"]["to"] == ["ada@example.org"]
    assert {m["Attributes"]["MessageGroupId"] for m in messages} == {"acme", "globex"}


async def test_a_partial_failure_retries_only_the_failed_entries(sqs: Any, queue_url: str) -> None:
    counting = CountingSqs(sqs, fail_ids={"job3", "job7"})
    worker = MailWorker(counting, queue_url)
    outcomes = await worker.handle([mail_job(f"job{i}", "acme") for i in range(10)])
    assert outcomes == [HandedOff()] * 10
    assert counting.batches[1] == ["job3", "job7"]
    assert len(receive_all(queue_url, 10)) == 10


async def test_entries_sqs_rejects_as_sender_fault_become_dead_letters(sqs: Any, queue_url: str) -> None:
    counting = CountingSqs(sqs, fail_ids={"job1"}, sender_fault=True)
    outcomes = await MailWorker(counting, queue_url).handle(
        [mail_job("job0", "acme"), mail_job("job1", "acme")]
    )
    assert outcomes[0] == HandedOff()
    assert isinstance(outcomes[1], Dead) and "InternalError" in outcomes[1].reason
    assert len(counting.batches) == 1


async def test_entries_that_keep_failing_go_back_to_redis(sqs: Any, queue_url: str) -> None:
    class AlwaysFailing(CountingSqs):
        async def send_message_batch(self, QueueUrl: str, Entries: list[dict[str, str]]) -> dict[str, Any]:
            self.batches.append([e["Id"] for e in Entries])
            failed = [{"Id": e["Id"], "Code": "InternalError", "SenderFault": False} for e in Entries]
            return {"Successful": [], "Failed": failed}

    failing = AlwaysFailing(sqs)
    outcomes = await MailWorker(failing, queue_url).handle([mail_job("job0", "acme")])
    assert isinstance(outcomes[0], Requeue)
    assert len(failing.batches) == 3


def test_init_aws_is_idempotent_and_reports_differences(aws_env: str) -> None:
    settings = load_settings()
    client = boto3.client("sqs")
    url1, differ1 = init_queue(client, settings)
    url2, differ2 = init_queue(client, settings)
    assert url1 == url2 and differ1 == differ2 == {}
    attrs = client.get_queue_attributes(QueueUrl=url1, AttributeNames=["All"])["Attributes"]
    assert attrs["FifoQueue"] == "true"
    assert attrs["DeduplicationScope"] == "messageGroup"
    assert attrs["FifoThroughputLimit"] == "perMessageGroupId"
    client.set_queue_attributes(QueueUrl=url1, Attributes={"VisibilityTimeout": "5"})
    _, differ3 = init_queue(client, settings)
    assert differ3 == {"VisibilityTimeout": ("5", "60")}


async def test_a_handoff_that_failed_on_its_second_batch_requeued_the_first_one_already_in_sqs(
    sqs: Any, queue_url: str
) -> None:
    class FailsOnSecondCall(CountingSqs):
        async def send_message_batch(self, QueueUrl: str, Entries: list[dict[str, str]]) -> dict[str, Any]:
            if self.batches:
                self.batches.append([e["Id"] for e in Entries])
                raise ConnectionError("SQS went away mid hand-off")
            return await super().send_message_batch(QueueUrl=QueueUrl, Entries=Entries)

    failing = FailsOnSecondCall(sqs)
    # 10 mails of about 200 KB: the 1 MiB batch limit splits them into sub-batches.
    big = "x" * 200_000
    _, payload = validate(
        Mail(sender="app@example.com", to=["ada@example.org"], subject="hi", text=big), max_bytes=400_000
    )
    jobs = [Job(id=f"job{i}", tenant="acme", kind="mail", payload=payload, attempts=0, created_ms=1)
            for i in range(10)]  # fmt: skip
    outcomes = await MailWorker(failing, queue_url).handle(jobs)
    sent_first = set(failing.batches[0])
    assert 0 < len(sent_first) < 10
    for job, outcome in zip(jobs, outcomes, strict=True):
        if job.id in sent_first:
            assert outcome == HandedOff(), f"{job.id} is in SQS but would go back to Redis"
        else:
            assert isinstance(outcome, Requeue) and "went away" in outcome.reason
    assert len(receive_all(queue_url, len(sent_first))) == len(sent_first)


async def test_a_slow_sqs_hand_off_keeps_its_claims_and_each_job_reaches_sqs_once(
    sqs: Any, queue_url: str, redis_url: str
) -> None:
    # Leases of 2 s (an event loop stalled longer than a lease cannot renew it, so
    # a shorter one is a budget a loaded machine can use up); the SQS call takes
    # until the test lets go, three leases and more. A second replica reaping all
    # along must never hand the jobs off again.
    client = redis.asyncio.Redis.from_url(redis_url)
    store = JobStore(client, MailKeys("slow"), StoreLimits(lease_ms=2000, default_cap=1000))
    _, payload = validate(
        Mail(sender="app@example.com", to=["ada@example.org"], subject="hi", text="hello"), max_bytes=100_000
    )
    await store.enqueue([NewJob(id=f"job{i}", tenant="acme", kind="mail", payload=payload) for i in range(5)])
    entered, release = asyncio.Event(), asyncio.Event()

    class SlowSqs(CountingSqs):
        async def send_message_batch(self, QueueUrl: str, Entries: list[dict[str, str]]) -> dict[str, Any]:
            entered.set()
            await release.wait()
            return await super().send_message_batch(QueueUrl=QueueUrl, Entries=Entries)

    slow, other = SlowSqs(sqs), CountingSqs(sqs)
    stop = asyncio.Event()
    dispatchers = [Dispatcher(store, [MailWorker(w, queue_url)], reap_interval=0.05) for w in (slow, other)]
    tasks = [asyncio.create_task(dispatchers[0].run(stop))]
    try:
        await asyncio.wait_for(entered.wait(), timeout=15)
        tasks.append(asyncio.create_task(dispatchers[1].run(stop)))
        start = await redis_ms(client)

        async def three_leases_passed() -> bool:
            return await redis_ms(client) - start >= 6000

        await wait_for_async(three_leases_passed, within=60, what="three leases of Redis time")
        release.set()

        async def all_dispatched() -> bool:
            return all([(await store.job(f"job{i}")).get("state") == "dispatched" for i in range(5)])

        await wait_for_async(all_dispatched, within=15, what="every job handed off")
    finally:
        release.set()
        stop.set()
        await asyncio.gather(*tasks)
        # What run() left with the workers settles before the client closes (as the daemon does).
        await asyncio.gather(*(d.drain(5) for d in dispatchers))
        await client.aclose()
    assert other.batches == [], "a live replica's claims were reaped and handed off again"
    assert sorted(id_ for batch in slow.batches for id_ in batch) == [f"job{i}" for i in range(5)]
    assert len(receive_all(queue_url, 5)) == 5


async def redis_ms(client: redis.asyncio.Redis) -> int:
    return time_ms(await client.time())
