"""The job record's layout (dispatcher/record.py) on a redis-server with Redis's
default configuration: a waiting 1 KB mail's record stays a listpack, its
payload (a key of its own) reads back whole wherever a script hands it on,
goes when the record goes, and a record written by an earlier fairpost (the
payload in the hash) still goes out."""

from __future__ import annotations

import redis.asyncio

from dispatcher.jobs import JobState
from dispatcher.lifecycle import Lifecycle, SyncLifecycle
from dispatcher.replies import text
from dispatcher.store import JobStore, NewJob, StoreLimits
from dispatcher.stranded import StrandedJobs
from tests.support import KEYS

PAYLOAD = '{"subject":"Grüße","text":"' + ("Ünïcödé → 東京 🚀 " * 60)[:900] + '"}'
LIMITS = StoreLimits(default_weight=1, default_cap=100, lease_ms=30_000)


def make_store(client: redis.asyncio.Redis) -> JobStore:
    return JobStore(client, KEYS, LIMITS)


def job(job_id: str, payload: str = PAYLOAD) -> NewJob:
    return NewJob(id=job_id, tenant="acme", kind="mail", payload=payload, fields={"recipients": "1"})


async def keys_of(client: redis.asyncio.Redis, job_id: str) -> list[str]:
    """Every key that names the job."""
    return sorted(text(k) for k in await client.keys(f"*:{job_id}"))


async def test_a_waiting_1kb_job_stays_a_listpack_under_the_default_config(
    aredis: redis.asyncio.Redis,
) -> None:
    assert await aredis.config_get("hash-max-listpack-value") == {"hash-max-listpack-value": "64"}
    store = make_store(aredis)
    await store.enqueue([job("j1")])
    assert await aredis.object("encoding", KEYS.job("j1")) == "listpack"
    assert await keys_of(aredis, "j1") == [KEYS.job("j1"), KEYS.payload("j1")]
    assert await aredis.get(KEYS.payload("j1")) == PAYLOAD
    assert (await store.job("j1"))["payload"] == PAYLOAD


async def test_the_payload_reads_back_whole_where_a_script_hands_it_on(aredis: redis.asyncio.Redis) -> None:
    store = make_store(aredis)
    await store.enqueue([job("j1")])
    [claimed] = await store.claim(1)
    assert claimed.payload == PAYLOAD
    # Stranded in SQS: the reconciler hands the same payload again.
    await store.handed_off(["j1"])
    await aredis.zadd(KEYS.dispatched(), {"j1": 0})
    [stranded] = await StrandedJobs(aredis, KEYS, LIMITS).scan(handoffs_allowed=3)
    assert stranded.job.payload == PAYLOAD


async def test_a_sent_job_keeps_no_payload_and_a_dead_one_keeps_it_with_its_record(
    aredis: redis.asyncio.Redis,
) -> None:
    store = make_store(aredis)
    await store.enqueue([job("sent"), job("dead")])
    await store.claim(2)
    await store.finish("sent", JobState.SENT, keep_seconds=600, fields={"ses_message_id": "m1"})
    await store.finish("dead", JobState.DEAD, keep_seconds=600, fields={"dead_reason": "x"})
    assert await keys_of(aredis, "sent") == [KEYS.job("sent")]
    assert "payload" not in await store.job("sent")
    # A dead letter keeps it (replayable) for as long as its record, and no longer.
    assert (await store.job("dead"))["payload"] == PAYLOAD
    assert 0 < await aredis.ttl(KEYS.payload("dead")) <= 600
    assert 0 < await aredis.ttl(KEYS.job("dead")) <= 600


async def test_a_cancelled_job_keeps_its_payload_only_as_long_as_its_record(
    aredis: redis.asyncio.Redis,
) -> None:
    store = make_store(aredis)
    await store.enqueue([job("c1")])
    await Lifecycle(aredis, KEYS, LIMITS).cancel("c1", keep_seconds=600)
    assert (await store.job("c1"))["payload"] == PAYLOAD
    assert 0 < await aredis.ttl(KEYS.payload("c1")) <= 600
    assert 0 < await aredis.ttl(KEYS.job("c1")) <= 600


async def test_a_replayed_dead_letter_goes_out_with_its_payload_and_a_purged_one_leaves_nothing(
    aredis: redis.asyncio.Redis, redis_client: redis.Redis
) -> None:
    store = make_store(aredis)
    await store.enqueue([job("d1"), job("d2")])
    await store.claim(2)
    for job_id in ("d1", "d2"):
        await store.finish(job_id, JobState.DEAD, keep_seconds=600, fields={"dead_reason": "x"})
    admin = SyncLifecycle(redis_client, KEYS, LIMITS)
    assert [r["payload"] for _, r, _ in admin.records(["d1", "d2"])] == [PAYLOAD, PAYLOAD]
    admin.replay("d1")
    assert await aredis.ttl(KEYS.payload("d1")) == -1  # kept until it finishes again
    [claimed] = await store.claim(1)
    assert (claimed.id, claimed.payload) == ("d1", PAYLOAD)
    assert admin.purge(["d2"]) == 1
    assert await keys_of(aredis, "d2") == []


async def test_a_job_written_with_its_payload_in_the_record_still_goes_out(
    aredis: redis.asyncio.Redis, redis_client: redis.Redis
) -> None:
    """Records an earlier fairpost wrote (the payload a field of the hash), found after an upgrade."""
    store = make_store(aredis)
    await store.enqueue([job("old"), job("old-dead")])
    for job_id in ("old", "old-dead"):
        await aredis.delete(KEYS.payload(job_id))
        await aredis.hset(KEYS.job(job_id), "payload", PAYLOAD)
    assert (await store.job("old"))["payload"] == PAYLOAD
    claimed = {j.id: j.payload for j in await store.claim(2)}
    assert claimed == {"old": PAYLOAD, "old-dead": PAYLOAD}
    await store.handed_off(["old", "old-dead"])
    # Stranded, it is handed again with its payload.
    await aredis.zadd(KEYS.dispatched(), {"old": 0})
    [stranded] = await StrandedJobs(aredis, KEYS, LIMITS).scan(handoffs_allowed=3)
    assert stranded.job.payload == PAYLOAD
    await store.finish("old", JobState.SENT, keep_seconds=600)
    assert "payload" not in await aredis.hkeys(KEYS.job("old"))
    # A dead letter of the earlier layout is still replayable.
    await store.finish("old-dead", JobState.DEAD, keep_seconds=600, fields={"dead_reason": "x"})
    SyncLifecycle(redis_client, KEYS, LIMITS).replay("old-dead")
    [again] = await store.claim(1)
    assert (again.id, again.payload) == ("old-dead", PAYLOAD)
