"""The outcome feed as the scripts write it: one event per state change, in the same
script as the change, with the format of docs/outcomes.md, trimmed by length and age.

A real redis-server, the real scripts (dispatcher/journal.lua in finish, cancel
and dead_letter), the store and lifecycle the daemon and the SDK use.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
import redis
import redis.asyncio

from fairpost.config import Settings, load_settings
from fairpost.dispatcher.jobs import JobState
from fairpost.dispatcher.store import JobStore, NewJob, store_limits
from fairpost.mailer.daemon.mail_jobs import MailJobs
from fairpost.mailer.sdk.keys import MailKeys
from fairpost.mailer.sdk.outcomes import feed
from fairpost.mailer.sdk.outcomes.feed import EVENT_TYPES, Outcome, from_entry
from tests.outcomes.support import feed_now, feed_of

KEYS = MailKeys()


def job(job_id: str, *, key: str | None = None, tenant: str = "acme") -> NewJob:
    return NewJob(id=job_id, tenant=tenant, kind="mail", payload="{}", idempotency_key=key)


async def dispatched(store: JobStore, *jobs: NewJob) -> None:
    """Jobs enqueued, claimed and handed off, as the dispatcher leaves them for the sender."""
    await store.enqueue(list(jobs))
    claimed = await store.claim(len(jobs))
    assert sorted(j.id for j in claimed) == sorted(j.id for j in jobs)
    await store.handed_off([j.id for j in claimed])


async def test_a_sent_mail_is_one_event_with_its_ses_message_id_and_recipients(
    settings: Settings, aredis: redis.asyncio.Redis
) -> None:
    store = JobStore(aredis, KEYS, store_limits(settings))
    await dispatched(store, job("j1", key="order-7"), job("j2"))
    events = {
        "j1": feed.entry(feed.SENT, {"ses_message_id": "ses-1", "recipients": ["ada@example.org"]}),
        "j2": feed.entry(feed.SENT, {"ses_message_id": "ses-2", "recipients": ["bo@example.org"]}),
    }
    async with store.pipeline() as pipe:
        await MailJobs(store).record_sent(
            [("j1", "ses-1"), ("j2", "ses-2")], keep_seconds=60, pipeline=pipe, entries=events
        )
        await pipe.execute()
    [one, two] = await feed_of(aredis, KEYS)
    assert one.type == two.type == "mail.sent"
    assert one.data == {
        "job_id": "j1",
        "tenant_id": "acme",
        "idempotency_key": "order-7",
        "ses_message_id": "ses-1",
        "recipients": ["ada@example.org"],
    }
    assert two.data["idempotency_key"] is None and two.data["ses_message_id"] == "ses-2"
    # The id is the stream entry's, its time Redis's.
    server_ms = int((await aredis.time())[0]) * 1000
    assert abs(one.timestamp.timestamp() * 1000 - server_ms) < 5000
    assert one.id.split("-")[0] == str(int(one.timestamp.timestamp() * 1000))


async def test_a_group_sent_together_costs_an_append_each_and_one_trim(
    settings: Settings, aredis: redis.asyncio.Redis
) -> None:
    # A shard's capacity is in commands a mail (bench/shard_replay.py): the record's
    # copied fields come with the finish's own read of it, and the feed is trimmed by
    # age once a call (every entry of a call has the call's time), not once an entry.
    store = JobStore(aredis, KEYS, store_limits(settings))
    jobs = [job(f"j{i}", key=f"k{i}") for i in range(10)]
    await dispatched(store, *jobs)
    events = {j.id: feed.entry(feed.SENT, {"ses_message_id": f"ses-{j.id}"}) for j in jobs}
    await aredis.config_resetstat()
    async with store.pipeline() as pipe:
        sent = [(j.id, f"ses-{j.id}") for j in jobs]
        await MailJobs(store).record_sent(sent, keep_seconds=60, pipeline=pipe, entries=events)
        await pipe.execute()
    stats = await aredis.info("commandstats")
    calls = {name: stats.get(f"cmdstat_{name}", {}).get("calls", 0) for name in ("xadd", "xtrim", "hmget")}
    assert calls == {"xadd": 10, "xtrim": 1, "hmget": 10}
    assert [(e.job_id, e.data["idempotency_key"]) for e in await feed_of(aredis, KEYS)] == [
        (j.id, f"k{j.id[1:]}") for j in jobs
    ]


async def test_a_finish_that_changes_nothing_appends_nothing(
    settings: Settings, aredis: redis.asyncio.Redis
) -> None:
    # A record written again after a lost answer (send._record retries) is no new outcome.
    store = JobStore(aredis, KEYS, store_limits(settings))
    await dispatched(store, job("j1"))
    for _ in range(3):
        async with store.pipeline() as pipe:
            await MailJobs(store).record_sent([("j1", "ses-1")], keep_seconds=60, pipeline=pipe)
            await pipe.execute()
    assert await store.finish("nobody", JobState.DEAD, fields={"dead_reason": "x"}) == -1
    assert [e.type for e in await feed_of(aredis, KEYS)] == ["mail.sent"]


async def test_dead_letters_of_every_path_are_mail_dead_with_their_reason(
    settings: Settings, aredis: redis.asyncio.Redis
) -> None:
    store = JobStore(aredis, KEYS, store_limits(settings))
    await dispatched(store, job("j1", key="k1"))
    # The runner, the reconciler and the sender's endings all finish through the store.
    await store.finish("j1", JobState.DEAD, keep_seconds=60, fields={"dead_reason": "rejected by SES"})
    # A job without a record (an unreadable SQS message) is written whole, with its event.
    await MailJobs(store).record_dead(
        "poison-1", "acme", "unreadable SQS message: not JSON", "{", keep_seconds=60
    )
    [dead, poison] = await feed_of(aredis, KEYS)
    assert (dead.type, dead.data["reason"], dead.data["idempotency_key"]) == (
        "mail.dead",
        "rejected by SES",
        "k1",
    )
    assert (poison.type, poison.tenant, poison.job_id) == ("mail.dead", "acme", "poison-1")
    assert poison.data["reason"] == "unreadable SQS message: not JSON"


def test_a_cancelled_job_is_mail_cancelled_once(settings: Settings, redis_client: redis.Redis) -> None:
    from fairpost import MailClient

    with MailClient(settings) as client:
        job_id = client.send(
            "acme",
            sender="app@example.com",
            to=["ada@example.org"],
            subject="s",
            text="t",
            idempotency_key="k9",
        )
        assert client.cancel(job_id) == "queued"
        assert client.cancel(job_id) == "dead"  # idempotent: no second event
    events = feed_now(redis_client, KEYS)
    assert [(e.type, e.job_id, e.tenant) for e in events] == [("mail.cancelled", job_id, "acme")]
    assert events[0].data["idempotency_key"] == "k9" and events[0].data["reason"] == "cancelled"


async def test_no_event_is_written_with_the_feed_off(redis_url: str, aredis: redis.asyncio.Redis) -> None:
    settings = load_settings(redis_url=redis_url, outcomes={"enabled": False})
    store = JobStore(aredis, KEYS, store_limits(settings))
    await dispatched(store, job("j1"), job("j2"))
    await store.finish("j1", JobState.DEAD, fields={"dead_reason": "x"})
    async with store.pipeline() as pipe:
        await MailJobs(store).record_sent([("j2", "s")], keep_seconds=60, pipeline=pipe)
        await pipe.execute()
    assert (await store.job("j2"))["state"] == "sent"
    assert not await aredis.exists(KEYS.outcomes())


async def feed_of_1000_and_2500_jobs(
    redis_url: str, aredis: redis.asyncio.Redis
) -> tuple[JobStore, list[NewJob]]:
    """A store whose feed keeps 1,000 entries, and 2,500 jobs enqueued in it."""
    settings = load_settings(redis_url=redis_url, outcomes={"max_length": 1000})
    store = JobStore(aredis, KEYS, store_limits(settings))
    jobs = [job(f"j{i}") for i in range(2500)]
    for start in range(0, len(jobs), 500):
        await store.enqueue(jobs[start : start + 500])
    return store, jobs


async def test_the_feed_is_trimmed_to_its_length(redis_url: str, aredis: redis.asyncio.Redis) -> None:
    store, jobs = await feed_of_1000_and_2500_jobs(redis_url, aredis)
    for start in range(0, len(jobs), 100):
        for j in jobs[start : start + 100]:
            await store.finish(j.id, JobState.DEAD, fields={"dead_reason": "x"})
    length = await aredis.xlen(KEYS.outcomes())
    # MAXLEN ~ trims whole nodes of 100 entries: never below the length, at most a node above.
    assert 1000 <= length <= 1100
    assert (await feed_of(aredis, KEYS))[-1].job_id == "j2499"


async def test_the_feed_is_trimmed_to_its_length_by_calls_of_many_jobs(
    redis_url: str, aredis: redis.asyncio.Redis
) -> None:
    # A finish of many jobs trims once, with its last append or (its last job
    # unknown, no entry for it) after them: to the same length as a trim after each.
    store, jobs = await feed_of_1000_and_2500_jobs(redis_url, aredis)
    for start in range(0, len(jobs), 250):
        batch = [(j.id, {"dead_reason": "x"}) for j in jobs[start : start + 250]]
        if start % 500:
            batch.append(("no-such-job", {}))
        async with store.pipeline() as pipe:
            await store.finish_all(batch, JobState.DEAD, keep_seconds=0, pipeline=pipe)
            await pipe.execute()
        length = await aredis.xlen(KEYS.outcomes())
        # MAXLEN ~ trims whole nodes of 100 entries: never below the length, at most a node above.
        assert min(start + 250, 1000) <= length <= 1100
    assert (await feed_of(aredis, KEYS))[-1].job_id == "j2499"


async def test_events_older_than_the_age_are_trimmed(redis_url: str, aredis: redis.asyncio.Redis) -> None:
    settings = load_settings(redis_url=redis_url, outcomes={"max_age": "1h"})
    store = JobStore(aredis, KEYS, store_limits(settings))
    # Events of two hours ago (explicit ids: their time), two full stream nodes of them.
    old_ms = int((await aredis.time())[0]) * 1000 - 2 * 3600 * 1000
    for i in range(200):
        await aredis.xadd(KEYS.outcomes(), {"job": f"old{i}", "state": "sent"}, id=f"{old_ms}-{i}")
    await store.enqueue([job("new")])
    await store.finish("new", JobState.DEAD, fields={"dead_reason": "x"})
    assert [e.job_id for e in await feed_of(aredis, KEYS)] == ["new"]


def test_an_event_reads_as_its_documented_body() -> None:
    event = from_entry(
        "1714567890123-4",
        {"job": "j1", "state": "dead", "tenant": "acme", "dead_reason": "cancelled"},
    )
    assert event is not None
    assert json.loads(event.body()) == {
        "type": "mail.cancelled",
        "timestamp": "2024-05-01T12:51:30.123Z",
        "data": {
            "job_id": "j1",
            "tenant_id": "acme",
            "idempotency_key": None,
            "ses_message_id": None,
            "reason": "cancelled",
        },
    }
    assert event.timestamp == datetime(2024, 5, 1, 12, 51, 30, 123000, tzinfo=UTC)
    # The same entry reads as the same body, byte for byte: a retry is the same delivery.
    again = from_entry(
        "1714567890123-4", {"job": "j1", "state": "dead", "tenant": "acme", "dead_reason": "cancelled"}
    )
    assert again is not None and again.body() == event.body()


@pytest.mark.parametrize(
    "fields",
    [{}, {"state": "sent"}, {"job": "j1"}, {"job": "j1", "state": "claimed"}],
    ids=["trimmed", "no job", "no type", "not an outcome"],
)
def test_an_entry_that_is_no_event_reads_as_none(fields: dict[str, str]) -> None:
    assert from_entry("1-0", fields) is None


def test_the_mail_side_writes_only_known_types() -> None:
    with pytest.raises(ValueError, match="unknown event type"):
        feed.entry("mail.opened", {})
    assert set(EVENT_TYPES) == {
        "mail.sent", "mail.delivered", "mail.delayed", "mail.bounced", "mail.complained",
        "mail.rejected", "mail.suppressed", "mail.dead", "mail.cancelled", "mail.held",
        "recipient.unsubscribed",
    }  # fmt: skip
    assert isinstance(from_entry("1-0", feed.entry(feed.BOUNCED, {}) | {"job": "j"}), Outcome)
