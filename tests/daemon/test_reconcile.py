"""Nothing stranded: a job whose SQS message is gone (a redrive policy moved it
to a dead-letter queue, a purge) ends sent, or dead with the reason.

SQS is moto's server over HTTP; SES the recording server.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, cast

import boto3
import pytest
import redis.asyncio

from fairpost import AsyncMailClient
from fairpost.config import Settings, load_settings
from fairpost.dispatcher.jobs import JobState
from fairpost.dispatcher.keys import ANCHOR
from fairpost.dispatcher.replies import time_ms
from fairpost.dispatcher.store import JobStore, NewJob, StoreLimits
from fairpost.dispatcher.stranded import StrandedJobs
from fairpost.mailer.daemon.handoff import MailWorker
from fairpost.mailer.daemon.health import Heartbeat, Liveness, sender_alive
from fairpost.mailer.daemon.metrics import Metrics
from fairpost.mailer.daemon.reconcile import Reconciler, ReconcileReport
from fairpost.mailer.ops.stats import collect_stats
from fairpost.mailer.sdk.keys import MailKeys, mail_keys
from fairpost.mailer.sdk.mail import Mail
from fairpost.mailer.testing.ses_server import SesServer
from fairpost.mailer.testing.wait import wait_for_async
from tests.support.pipeline import Running, pipeline, quick_settings


def reconcile_settings(redis_url: str, **overrides: Any) -> Settings:
    # Stranded after 0.5 (in-flight TTL) + 5 (visibility) + 0.5 (longest retry
    # delay) = 6 s without progress.
    base: dict[str, Any] = {
        "dispatcher": {"inflight_ttl_seconds": 0.5},
        "sender": {
            "wait_seconds": 1,
            "receivers": 1,
            "visibility_timeout": 5,
            "backoff_base_seconds": 0.5,
            "backoff_max_seconds": 0.5,
            "pause_seconds": 1,
            "max_jitter_seconds": 0.2,
        },
    }
    base.update(overrides)
    return quick_settings(redis_url, **base)


def mails(count: int) -> list[Mail]:
    return [
        Mail(sender="app@example.com", to=[f"user{i}@example.org"], subject=f"m{i}", text="hi")
        for i in range(count)
    ]


async def all_in(client: AsyncMailClient, ids: list[str], state: str) -> bool:
    return {(await client.status(i)).state for i in ids} == {state}


async def reconciling(run: Running, metrics: Metrics) -> asyncio.Task[None]:
    """A reconciler beside the test's dispatcher and sender, as the daemon runs one."""
    stop = asyncio.Event()
    aws_sqs = run.dispatcher.workers["mail"]
    assert isinstance(aws_sqs, MailWorker)
    worker = MailWorker(aws_sqs.sqs, run.queue_url, metrics=metrics)
    reconciler = Reconciler(run.store, worker, run.settings, metrics=metrics, interval=0.2)
    task = asyncio.create_task(reconciler.run(stop))
    task.add_done_callback(lambda _: stop.set())
    return task


async def stopped(task: asyncio.Task[None]) -> None:
    """Cancel the reconciler and wait until it has let go of its connection."""
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


class Gate:
    """Holds the sender's receives until opened."""

    def __init__(self) -> None:
        self.opened = asyncio.Event()

    async def __call__(self) -> None:
        await self.opened.wait()


@pytest.mark.usefixtures("ses_env")
async def test_jobs_whose_messages_were_purged_stayed_dispatched_forever(
    redis_url: str, ses: SesServer
) -> None:
    settings = reconcile_settings(redis_url)
    gate = Gate()
    metrics = Metrics()
    async with pipeline(settings, before_receive=gate) as run, AsyncMailClient(settings) as client:
        ids = await client.send_many("acme", mails(3)) + await client.send_many("globex", mails(2))
        await wait_for_async(lambda: all_in(client, ids, "dispatched"), within=10, what="all in SQS")
        boto3.client("sqs").purge_queue(QueueUrl=run.queue_url)
        task = await reconciling(run, metrics)
        try:
            await wait_for_async(
                lambda: all_handed_again(run.store, ids), within=30, what="the reconciler to hand them again"
            )
            gate.opened.set()
            await wait_for_async(lambda: all_in(client, ids, "sent"), within=20, what="every job sent")
            stats = await collect_stats(run.store.redis, mail_keys(run.store.keys), settings)
        finally:
            await stopped(task)
    assert sorted(m.job_id or "" for m in ses.sent) == sorted(ids), "each job sent exactly once"
    assert stats.reconciled == {"handed_again": 5}
    assert stats.to_json()["reconciled"] == {"handed_again": 5, "dead": 0}
    assert metrics.reconciled_total.labels("handed_again")._value.get() == 5


class Thief:
    """Takes messages from the queue behind fairpost's back (PurgeQueue: once a minute)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.taken = 0

    def took(self, count: int) -> bool:
        """Receive and delete what is there; True once ``count`` are gone."""
        sqs = boto3.client("sqs")
        for message in sqs.receive_message(QueueUrl=self.url, MaxNumberOfMessages=10).get("Messages", []):
            sqs.delete_message(QueueUrl=self.url, ReceiptHandle=message["ReceiptHandle"])
            self.taken += 1
        return self.taken >= count


async def all_handed_again(store: JobStore, ids: list[str]) -> bool:
    return all([(await store.job(i)).get("reconciled") == "1" for i in ids])


@pytest.mark.usefixtures("ses_env")
async def test_mail_a_redrive_policy_moved_to_a_dead_letter_queue_stayed_dispatched_forever(
    redis_url: str, ses: SesServer
) -> None:
    # A throttled tenant: each park is a receive, and the queue's redrive policy
    # moves a message to its DLQ at its second receive (a park of 10 s is longer
    # than the sender times itself: it waits in SQS).
    settings = reconcile_settings(redis_url, tenants={"slow": {"limits": "1/10 seconds"}})
    sqs = boto3.client("sqs")
    dlq = sqs.create_queue(QueueName="fairpost-dlq.fifo", Attributes={"FifoQueue": "true"})["QueueUrl"]
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    url = sqs.create_queue(
        QueueName=settings.queue_name,
        Attributes={
            "FifoQueue": "true",
            "RedrivePolicy": json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 1}),
        },
    )["QueueUrl"]
    metrics = Metrics()
    async with pipeline(settings) as run, AsyncMailClient(settings) as client:
        assert run.queue_url == url
        ids = await client.send_many("slow", mails(3))
        task = await reconciling(run, metrics)
        try:
            await wait_for_async(lambda: all_in(client, ids, "sent"), within=60, what="every job sent")
        finally:
            await stopped(task)
    moved = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["ApproximateNumberOfMessages"])
    assert int(moved["Attributes"]["ApproximateNumberOfMessages"]) >= 1, "no message reached the DLQ"
    assert metrics.reconciled_total.labels("handed_again")._value.get() >= 1
    assert sorted(m.job_id or "" for m in ses.sent) == sorted(ids), "each job sent exactly once"


@pytest.mark.usefixtures("ses_env")
async def test_a_job_sqs_keeps_losing_lived_forever_instead_of_ending_dead(
    redis_url: str, ses: SesServer
) -> None:
    settings = reconcile_settings(redis_url, reconcile_handoffs=1)
    gate = Gate()
    metrics = Metrics()
    sqs = boto3.client("sqs")
    async with pipeline(settings, before_receive=gate) as run, AsyncMailClient(settings) as client:
        ids = await client.send_many("acme", mails(2))
        await wait_for_async(lambda: all_in(client, ids, "dispatched"), within=10, what="all in SQS")
        sqs.purge_queue(QueueUrl=run.queue_url)
        task = await reconciling(run, metrics)
        try:
            await wait_for_async(
                lambda: all_handed_again(run.store, ids), within=30, what="a second hand-off"
            )
            thief = Thief(run.queue_url)
            await wait_for_async(lambda: thief.took(2), within=10, what="the new messages lost again")
            await wait_for_async(lambda: all_in(client, ids, "dead"), within=30, what="dead letters")
            statuses = [await client.status(i) for i in ids]
            stats = await collect_stats(run.store.redis, mail_keys(run.store.keys), settings)
        finally:
            await stopped(task)
            # The sender's receive, held at the gate, would never land: the pipeline's
            # shutdown would wait its 30 s out for it. Let it through to an empty queue.
            gate.opened.set()
    for status in statuses:
        assert status.dead_reason and status.dead_reason.startswith("stranded: SQS no longer held")
    assert stats.reconciled == {"handed_again": 2, "dead": 2}
    assert metrics.dead_total.labels("acme", "stranded")._value.get() == 2
    assert ses.sent_count == 0


async def test_a_parked_job_is_not_taken_for_stranded_while_its_tenant_waits(
    aredis: redis.asyncio.Redis,
) -> None:
    keys = MailKeys("t")
    limits = StoreLimits(inflight_ttl_ms=100, stranded_after_ms=1000)
    store = JobStore(aredis, keys, limits)
    stranded = StrandedJobs(aredis, keys, limits)
    await store.enqueue([NewJob(id=f"j{i}", tenant="acme", kind="mail", payload="{}") for i in range(2)])
    await store.handed_off([job.id for job in await store.claim(2)])
    assert await stranded.scan(3) == []
    # Without progress both would be stranded at this deadline (Redis's clock).
    deadlines = [await aredis.zscore(keys.dispatched(), f"j{i}") for i in range(2)]
    unparked_ms = max(d for d in deadlines if d is not None)
    # Its tenant is parked for two seconds (a quota wait): that is progress.
    await store.touch_inflight("acme", time_ms(await aredis.time()) + 2000)

    async def past_the_unparked_deadline() -> bool:
        return time_ms(await aredis.time()) > unparked_ms

    await wait_for_async(past_the_unparked_deadline, within=10, what="the deadline without the park to pass")
    # The scan is the reconciler's round, at Redis's clock: it ran after they would have been due.
    assert await stranded.scan(3) == [], "taken for stranded while its tenant waits for its quota"
    await store.finish("j0", JobState.SENT)
    await wait_for_async(lambda: stranded.scan(3), within=10, what="the other job to be stranded")
    # Its jobs, the anchor (scored +inf, dispatcher/keys.py ANCHOR) left out.
    assert await aredis.zrange(keys.dispatched(), "-inf", "(inf", byscore=True) == ["j1"]


async def test_the_dispatched_index_is_a_skiplist_its_anchor_never_due_and_gone_once_alone(
    aredis: redis.asyncio.Redis,
) -> None:
    # Kept as a listpack (up to 128 members), every hand-off and finish scanned
    # the whole index; the anchor (scored +inf) keeps it a skiplist (#41).
    keys = MailKeys("anchor")
    limits = StoreLimits(stranded_after_ms=1)
    store = JobStore(aredis, keys, limits)
    stranded = StrandedJobs(aredis, keys, limits)
    # An index an earlier version wrote (a listpack, no anchor): the hand-off turns it.
    await aredis.zadd(keys.dispatched(), {"earlier": 1})
    assert await aredis.object("encoding", keys.dispatched()) == "listpack"
    await store.enqueue([NewJob(id=f"j{i}", tenant="acme", kind="mail", payload="{}") for i in range(2)])
    await store.handed_off([job.id for job in await store.claim(2)])
    assert await aredis.object("encoding", keys.dispatched()) == "skiplist"
    assert await aredis.zscore(keys.dispatched(), ANCHOR) == float("inf")

    deadlines = [await aredis.zscore(keys.dispatched(), f"j{i}") for i in range(2)]
    due_ms = max(d for d in deadlines if d is not None)

    async def both_due() -> bool:
        return time_ms(await aredis.time()) > due_ms

    await wait_for_async(both_due, within=10, what="the jobs to be due")
    # Due, the jobs are picked; the anchor never is (nor is a job with no record: forgotten).
    assert sorted(s.job.id for s in await stranded.scan(10)) == ["j0", "j1"]
    assert await aredis.zrange(keys.dispatched(), 0, -1) == ["j0", "j1", ANCHOR]
    for job_id in ("j0", "j1"):
        await store.finish(job_id, JobState.SENT)
    # Alone, the anchor goes at the next scan: an idle store keeps no index.
    assert await aredis.zrange(keys.dispatched(), 0, -1) == [ANCHOR]
    assert await stranded.scan(10) == []
    assert not await aredis.exists(keys.dispatched())
    # A job alone in an index (written by an earlier version) stays.
    await aredis.zadd(keys.dispatched(), {"j9": 2**50})  # not due
    assert await stranded.scan(10) == []
    assert await aredis.zrange(keys.dispatched(), 0, -1) == ["j9"]


def test_stranded_after_is_derived_from_the_settings_not_the_longest_window() -> None:
    # A day window does not make a lost job wait a day: while the global quota
    # binds, the slot keeper's passes are its signs of life (mailer/daemon/slots.py).
    settings = load_settings()
    assert settings.stranded_after_seconds() == 1800 + 60 + 900
    quick = load_settings(global_limits="14/second; 50000/day", dispatcher={"inflight_ttl_seconds": 60})
    assert quick.stranded_after_seconds() == 60 + 60 + 900


async def test_jobs_were_taken_for_lost_while_no_sender_replica_was_alive(
    aredis: redis.asyncio.Redis, redis_url: str
) -> None:
    # With no sender alive nothing receives from SQS: no job can show progress,
    # so none may be taken for lost (its messages may all be there).
    keys = MailKeys("t")
    store = JobStore(aredis, keys, StoreLimits(inflight_ttl_ms=100, stranded_after_ms=300))
    await store.enqueue([NewJob(id="j0", tenant="acme", kind="mail", payload="{}")])
    await store.handed_off([job.id for job in await store.claim(1)])

    async def past_its_deadline() -> bool:
        now_ms = time_ms(await aredis.time())
        deadline = await aredis.zscore(keys.dispatched(), "j0")
        return deadline is not None and now_ms > deadline

    await wait_for_async(past_its_deadline, within=5, what="the job's deadline to pass")
    liveness = Liveness()
    running = asyncio.create_task(asyncio.sleep(3600))  # a watched task that runs
    liveness.watch({"dispatcher": running})
    assert await Heartbeat(aredis, keys, "d1", liveness, role="dispatcher").beat()
    unused = MailWorker(cast(Any, None), "unused")
    settings = load_settings(redis_url=redis_url)
    reconciler = Reconciler(store, unused, settings, may_act=lambda: sender_alive(aredis, keys))
    assert await reconciler.run_once() == ReconcileReport()
    assert "reconciled" not in await store.job("j0")
    # A sender replica beats: now a job without progress is stranded.
    assert await Heartbeat(aredis, keys, "s1", liveness, role="sender").beat()
    running.cancel()
    await asyncio.gather(running, return_exceptions=True)
    assert await sender_alive(aredis, keys)
    [picked] = await StrandedJobs(aredis, keys, store.limits).scan(3)
    assert picked.job.id == "j0" and picked.outcome == "again"
