"""The job record's layout (dispatcher/record.py) on a redis-server with Redis's
default configuration: a waiting 1 KB mail's record stays a listpack and its
payload rides in its queue entry, with no key of its own; the claim gives the
payload a key, which is read back whole wherever a script hands it on and goes
when the record goes; a job cancelled while its entry waits keeps its payload
for replay; and jobs written by an earlier fairpost (the payload in a key, or
in the hash) still go out."""

from __future__ import annotations

import pytest
import redis
import redis.asyncio

from bench.scale_redis import mail_payload
from fairpost.dispatcher.jobs import JobState
from fairpost.dispatcher.lifecycle import Lifecycle, SyncLifecycle
from fairpost.dispatcher.migrate import Migration
from fairpost.dispatcher.record import ENTRY_SEP, has_payload
from fairpost.dispatcher.replies import text
from fairpost.dispatcher.store import JobStore, NewJob, StoreLimits
from fairpost.dispatcher.stranded import StrandedJobs
from fairpost.mailer.testing.services import redis_server
from tests.support import KEYS, entry_ids

PAYLOAD = '{"subject":"Grüße","text":"' + ("Ünïcödé → 東京 🚀 " * 60)[:900] + '"}'
LIMITS = StoreLimits(default_weight=1, default_cap=100, lease_ms=30_000)
QUEUE = KEYS.queue("acme", "normal")


def make_store(client: redis.asyncio.Redis) -> JobStore:
    return JobStore(client, KEYS, LIMITS)


def job(job_id: str, payload: str = PAYLOAD) -> NewJob:
    return NewJob(id=job_id, tenant="acme", kind="mail", payload=payload, fields={"recipients": "1"})


async def keys_of(client: redis.asyncio.Redis, job_id: str) -> list[str]:
    """Every key that names the job."""
    return sorted(text(k) for k in await client.keys(f"*:{job_id}"))


async def old_layout(client: redis.asyncio.Redis, job_id: str, *, in_record: bool = False) -> None:
    """Rewrite the waiting job ``job_id`` as an earlier fairpost wrote it: its id alone
    in its queue and its payload in its key (or, earlier still, in its record)."""
    assert await client.lrem(QUEUE, 1, job_id + ENTRY_SEP + PAYLOAD) == 1
    await client.rpush(QUEUE, job_id)
    await client.hdel(KEYS.job(job_id), "inline")
    if in_record:
        await client.hset(KEYS.job(job_id), "payload", PAYLOAD)
    else:
        await client.set(KEYS.payload(job_id), PAYLOAD)


async def cancelled_while_queued(client: redis.asyncio.Redis, *job_ids: str, then: str = "") -> JobStore:
    """The jobs enqueued (and ``then`` behind them), and cancelled while queued, kept 600 s."""
    store = make_store(client)
    await store.enqueue([job(job_id) for job_id in (*job_ids, then) if job_id])
    for job_id in job_ids:
        await Lifecycle(client, KEYS, LIMITS).cancel(job_id, keep_seconds=600)
    return store


async def expire_lease(client: redis.asyncio.Redis, store: JobStore, job_id: str) -> None:
    """The claim's lease runs out (its score in the past) and the reaper returns it."""
    await client.zadd(KEYS.leases(), {job_id: 0})
    assert await store.reap() == 1


async def test_a_waiting_1kb_job_is_a_listpack_record_and_its_payload_rides_in_its_queue_entry(
    aredis: redis.asyncio.Redis,
) -> None:
    assert await aredis.config_get("hash-max-listpack-value") == {"hash-max-listpack-value": "64"}
    store = make_store(aredis)
    await store.enqueue([job("j1")])
    assert await aredis.object("encoding", KEYS.job("j1")) == "listpack"
    assert await keys_of(aredis, "j1") == [KEYS.job("j1")]
    assert await aredis.lrange(QUEUE, 0, -1) == ["j1" + ENTRY_SEP + PAYLOAD]
    # Its status needs no payload: the record reads as ever, without one.
    record = await store.job("j1")
    assert (record["state"], record["inline"]) == ("queued", "1")
    assert "payload" not in record


async def test_the_claim_gives_the_payload_its_key_and_a_reaped_job_goes_out_again_with_it(
    aredis: redis.asyncio.Redis,
) -> None:
    store = make_store(aredis)
    await store.enqueue([job("j1")])
    [claimed] = await store.claim(1)
    assert (claimed.id, claimed.payload) == ("j1", PAYLOAD)
    assert await aredis.get(KEYS.payload("j1")) == PAYLOAD
    assert (await store.job("j1"))["inline"] == "0"
    # Its lease runs out: back at the head of its queue as its id alone.
    await expire_lease(aredis, store, "j1")
    assert await aredis.lrange(QUEUE, 0, -1) == ["j1"]
    [again] = await store.claim(1)
    assert (again.id, again.payload) == ("j1", PAYLOAD)


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


async def test_a_scheduled_job_keeps_its_payload_in_its_key_and_goes_out_with_it(
    aredis: redis.asyncio.Redis,
) -> None:
    store = make_store(aredis)
    now = await store.now_ms()
    await store.enqueue(
        [NewJob(id="s1", tenant="acme", kind="mail", payload=PAYLOAD, send_at_ms=now + 60_000)]
    )
    assert await aredis.get(KEYS.payload("s1")) == PAYLOAD
    assert "inline" not in await store.job("s1")
    await aredis.zadd(KEYS.scheduled(), {"s1": 0})  # due now
    assert (await Lifecycle(aredis, KEYS, LIMITS).promote_due())[0] == 1
    assert await aredis.lrange(QUEUE, 0, -1) == ["s1"]
    [claimed] = await store.claim(1)
    assert (claimed.id, claimed.payload) == ("s1", PAYLOAD)


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


async def test_a_job_cancelled_while_queued_is_replayed_with_the_payload_its_entry_still_holds(
    aredis: redis.asyncio.Redis, redis_client: redis.Redis
) -> None:
    store = await cancelled_while_queued(aredis, "c1", then="next")
    admin = SyncLifecycle(redis_client, KEYS, LIMITS)
    [(_, record, _)] = admin.records(["c1"])
    assert record["state"] == "dead"
    assert has_payload(record)  # in its entry: a dead letter that can be replayed
    admin.replay("c1")
    # Back at the tail as its id alone; its old entry only carries the payload now.
    assert entry_ids(await aredis.lrange(QUEUE, 0, -1)) == ["c1", "next", "c1"]
    assert await aredis.hget(KEYS.counts(), "acme") == "2"
    assert [(j.id, j.payload) for j in await store.claim(2)] == [("next", PAYLOAD), ("c1", PAYLOAD)]
    assert await aredis.llen(QUEUE) == 0
    # Cancelled and replayed twice before the claim came: the same.
    await store.enqueue([job("c2")])
    for _ in range(2):
        await Lifecycle(aredis, KEYS, LIMITS).cancel("c2", keep_seconds=600)
        admin.replay("c2")
    assert [(j.id, j.payload) for j in await store.claim(2)] == [("c2", PAYLOAD)]
    assert await aredis.llen(QUEUE) == 0


async def test_a_job_cancelled_while_queued_keeps_its_payload_once_the_claim_drops_its_entry(
    aredis: redis.asyncio.Redis, redis_client: redis.Redis
) -> None:
    store = await cancelled_while_queued(aredis, "c1", then="next")
    # The claim comes to its entry, drops it and saves its payload for the dead letter.
    [claimed] = await store.claim(1)
    assert claimed.id == "next"
    record = await store.job("c1")
    assert (record["state"], record["payload"], record["inline"]) == ("dead", PAYLOAD, "0")
    # As long as its record, and no longer.
    assert 0 < await aredis.ttl(KEYS.payload("c1")) <= 600
    assert 0 < await aredis.ttl(KEYS.job("c1")) <= 600
    SyncLifecycle(redis_client, KEYS, LIMITS).replay("c1")
    assert await aredis.lrange(QUEUE, 0, -1) == ["c1"]
    assert await aredis.ttl(KEYS.payload("c1")) == -1  # kept until it finishes again
    [again] = await store.claim(1)
    assert (again.id, again.payload) == ("c1", PAYLOAD)


async def test_a_cancelled_job_purged_or_expired_while_its_entry_waits_leaves_nothing(
    aredis: redis.asyncio.Redis, redis_client: redis.Redis
) -> None:
    store = await cancelled_while_queued(aredis, "purged", "expired")
    assert SyncLifecycle(redis_client, KEYS, LIMITS).purge(["purged"]) == 1
    await aredis.delete(KEYS.job("expired"))  # its record's TTL ran out
    assert await store.claim(2) == []
    assert await aredis.llen(QUEUE) == 0
    assert await keys_of(aredis, "purged") == []
    assert await keys_of(aredis, "expired") == []


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


async def test_a_job_written_with_its_payload_in_a_key_or_in_the_record_goes_out_once_migrated(
    aredis: redis.asyncio.Redis, redis_client: redis.Redis
) -> None:
    """Jobs a pre-release fairpost wrote (the id alone in the queue; the payload in its
    key or, earlier still, a field of the hash): the first still read as they are,
    the second after ``fairpost migrate`` moved the field to its key (#38)."""
    store = make_store(aredis)
    await store.enqueue([job("key"), job("old"), job("old-dead")])
    await old_layout(aredis, "key")
    for job_id in ("old", "old-dead"):
        await old_layout(aredis, job_id, in_record=True)
    Migration(redis_client, KEYS, say=lambda _: None).run()
    assert (await store.job("key"))["payload"] == PAYLOAD
    assert (await store.job("old"))["payload"] == PAYLOAD
    claimed = {j.id: j.payload for j in await store.claim(3)}
    assert claimed == {"key": PAYLOAD, "old": PAYLOAD, "old-dead": PAYLOAD}
    await store.handed_off(["old", "old-dead"])
    # Stranded, it is handed again with its payload.
    await aredis.zadd(KEYS.dispatched(), {"old": 0})
    [stranded] = await StrandedJobs(aredis, KEYS, LIMITS).scan(handoffs_allowed=3)
    assert stranded.job.payload == PAYLOAD
    await store.finish("old", JobState.SENT, keep_seconds=600)
    assert await aredis.get(KEYS.payload("old")) is None
    # A dead letter of the earlier layout is still replayable.
    await store.finish("old-dead", JobState.DEAD, keep_seconds=600, fields={"dead_reason": "x"})
    SyncLifecycle(redis_client, KEYS, LIMITS).replay("old-dead")
    [again] = await store.claim(1)
    assert (again.id, again.payload) == ("old-dead", PAYLOAD)


async def test_a_waiting_1kb_mail_takes_less_memory_than_with_a_payload_key() -> None:
    """Issue #14's target, 1.5 KB a waiting 1 KB mail, on a fresh redis-server with
    Redis's default configuration: the payloads share the queue's listpack nodes
    (the layout with a payload key took about 1,680 bytes)."""
    payload, fields = mail_payload(1024)
    jobs = 2_000
    with redis_server() as server:
        client = redis.asyncio.Redis.from_url(server.url(), decode_responses=True)
        try:
            store = make_store(client)
            # The script loaded and the server's first allocations made, outside the count.
            await store.enqueue([NewJob(id="first", tenant="other", kind="mail", payload=payload)])
            before = int((await client.info("memory"))["used_memory"])
            for start in range(0, jobs, 500):
                batch = [
                    NewJob(id=f"m{i}", tenant="acme", kind="mail", payload=payload, fields=fields)
                    for i in range(start, start + 500)
                ]
                assert all(await store.enqueue(batch))
            per_job = (int((await client.info("memory"))["used_memory"]) - before) / jobs
            assert await client.keys(KEYS.payload_prefix() + "*") == []
            assert await client.llen(QUEUE) == jobs
            assert per_job < 1_536, per_job
        finally:
            await client.aclose()


def test_a_job_id_never_holds_what_ends_it_in_a_queue_entry() -> None:
    with pytest.raises(ValueError, match="job id"):
        job("a" + ENTRY_SEP + "b")
