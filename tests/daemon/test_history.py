"""The history of sent mail (dispatcher/history.py): once a sent mail's record has
expired, its line in a day's bucket answers status() and lets SES events days
later find its tenant and keep their verdict; a bucket evicted loses history
alone; a record written whole (the previous release's, or with no history)
still answers as before.

Real redis-server and the real scripts. A record's expiry is stood in for by
deleting it (its TTL is checked first): a test does not wait out a TTL.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis.asyncio

from fairpost import AsyncMailClient, MailClient
from fairpost.config import Settings
from fairpost.dispatcher.errors import UnknownJob
from fairpost.dispatcher.history import record_of_line
from fairpost.dispatcher.jobs import JobState
from fairpost.dispatcher.keys import Keys
from fairpost.dispatcher.replies import text
from fairpost.dispatcher.store import JobStore, NewJob, StoreLimits, store_limits
from fairpost.mailer.daemon.feedback import Feedback
from fairpost.mailer.quota.reputation import ReputationBook
from fairpost.mailer.sdk.keys import MailKeys
from fairpost.mailer.sdk.status import JobStatus
from fairpost.mailer.testing.ses_publishing import ses_event, wrap
from fairpost.mailer.testing.ses_server import SentMail
from tests.daemon.test_event_records import consumer
from tests.support.pipeline import quick_settings

KEEP = 7 * 86400
DETAIL = 3600
MESSAGE_ID = "0100018c0e2a1b2c-1a2b3c4d-0000-4000-8000-00000000abcd-000000"
LIMITS = StoreLimits(default_cap=100, detail_seconds=DETAIL, history_shards=4)


def mail(job_id: str, tenant: str = "acme") -> NewJob:
    return NewJob(id=job_id, tenant=tenant, kind="mail", payload="{}", fields={"recipients": "2"})


async def sent(store: JobStore, *job_ids: str, keep: int = KEEP) -> None:
    """The jobs enqueued, claimed and recorded sent, as the sender records them."""
    await store.enqueue([mail(j) for j in job_ids])
    assert len(await store.claim(len(job_ids))) == len(job_ids)
    async with store.pipeline() as pipe:
        jobs = [(j, {"ses_message_id": MESSAGE_ID}) for j in job_ids]
        await store.finish_all(jobs, JobState.SENT, keep_seconds=keep, pipeline=pipe)
        await pipe.execute()


async def expire_record(client: redis.asyncio.Redis, keys: Keys, job_id: str, most: int = DETAIL) -> None:
    """The record's expiry, once its TTL is checked to be the detail TTL at most."""
    assert 0 < await client.ttl(keys.job(job_id)) <= most
    assert await client.delete(keys.job(job_id)) == 1


async def buckets(client: redis.asyncio.Redis, keys: MailKeys) -> list[str]:
    return sorted(text(k) for k in await client.keys(keys.history_prefix() + "*"))


@pytest.fixture
def keys(redis_url: str) -> MailKeys:
    return MailKeys("hist")


@pytest.fixture
def store(aredis: redis.asyncio.Redis, keys: MailKeys) -> JobStore:
    return JobStore(aredis, keys, LIMITS)


async def test_status_of_a_sent_mail_whose_record_expired_comes_from_its_line(
    store: JobStore, aredis: redis.asyncio.Redis, keys: MailKeys
) -> None:
    await sent(store, "j1")
    whole = JobStatus.from_record("j1", await store.job("j1"))
    await expire_record(aredis, keys, "j1")
    kept = JobStatus.from_record("j1", await store.job("j1"))
    assert (kept.state, kept.tenant_id, kept.priority, kept.recipients) == ("sent", "acme", "normal", 2)
    assert (kept.created_at, kept.dispatched_at, kept.sent_at, kept.finished_at) == (
        whole.created_at,
        whole.dispatched_at,
        whole.sent_at,
        whole.finished_at,
    )
    # What the line does not keep (docs/operations.md): the SES message id.
    assert whole.ses_message_id == MESSAGE_ID and kept.ses_message_id is None


async def test_a_days_bucket_lives_the_retention_past_the_days_end_and_a_bucket_holds_many_mails(
    store: JobStore, aredis: redis.asyncio.Redis, keys: MailKeys
) -> None:
    ids = [f"m{i}" for i in range(40)]
    await sent(store, *ids)
    names = await buckets(aredis, keys)
    assert 1 <= len(names) <= LIMITS.history_shards  # 40 mails, 4 buckets a day at most
    assert sum([await aredis.hlen(n) for n in names]) == 40
    for name in names:
        ttl = await aredis.ttl(name)
        assert KEEP < ttl <= KEEP + 86400, (name, ttl)
        assert text(await aredis.object("encoding", name)) == "listpack"


async def test_with_a_detail_ttl_as_long_as_the_retention_there_is_no_history(
    aredis: redis.asyncio.Redis, keys: MailKeys
) -> None:
    # The previous release's behaviour, and an operator's choice: the whole record.
    store = JobStore(aredis, keys, StoreLimits(default_cap=100, detail_seconds=KEEP, history_shards=4))
    await sent(store, "w1")
    assert KEEP - 5 < await aredis.ttl(keys.job("w1")) <= KEEP
    assert await buckets(aredis, keys) == []
    assert JobStatus.from_record("w1", await store.job("w1")).ses_message_id == MESSAGE_ID


async def test_a_record_written_whole_by_the_previous_release_still_answers(
    aredis: redis.asyncio.Redis, keys: MailKeys, store: JobStore
) -> None:
    # As 0.x wrote a sent mail: its record alone, with the job TTL, no line anywhere.
    record: Any = {
        "tenant": "acme",
        "state": "sent",
        "kind": "mail",
        "recipients": "1",
        "created_ms": "1795955510876",
    }
    await aredis.hset(keys.job("old"), mapping=record)
    await aredis.expire(keys.job("old"), KEEP)
    status = JobStatus.from_record("old", await store.job("old"))
    assert (status.state, status.tenant_id) == ("sent", "acme")


async def test_an_evicted_bucket_loses_history_alone_never_waiting_mail(
    store: JobStore, aredis: redis.asyncio.Redis, keys: MailKeys
) -> None:
    await sent(store, "gone")
    await store.enqueue([mail("waiting")])
    await expire_record(aredis, keys, "gone")
    # What a volatile-* policy may evict: a key with a TTL. Every one of them here.
    for raw in await aredis.keys("*"):
        if await aredis.ttl(raw) > 0:
            await aredis.delete(raw)
    with pytest.raises(UnknownJob):
        JobStatus.from_record("gone", await store.job("gone"))
    assert (await store.job("waiting"))["state"] == "queued"
    [claimed] = await store.claim(1)
    assert claimed.id == "waiting"


async def test_a_change_of_the_fewest_buckets_a_day_strands_no_line(
    store: JobStore, aredis: redis.asyncio.Redis, keys: MailKeys
) -> None:
    await sent(store, "a1")
    other = JobStore(aredis, keys, StoreLimits(default_cap=100, detail_seconds=DETAIL, history_shards=64))
    await sent(other, "a2")
    await expire_record(aredis, keys, "a1")
    await expire_record(aredis, keys, "a2")
    assert len(await buckets(aredis, keys)) <= LIMITS.history_shards
    for job_id in ("a1", "a2"):
        assert (await store.job(job_id))["state"] == "sent"
        assert (await other.job(job_id))["state"] == "sent"


async def test_a_days_buckets_are_sized_from_the_day_befores_mails(
    store: JobStore, aredis: redis.asyncio.Redis, keys: MailKeys
) -> None:
    today = await store.now_ms() // 86_400_000
    # 5,000 mails yesterday: 20 buckets of 256 today (a listpack up to 512 each).
    await aredis.hset(keys.history_days(), f"{today - 1}:n", 5000)
    await sent(store, *[f"d{i}" for i in range(30)])
    days = {text(k): text(v) for k, v in (await aredis.hgetall(keys.history_days())).items()}
    assert days[str(today)] == "20"
    assert days[f"{today}:n"] == "30"
    assert {n.rsplit(":", 2)[-2] for n in await buckets(aredis, keys)} == {str(today)}
    assert len(await buckets(aredis, keys)) > LIMITS.history_shards


async def test_days_past_the_retention_leave_the_days_map(
    store: JobStore, aredis: redis.asyncio.Redis, keys: MailKeys
) -> None:
    today = await store.now_ms() // 86_400_000
    gone, kept = today - KEEP // 86400 - 3, today - 2
    await aredis.hset(keys.history_days(), mapping={gone: 4, f"{gone}:n": 9, kept: 4, f"{kept}:n": 9})
    await sent(store, "p1")
    fields = {text(k) for k in await aredis.hkeys(keys.history_days())}
    assert fields == {str(kept), f"{kept}:n", str(today), f"{today}:n"}


def test_a_line_of_a_layout_this_version_does_not_know_is_no_record() -> None:
    assert record_of_line("2|sent|acme|future", MailKeys().history_fields()) == {}


# -- SES events days later ---------------------------------------------------------------


@pytest.fixture
def settings(redis_url: str) -> Settings:
    # A short retention and detail TTL, as an operator may set them.
    return quick_settings(redis_url, events_queue_name="events", job_ttl=3 * 86400, job_detail_ttl=600)


def event(kind: str, event_id: str, job_id: str | None) -> str:
    """An event publishing record (its mail's tags name job and tenant), or, with no
    ``job_id``, an identity notification's (no tags: only the SES message id)."""
    sent_mail = SentMail(message_id=MESSAGE_ID, from_address="app@example.com", to=("a@example.org",))
    record: dict[str, Any] = ses_event(kind, sent_mail, ["a@example.org"])
    if job_id is not None:
        record["mail"]["tags"] = {"fairpost-job-id": [job_id], "fairpost-tenant": ["acme"]}
    else:
        record["mail"].pop("tags", None)
    body = json.loads(wrap(record, "sns"))
    body["MessageId"] = event_id
    return json.dumps(body)


async def sent_long_ago(settings: Settings, client: redis.asyncio.Redis, job_id: str) -> JobStore:
    """A store on ``settings``, and the job sent through it, its SES message id indexed
    as the sender indexes it."""
    keys = MailKeys(settings.key_prefix)
    store = JobStore(client, keys, store_limits(settings))
    await sent(store, job_id, keep=settings.job_ttl)
    await client.set(keys.ses_message(MESSAGE_ID), job_id, ex=settings.ses_index_ttl)
    return store


async def test_a_complaint_days_later_finds_its_tenant_and_stays_on_the_mails_line(
    settings: Settings, aredis: redis.asyncio.Redis
) -> None:
    store = await sent_long_ago(settings, aredis, "c1")
    keys = MailKeys(settings.key_prefix)
    events = consumer(settings, aredis)
    assert await events.handle(event("Delivery", "e-1", "c1")) == "delivery"
    await expire_record(aredis, keys, "c1", most=settings.job_detail_ttl)
    assert JobStatus.from_record("c1", await store.job("c1")).delivery == "delivered"
    # Days later: no record, and no SES message id index (past FAIRPOST_SES_INDEX_TTL).
    assert 0 < await aredis.ttl(keys.ses_message(MESSAGE_ID)) <= settings.ses_index_ttl
    await aredis.delete(keys.ses_message(MESSAGE_ID))
    assert await events.handle(event("Complaint", "e-2", "c1")) == "complaint"
    assert JobStatus.from_record("c1", await store.job("c1")).delivery == "complained"
    assert await aredis.hexists(keys.suppressed("acme"), "a@example.org")
    feed: Any = await aredis.xrange(keys.outcomes())
    entries = [{text(k): text(v) for k, v in e.items()} for _, e in feed]
    [entry] = [e for e in entries if e.get("type") == "mail.complained"]
    assert (entry["job"], entry["tenant"]) == ("c1", "acme")


async def test_an_event_without_tags_finds_its_mail_while_the_index_lives(
    settings: Settings, aredis: redis.asyncio.Redis
) -> None:
    store = await sent_long_ago(settings, aredis, "b1")
    await expire_record(aredis, store.keys, "b1", most=settings.job_detail_ttl)
    assert await consumer(settings, aredis).handle(event("Bounce", "e-1", None)) == "bounce"
    status = JobStatus.from_record("b1", await store.job("b1"))
    assert (status.delivery, status.bounce_type) == ("bounced", "Permanent")


async def test_a_permanent_bounce_days_later_is_counted_at_its_mails_send_number(
    settings: Settings, aredis: redis.asyncio.Redis
) -> None:
    # The sender numbers a mail (send_seq.lua) in the pipeline before it records the
    # send, so the line keeps the number: a late bounce counts among the right sends.
    keys = MailKeys(settings.key_prefix)
    store = JobStore(aredis, keys, store_limits(settings))
    book = ReputationBook(aredis, keys, settings)
    feedback = Feedback(store=store, settings=settings, book=book)
    await store.enqueue([mail("n1")])
    await store.claim(1)
    async with aredis.pipeline(transaction=False) as pipe:
        await aredis.set(keys.send_seq("acme"), 40)
        await feedback.index_sent(pipe, "acme", [("n1", MESSAGE_ID, 2)])
        await store.finish_all(
            [("n1", {"ses_message_id": MESSAGE_ID})],
            JobState.SENT,
            keep_seconds=settings.job_ttl,
            pipeline=pipe,
        )
        await pipe.execute()
    await expire_record(aredis, keys, "n1", most=settings.job_detail_ttl)
    assert (await store.job("n1"))["send_seq"] == "42"
    await aredis.set(keys.send_seq("acme"), 100)  # sends since; an unknown number would count as 100
    assert await consumer(settings, aredis).handle(event("Bounce", "e-1", "n1")) == "bounce"
    bounced: Any = await aredis.zrange(keys.recent_bounces("acme"), 0, -1, withscores=True)
    scores = {score for _, score in bounced}
    assert scores == {42.0}


async def test_the_sdks_status_and_the_consoles_read_the_line_past_the_record(
    settings: Settings, aredis: redis.asyncio.Redis, client: MailClient, aclient: AsyncMailClient
) -> None:
    # The console's job page is AsyncMailClient.status (mailer/console/data.py).
    store = await sent_long_ago(settings, aredis, "s1")
    await expire_record(aredis, store.keys, "s1", most=settings.job_detail_ttl)
    assert (client.status("s1").state, client.status("s1").tenant_id) == ("sent", "acme")
    assert (await aclient.status("s1")).recipients == 2
    with pytest.raises(UnknownJob):
        client.status("never-sent")
