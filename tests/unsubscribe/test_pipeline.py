"""Notification mail through the whole pipeline (SDK → Redis → dispatcher → SQS →
sender → the recording SES): its headers as SES got them, and an unsubscribe that
takes effect at once, for that address and topic only (issue #42)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import boto3
import pytest
import redis

from fairpost import AsyncMailClient
from fairpost.dispatcher.jobs import JobState
from fairpost.dispatcher.replies import text
from fairpost.mailer.daemon.mail_jobs import MailState
from fairpost.mailer.sdk.attachments import Attachment
from fairpost.mailer.sdk.keys import MailKeys
from fairpost.mailer.sdk.unsubscribes import Unsubscribes
from fairpost.mailer.testing.ses_server import SesServer
from fairpost.mailer.testing.wait import wait_for_async
from tests.outcomes.support import feed_now
from tests.support.pipeline import pipeline
from tests.unsubscribe.support import token_of, unsubscribe_settings

pytestmark = pytest.mark.usefixtures("ses_env")

ADA = "ada@example.org"


async def notify(client: AsyncMailClient, tenant: str, topic: str, **fields: Any) -> str:
    """A notification mail to Ada."""
    return await client.send(
        tenant, sender="app@acme.example", to=ADA, subject="n", text="n", stream="notification", topic=topic,
        **fields,
    )  # fmt: skip


async def states_are(client: AsyncMailClient, wanted: Mapping[str, str]) -> bool:
    return [(await client.status(job_id)).state for job_id in wanted] == list(wanted.values())


async def test_notification_mail_carries_both_headers_on_both_paths(redis_url: str, ses: SesServer) -> None:
    settings = unsubscribe_settings(redis_url)
    async with pipeline(settings), AsyncMailClient(settings) as client:
        simple = await notify(client, "acme", "comments")
        raw = await notify(client, "acme", "digest", attachments=[Attachment("a.txt", "text/plain", b"x")])
        plain = await client.send("acme", sender="app@acme.example", to=ADA, subject="t", text="t")
        sent = {simple: "sent", raw: "sent", plain: "sent"}
        await wait_for_async(lambda: states_are(client, sent), within=30, what="the three mails sent")
    by_job = {m.job_id: m for m in ses.sent}
    for job_id, topic in ((simple, "comments"), (raw, "digest")):
        mail = by_job[job_id]
        assert mail.header("List-Unsubscribe-Post") == "List-Unsubscribe=One-Click"
        assert "=?" not in (mail.header("List-Unsubscribe") or "")
        token = token_of(mail)
        assert (token.tenant, token.address, token.topic) == ("acme", ADA, topic)
    assert by_job[raw].raw_data is not None and by_job[simple].raw_data is None
    assert by_job[plain].header("List-Unsubscribe") is None
    assert by_job[plain].header("List-Unsubscribe-Post") is None


async def test_an_unsubscribe_stops_queued_notifications_of_its_topic_at_once(
    redis_url: str, ses: SesServer
) -> None:
    settings = unsubscribe_settings(redis_url)
    async with AsyncMailClient(settings) as client:
        # Queued before the unsubscribe, sent after it: not sent.
        queued = await notify(client, "acme", "comments")
        with Unsubscribes(settings) as unsubscribes:
            assert unsubscribes.add("acme", ADA.upper(), topic="comments")
            assert not unsubscribes.add("acme", ADA, topic="comments")
        async with pipeline(settings):
            later = await notify(client, "acme", "comments")
            other_topic = await notify(client, "acme", "digest")
            other_tenant = await notify(client, "globex", "comments")
            transactional = await client.send(
                "acme", sender="app@acme.example", to=ADA, subject="t", text="t"
            )
            wanted = {
                queued: MailState.SUPPRESSED, later: MailState.SUPPRESSED, other_topic: JobState.SENT,
                other_tenant: JobState.SENT, transactional: JobState.SENT,
            }  # fmt: skip
            await wait_for_async(lambda: states_are(client, wanted), within=30, what="each mail's end")
        held = await client.status(queued)
        assert (held.stream, held.priority) == ("notification", "normal")
        assert held.suppressed_reason == "unsubscribed"
        plain = await client.status(transactional)
        assert (plain.stream, plain.suppressed_reason) == ("transactional", None)
    assert sorted(m.job_id or "" for m in ses.sent) == sorted([other_topic, other_tenant, transactional])
    events = feed_now(redis.Redis.from_url(redis_url), MailKeys(settings.key_prefix))
    unsubscribed = [e for e in events if e.type == "recipient.unsubscribed"]
    assert [(e.tenant, e.data["recipient"], e.data["topic"], e.data["source"]) for e in unsubscribed] == [
        ("acme", ADA, "comments", "admin")
    ]
    assert unsubscribed[0].data["job_id"] is None
    suppressed = {e.job_id: e.data for e in events if e.type == "mail.suppressed"}
    assert suppressed[queued]["reason"] == "unsubscribed" and suppressed[later]["topic"] == "comments"


async def test_unsubscribed_from_every_topic_stops_the_tenants_notifications_only(
    redis_url: str, ses: SesServer
) -> None:
    settings = unsubscribe_settings(redis_url)
    with Unsubscribes(settings) as unsubscribes:
        assert unsubscribes.add("acme", ADA)
        assert [(u.address, u.topics, u.source) for u in unsubscribes.list("acme")] == [
            (ADA, ("*",), "admin")
        ]
    async with pipeline(settings), AsyncMailClient(settings) as client:
        digest = await notify(client, "acme", "digest")
        receipt = await client.send("acme", sender="app@acme.example", to=ADA, subject="t", text="t")
        wanted = {digest: MailState.SUPPRESSED, receipt: JobState.SENT}
        await wait_for_async(lambda: states_are(client, wanted), within=30, what="each mail's end")
    with Unsubscribes(settings) as unsubscribes:
        assert unsubscribes.remove("acme", ADA)
        assert unsubscribes.list("acme") == []


async def test_a_poison_message_in_a_notification_group_is_its_tenants_dead_letter(
    redis_url: str, ses: SesServer
) -> None:
    settings = unsubscribe_settings(redis_url)
    async with pipeline(settings) as run, AsyncMailClient(settings) as client:
        boto3.client("sqs").send_message(
            QueueUrl=run.queue_url, MessageBody="not json", MessageGroupId="acme:notification",
            MessageDeduplicationId="poison-n",
        )  # fmt: skip
        behind = await notify(client, "acme", "digest")
        await wait_for_async(lambda: states_are(client, {behind: "sent"}), within=20, what="the mail behind")
        [dead] = [text(d) for d in await run.store.redis.zrange(run.store.keys.dead(), 0, -1)]
        record = await run.store.job(dead)
    assert record["tenant"] == "acme" and record["raw_body"] == "not json"
