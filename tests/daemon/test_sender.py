"""The sender end to end: SDK → Redis → dispatcher → SQS (moto, over HTTP) → quota → SES.

SES is the recording fake in mailer/testing/ses_server.py (moto's SES v2 cannot
answer errors or report the arrival time of each send).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import boto3
import pytest

from fairpost import AsyncMailClient
from fairpost.dispatcher.jobs import JobState
from fairpost.mailer.daemon import endings
from fairpost.mailer.daemon.sender import Received
from fairpost.mailer.ops.queue_setup import init_queue
from fairpost.mailer.sdk.envelope import encode
from fairpost.mailer.sdk.mail import Mail, validate
from fairpost.mailer.testing.ses_server import Faults, SesServer
from fairpost.mailer.testing.wait import wait_for_async
from tests.support import message_body
from tests.support.pipeline import pipeline, quick_settings, sender_only

# Every test here runs the pipeline against moto (SQS) and the recording SES.
pytestmark = pytest.mark.usefixtures("ses_env")


def mail(i: int, recipients: int = 1) -> Mail:
    return Mail(
        sender="app@example.com",
        to=[f"user{i}.{r}@example.org" for r in range(recipients)],
        subject=f"m{i}",
        text="hi",
    )


async def test_a_tenant_over_quota_pauses_alone(redis_url: str, ses: SesServer) -> None:
    settings = quick_settings(
        redis_url, tenants={"noisy": {"limits": "4/second"}}, tenant_limits="100/second", inflight_cap=10
    )
    async with pipeline(settings) as run, AsyncMailClient(settings) as client:
        noisy = await client.send_many("noisy", [mail(i) for i in range(16)])
        quiet = [
            await client.send(
                f"quiet{t}", sender="app@example.com", to=["x@example.org"], subject="q", text="q"
            )
            for t in range(3)
        ]
        await wait_for_async(lambda: all_sent(client, quiet), within=30, what="the quiet tenants' mail")
        await wait_for_async(lambda: all_sent(client, noisy), within=30, what="the noisy tenant's mail")
    by_tenant = ses.max_in_window_by(1.0, key=lambda m: m.tag("fairpost-tenant"))
    assert by_tenant["noisy"] <= 4
    # Enqueued behind the noisy tenant's 16, the quiet mails still reach SES before its
    # ninth, which its quota holds until two seconds after its first: the quiet ones
    # did not wait behind it. Measured against the noisy tenant's own pace, not a
    # clock a loaded machine can use up.
    noisy_at = sorted(m.monotonic for m in ses.sent if m.tag("fairpost-tenant") == "noisy")
    quiet_at = [m.monotonic for m in ses.sent if m.tag("fairpost-tenant") != "noisy"]
    assert len(quiet_at) == 3 and max(quiet_at) < noisy_at[8], (quiet_at, noisy_at)
    # Each noisy mail is received about once per quota window it waits, not in a loop.
    noisy_receives = sum(1 for _, body in run.receives.bodies if '"tenant":"noisy"' in body)
    assert noisy_receives <= 16 * 3, noisy_receives
    # Every mail went out exactly once.
    assert sorted(m.job_id or "" for m in ses.sent) == sorted(noisy + quiet)


async def all_sent(client: AsyncMailClient, ids: list[str]) -> bool:
    states = [(await client.status(i)).state for i in ids]
    return all(state == JobState.SENT for state in states)


async def test_the_global_quota_pauses_everyone_and_nothing_is_received_meanwhile(
    redis_url: str, ses: SesServer
) -> None:
    """The promise is the sender's own decision: it receives only right after its gate
    found the global quota free (or no hold), never while the gate is closed. (What
    the quota holds at the receive itself is no measure: the sender's own timed
    retries may take the free units in between.)"""
    settings = quick_settings(redis_url, global_limits="5/second", inflight_cap=10)
    events: list[tuple[str, float]] = []

    async def record_receive() -> None:
        events.append(("receive", 0.0))

    async with pipeline(settings, before_receive=record_receive) as run, AsyncMailClient(settings) as client:
        run.sender.gate.observer = lambda wait: events.append(("gate", wait))
        ids = []
        for tenant in ("a", "b", "c"):
            ids += await client.send_many(tenant, [mail(i) for i in range(6)])
        await wait_for_async(lambda: all_sent(client, ids), within=20, what="all mail")
    assert ses.max_in_window(1.0) <= 5
    observed = events[next(i for i, (what, _) in enumerate(events) if what == "gate") :]
    received_after = [observed[i - 1] for i, (what, _) in enumerate(observed) if what == "receive" and i > 0]
    assert received_after, "no receive was observed"
    assert all(before == ("gate", 0.0) for before in received_after), (
        "the sender received without its gate opening just before"
    )
    assert any(what == "gate" and wait > 0 for what, wait in observed), "the gate never closed"
    assert sorted(m.job_id or "" for m in ses.sent) == sorted(ids)


async def test_quotas_count_recipients(redis_url: str, ses: SesServer) -> None:
    settings = quick_settings(redis_url, tenant_limits="6/second")
    async with pipeline(settings), AsyncMailClient(settings) as client:
        ids = await client.send_many("acme", [mail(i, recipients=3) for i in range(6)])
        await wait_for_async(lambda: all_sent(client, ids), within=15, what="all mail")
    assert ses.max_in_window(1.0) <= 6
    assert ses.recipients_sent == 18


@pytest.mark.parametrize(
    ("fault", "final", "attempts"),
    [
        (Faults.TOO_MANY_REQUESTS, JobState.SENT, 0),
        (Faults.LIMIT_EXCEEDED, JobState.SENT, 0),
        (Faults.SENDING_PAUSED, JobState.SENT, 0),
        (Faults.ACCOUNT_SUSPENDED, JobState.SENT, 0),
        (Faults.INTERNAL_FAILURE, JobState.SENT, 1),
        (Faults.PLAIN_503, JobState.SENT, 1),
        (Faults.DROP_CONNECTION, JobState.SENT, 1),
        (Faults.MESSAGE_REJECTED, JobState.DEAD, 0),
        (Faults.MAIL_FROM_DOMAIN_NOT_VERIFIED, JobState.SENT, 0),  # its identity: held, then sent
        (Faults.BAD_REQUEST, JobState.DEAD, 0),
    ],
    ids=lambda v: getattr(v, "code", None) or str(v),
)
async def test_each_ses_error_class_ends_as_designed(
    redis_url: str, ses: SesServer, fault: Any, final: str, attempts: int
) -> None:
    # Two mails a minute. A call SES refused outright gives its units back; one
    # that failed in a way that leaves it unknown whether SES has the mail (5xx,
    # network) keeps them counted. Either way the retry fits within the minute.
    settings = quick_settings(redis_url, tenant_limits="2/minute")
    ses.fail_next(1, fault)
    async with pipeline(settings) as run, AsyncMailClient(settings) as client:
        job_id = await client.send(
            "acme", sender="app@example.com", to=["ada@example.org"], subject="s", text="t"
        )
        await wait_for_async(
            lambda: state_is(client, job_id, final), within=20, what=f"the job to end {final}"
        )
        status = await client.status(job_id)
        # Whatever happened, the tenant's in-flight slot came back and nothing is left in SQS.
        await wait_for_async(lambda: queue_is_empty(run.queue_url), within=10, what="an empty queue")
        assert await run.store.redis.zcard(run.store.keys.inflight("acme")) == 0
        # What SES accepted counts, and what it may have: a transient failure too.
        usage = await run.quota.usage("acme", settings.limits_for("acme"))
        assert [used for _, used in usage] == [attempts + (1 if final == JobState.SENT else 0)]
    assert status.attempts == attempts
    if final == JobState.DEAD:
        assert status.dead_reason and fault.code in status.dead_reason
        assert ses.sent_count == 0
    else:
        assert [m.job_id for m in ses.sent] == [job_id]
        assert status.ses_message_id == ses.sent[0].message_id
    if fault in (Faults.TOO_MANY_REQUESTS, Faults.LIMIT_EXCEEDED):
        assert status.throttled >= 1


async def state_is(client: AsyncMailClient, job_id: str, state: str) -> bool:
    return (await client.status(job_id)).state == state


def queue_is_empty(url: str) -> bool:
    attrs: dict[str, str] = boto3.client("sqs").get_queue_attributes(
        QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
    )["Attributes"]
    return (
        attrs["ApproximateNumberOfMessages"] == "0" and attrs["ApproximateNumberOfMessagesNotVisible"] == "0"
    )


async def test_transient_errors_dead_letter_after_max_attempts(redis_url: str, ses: SesServer) -> None:
    settings = quick_settings(
        redis_url,
        sender={
            "wait_seconds": 1,
            "receivers": 1,
            "backoff_base_seconds": 1,
            "max_attempts": 2,
            "max_jitter_seconds": 0,
        },
    )
    ses.fail_next(5, Faults.INTERNAL_FAILURE)
    async with pipeline(settings), AsyncMailClient(settings) as client:
        job_id = await client.send(
            "acme", sender="app@example.com", to=["ada@example.org"], subject="s", text="t"
        )
        await wait_for_async(lambda: state_is(client, job_id, JobState.DEAD), within=20, what="a dead letter")
        status = await client.status(job_id)
    assert status.attempts == 2
    assert status.dead_reason and "after 2 attempts" in status.dead_reason
    assert ses.sent_count == 0


async def test_a_job_already_sent_is_not_sent_again(redis_url: str, ses: SesServer) -> None:
    # A day's window: what the tenant's quota counts at the end is the run's whole.
    settings = quick_settings(redis_url, tenant_limits="1000/day")
    async with pipeline(settings) as run, AsyncMailClient(settings) as client:
        job_id = await client.send(
            "acme", sender="app@example.com", to=["ada@example.org"], subject="s", text="t"
        )
        await wait_for_async(
            lambda: state_is(client, job_id, JobState.SENT), within=10, what="the first send"
        )
        # Its SQS message comes back (a crash between SES and the delete, say).
        record = await run.store.job(job_id)
        _, payload = validate(mail(0), max_bytes=100_000)
        body = encode(job_id, "acme", int(record["created_ms"]), payload)
        sqs = boto3.client("sqs")
        sqs.send_message(QueueUrl=run.queue_url, MessageBody=body, MessageGroupId="acme",
                         MessageDeduplicationId=job_id + "-again")  # fmt: skip
        await wait_for_async(
            lambda: queue_is_empty(run.queue_url), within=10, what="the redelivery to be consumed"
        )
        # The redelivery's claim found it sent (send_claim.lua): its units went back.
        assert [n for _, n in await run.quota.usage("acme", settings.limits_for("acme"))] == [1]
    assert [m.job_id for m in ses.sent] == [job_id]


async def test_a_poison_message_is_dead_lettered_and_does_not_block_its_group(
    redis_url: str, ses: SesServer
) -> None:
    settings = quick_settings(redis_url)
    async with pipeline(settings) as run, AsyncMailClient(settings) as client:
        sqs = boto3.client("sqs")
        for i, body in enumerate(["not json", '{"v": "2"}', '{"v": 1, "job_id": "x"}']):
            sqs.send_message(QueueUrl=run.queue_url, MessageBody=body, MessageGroupId="acme",
                             MessageDeduplicationId=f"poison{i}")  # fmt: skip
        job_id = await client.send(
            "acme", sender="app@example.com", to=["ada@example.org"], subject="s", text="t"
        )
        await wait_for_async(
            lambda: state_is(client, job_id, JobState.SENT), within=10, what="the good mail behind poison"
        )
        dead = [str(d, "utf-8") for d in await run.store.redis.zrange(run.store.keys.dead(), 0, -1)]  # type: ignore[arg-type]
        assert len(dead) == 3
        records = [await run.store.job(d) for d in dead]
        reasons = sorted(r["dead_reason"] for r in records)
        raw = sorted(r["raw_body"] for r in records)
    assert any("not JSON" in r for r in reasons)
    assert any("unknown envelope version '2'" in r for r in reasons)
    assert any("missing or malformed" in r for r in reasons)
    assert raw == sorted(["not json", '{"v": "2"}', '{"v": 1, "job_id": "x"}'])


async def test_a_body_a_newer_fairpost_wrote_stays_in_sqs_for_a_newer_reader(
    redis_url: str, ses: SesServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Never deleted, acknowledged or dead-lettered by this reader (#38): it comes back
    to this sender again and again (each time counted, with both versions) and a
    newer reader finds it in SQS after this one stopped."""
    monkeypatch.setattr(endings, "NEWER_FORMAT_SECONDS", 1.0)
    settings = quick_settings(redis_url)
    future = json.dumps({"v": 3, "job_id": "future-1", "tenant": "acme", "created_ms": 1, "later": {}})
    async with pipeline(settings) as run, AsyncMailClient(settings) as client:
        sqs = boto3.client("sqs")
        sqs.send_message(QueueUrl=run.queue_url, MessageBody=future, MessageGroupId="future",
                         MessageDeduplicationId="future-1")  # fmt: skip
        job_id = await client.send(
            "acme", sender="app@example.com", to=["ada@example.org"], subject="s", text="t"
        )
        await wait_for_async(lambda: state_is(client, job_id, JobState.SENT), within=10, what="the mail")

        async def received_twice() -> bool:
            return sum(1 for _, body in run.receives.bodies if body == future) >= 2

        await wait_for_async(received_twice, within=20, what="the newer body to come back")
        assert await run.store.redis.zcard(run.store.keys.dead()) == 0
        assert run.metrics is not None
        counted = run.metrics.newer_format_total.labels("sqs_body", "3", "2")._value.get()
        assert counted >= 2
    # This sender stopped: a newer reader receives it from SQS.
    found: list[str] = []

    async def still_in_sqs() -> bool:
        got = sqs.receive_message(QueueUrl=run.queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=1)
        found.extend(m["Body"] for m in got.get("Messages", []))
        return future in found

    await wait_for_async(still_in_sqs, within=20, what="the newer body, still in SQS")
    assert [m.job_id for m in ses.sent] == [job_id]


async def test_one_job_received_twice_at_once_is_sent_once(redis_url: str, ses: SesServer) -> None:
    """Two receivers holding copies of one job's message (moto's unlocked receive,
    a visibility that ran out mid-send) race; the sending marker lets one win."""
    settings = quick_settings(redis_url)
    ses.latency = 0.5  # both copies are at SES's door together
    url, _ = init_queue(boto3.client("sqs"), settings)
    async with AsyncMailClient(settings) as client, sender_only(settings, url) as sender:
        job_id = await client.send(
            "acme", sender="app@example.com", to=["ada@example.org"], subject="s", text="t"
        )
        body = await message_body(sender.store.redis, job_id, sender.keys)
        sqs = boto3.client("sqs")
        for copy in ("a", "b"):
            sqs.send_message(QueueUrl=url, MessageBody=body, MessageGroupId=f"copy-{copy}",
                             MessageDeduplicationId=f"{job_id}-{copy}")  # fmt: skip
        got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=60)["Messages"]
        assert len(got) == 2
        copies = [Received(message_id=m["MessageId"], receipt=m["ReceiptHandle"], group="", body=m["Body"])
                  for m in got]  # fmt: skip
        await asyncio.gather(sender.process([copies[0]]), sender.process([copies[1]]))
        assert (await client.status(job_id)).state == JobState.SENT
    assert [m.job_id for m in ses.sent] == [job_id]


async def test_a_deep_backlog_is_sent_at_its_quota_and_never_over(redis_url: str, ses: SesServer) -> None:
    # How close to the quota it gets is a benchmark figure (bench/), not a timed test.
    settings = quick_settings(redis_url, tenant_limits="10/second", inflight_cap=20)
    async with pipeline(settings), AsyncMailClient(settings) as client:
        ids = await client.send_many("deep", [mail(i) for i in range(60)])
        await wait_for_async(lambda: all_sent(client, ids), within=30, what="the backlog")
    times = sorted(m.monotonic for m in ses.sent)
    # 60 mails at 10 a second need 5 whole windows after the first send.
    assert times[-1] - times[0] >= 5.0 - 0.1, "faster than the quota allows"
    assert ses.max_in_window(1.0) <= 10


async def test_an_unreadable_message_that_names_its_job_ends_that_job_dead(
    redis_url: str, ses: SesServer
) -> None:
    settings = quick_settings(redis_url)
    url, _ = init_queue(boto3.client("sqs"), settings)
    async with AsyncMailClient(settings) as client, sender_only(settings, url) as sender:
        job_id = await client.send(
            "acme", sender="app@example.com", to=["ada@example.org"], subject="s", text="t"
        )
        # An envelope of no version any fairpost wrote (a newer one's is left in SQS instead).
        body = json.dumps({"v": 0, "job_id": job_id, "tenant": "acme"})
        await sender.process([Received(message_id="m1", receipt="r1", group="acme", body=body)])
        status = await client.status(job_id)
    assert status.state == JobState.DEAD
    assert status.dead_reason and "unknown envelope version 0" in status.dead_reason
    assert ses.sent_count == 0


def test_ses_error_text_never_carries_an_address() -> None:
    from botocore.exceptions import ClientError

    from fairpost.mailer.daemon.ses import classify

    error = ClientError(
        {
            "Error": {
                "Code": "MessageRejected",
                "Message": "Email address is not verified. The following identities failed the check: "
                "ada@example.org, Bob <bob@example.net>",
            },
            "ResponseMetadata": {"HTTPStatusCode": 400},
        },
        "SendEmail",
    )
    result = classify(error)
    assert result.error is not None and "MessageRejected" in result.error
    assert "@" not in result.error
