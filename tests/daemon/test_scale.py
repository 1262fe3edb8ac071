"""The dispatcher's per-call work does not grow with tenants or backlog depth.

Work is counted in Redis commands (``INFO commandstats`` counts every command,
also those a script runs), never timed: a busy machine cannot fail these.
"""

from __future__ import annotations

import collections
from typing import Any

import pytest
import redis.asyncio

from fairpost.config import load_settings
from fairpost.dispatcher.jobs import Job, JobState
from fairpost.dispatcher.keys import TOTAL_INFLIGHT, TOTAL_WAITING
from fairpost.dispatcher.lifecycle import Lifecycle
from fairpost.dispatcher.store import JobStore, NewJob, StoreLimits
from fairpost.mailer.daemon.mail_jobs import MailJobs
from fairpost.mailer.ops.stats import collect_stats
from fairpost.mailer.sdk.keys import MailKeys
from fairpost.mailer.testing.wait import wait_for_async
from tests.support import entry_ids


def make_store(client: redis.asyncio.Redis, keys: MailKeys, **limits: int) -> JobStore:
    defaults = {"default_weight": 1, "default_cap": 1, "lease_ms": 30_000}
    defaults.update(limits)
    return JobStore(client, keys, StoreLimits(**defaults))


def jobs(tenant: str, count: int, priority: str = "normal") -> list[NewJob]:
    return [
        NewJob(id=f"{tenant}-{i}", tenant=tenant, kind="mail", payload="{}", priority=priority)
        for i in range(count)
    ]


async def commands_run(client: redis.asyncio.Redis) -> collections.Counter[str]:
    stats = await client.info("commandstats")
    return collections.Counter({name: int(v["calls"]) for name, v in stats.items()})


def script_commands(ran: collections.Counter[str]) -> int:
    """The commands scripts ran (and any other), without the script calls themselves."""
    return sum(n for name, n in ran.items() if not name.startswith("cmdstat_evalsha"))


async def blocked_tenants(store: JobStore, count: int) -> None:
    """``count`` tenants, each with one job handed off (its only slot) and one waiting."""
    for start in range(0, count, 500):
        batch = [job for t in range(start, min(count, start + 500)) for job in jobs(f"t{t}", 2)]
        await store.enqueue(batch)
    claimed: list[Job] = []
    while len(claimed) < count:
        got = await store.claim(1000)
        assert got, "fewer claimable jobs than tenants"
        claimed += got
    await store.handed_off([job.id for job in claimed])


async def test_reap_work_does_not_grow_with_the_blocked_tenants(aredis: redis.asyncio.Redis) -> None:
    # Before: every reap read the whole blocked set and re-activated each
    # tenant in it, about eight commands per blocked tenant, every second.
    work = {}
    for count in (10, 2_000):
        store = make_store(aredis, MailKeys(f"reap{count}"))
        await blocked_tenants(store, count)
        assert await aredis.scard(store.keys.blocked()) == count
        await store.reap()  # the script loaded: the reap measured is the steady one
        before = await commands_run(aredis)
        assert await store.reap() == 0
        work[count] = (await commands_run(aredis)) - before
    assert work[2_000] == work[10], work


async def test_a_reap_beside_blocked_tenants_costs_what_it_does_beside_none(
    aredis: redis.asyncio.Redis,
) -> None:
    # Before: a safety net for tenants blocked by a pre-release daemon (without the
    # expiring zset) sampled, then paged through, the blocked set; no release
    # wrote such a tenant (#38), and the reap reads the blocked set no more.
    work = {}
    for count in (0, 100):
        store = make_store(aredis, MailKeys(f"net{count}"))
        await blocked_tenants(store, count)
        await store.reap()  # the script loaded: the reap measured is the steady one
        before = await commands_run(aredis)
        assert await store.reap() == 0
        work[count] = (await commands_run(aredis)) - before
    assert work[100] == work[0], work
    assert not {"cmdstat_srandmember", "cmdstat_sscan"} & set(work[100]), work


async def test_an_expired_slot_brings_its_blocked_tenant_back(aredis: redis.asyncio.Redis) -> None:
    # A replica died after handing the job to SQS: its slot expires (here after
    # 200 ms, a lease and an in-flight TTL), and the reaper, visiting only
    # tenants that are due, unblocks it.
    store = make_store(aredis, MailKeys("expiry"), lease_ms=200, inflight_ttl_ms=200)
    await store.enqueue(jobs("acme", 2))
    [first] = await store.claim(10)
    await store.handed_off([first.id])
    assert await store.claim(10) == []
    assert await aredis.sismember(store.keys.blocked(), "acme")

    async def unblocked() -> bool:
        await store.reap()
        return not await aredis.sismember(store.keys.blocked(), "acme")

    await wait_for_async(unblocked, within=10, what="the expired slot to unblock acme")
    assert [job.id for job in await store.claim(10)] == ["acme-1"]
    assert await aredis.zscore(store.keys.expiring(), "acme") is not None
    assert await aredis.hget(store.keys.counts(), TOTAL_INFLIGHT) == "1"


async def test_cancel_leaves_the_backlog_unscanned_and_the_claim_skips_it(
    aredis: redis.asyncio.Redis,
) -> None:
    # Before: cancel LREMed the job from its tenant's queue, a scan of the backlog.
    keys = MailKeys("cancel")
    store = make_store(aredis, keys, default_cap=100)
    lifecycle = Lifecycle(aredis, keys, store.limits)
    await store.enqueue(jobs("acme", 5_000))
    before = await commands_run(aredis)
    assert await lifecycle.cancel("acme-4999", 0) == "queued"
    assert await lifecycle.cancel("acme-1", 0) == "queued"
    ran = (await commands_run(aredis)) - before
    assert not {"cmdstat_lrem", "cmdstat_lrange", "cmdstat_lpos"} & set(ran), ran
    assert await aredis.hget(keys.counts(), "acme") == "4998"
    claimed = await store.claim(3)
    assert [job.id for job in claimed] == ["acme-0", "acme-2", "acme-3"]


async def test_the_counters_match_a_full_count_after_every_kind_of_change(
    aredis: redis.asyncio.Redis,
) -> None:
    keys = MailKeys("counts")
    store = make_store(aredis, keys, default_cap=4, lease_ms=100)
    lifecycle = Lifecycle(aredis, keys, store.limits)
    await store.enqueue(jobs("a", 10) + jobs("b", 3, "high") + jobs("c", 1))
    scheduled = NewJob(id="s-0", tenant="c", kind="mail", payload="{}", send_at_ms=1)
    await store.enqueue([scheduled])  # already due: promoted below
    await lifecycle.promote_due()
    claimed = await store.claim(6)
    await lifecycle.cancel("a-9", 0)  # queued
    await lifecycle.cancel(claimed[0].id, 0)  # claimed
    await store.finish(claimed[1].id, JobState.SENT)
    await store.requeue([claimed[2].id])
    await store.handed_off([claimed[3].id])

    async def leases_reaped() -> bool:
        await store.reap()
        return await aredis.zcard(keys.leases()) == 0

    await wait_for_async(leases_reaped, within=10, what="the rest of the leases to expire")
    await store.claim(3)

    async def full_count() -> tuple[dict[str, int], int, int]:
        waiting: dict[str, int] = {}
        inflight = 0
        for tenant in ("a", "b", "c"):
            for priority in ("high", "normal", "low"):
                ids = entry_ids(await aredis.lrange(keys.queue(tenant, priority), 0, -1))
                for job_id in ids:
                    if await aredis.hget(keys.job(job_id), "state") == "queued":
                        waiting[tenant] = waiting.get(tenant, 0) + 1
            inflight += await aredis.zcard(keys.inflight(tenant))
        return waiting, sum(waiting.values()), inflight

    waiting, total, inflight = await full_count()
    counts: dict[Any, Any] = await aredis.hgetall(keys.counts())
    assert await aredis.hmget(keys.counts(), TOTAL_WAITING, TOTAL_INFLIGHT) == [str(total), str(inflight)]
    assert {t: int(n) for t, n in counts.items() if not t.startswith("~")} == waiting


async def counters_agree(client: redis.asyncio.Redis, keys: MailKeys, tenant: str) -> None:
    """The tenant's counters (waiting, in flight, its place in the expiring zset) match its keys."""
    waiting = 0
    for priority in ("high", "normal", "low"):
        ids = entry_ids(await client.lrange(keys.queue(tenant, priority), 0, -1))
        for job_id in ids:
            waiting += await client.hget(keys.job(job_id), "state") == "queued"
    slots: list[Any] = await client.zrange(keys.inflight(tenant), 0, 0, withscores=True)
    counts = await client.hmget(keys.counts(), tenant, TOTAL_WAITING, TOTAL_INFLIGHT)
    inflight = await client.zcard(keys.inflight(tenant))
    assert counts == [str(waiting) if waiting else None, str(waiting), str(inflight)]
    due = await client.zscore(keys.expiring(), tenant)
    # The reaper must visit the tenant by its earliest slot's expiry.
    assert (due is not None and due <= slots[0][1]) if slots else due is None, (due, slots)


async def test_a_hand_off_recorded_after_its_lease_was_reaped_keeps_the_counters(
    aredis: redis.asyncio.Redis,
) -> None:
    # The lease ran out before the hand-off was recorded: the reaper gave the
    # job back to its queue (one more waiting, its slot freed); the hand-off
    # then takes it out again and gives it a slot. Before: neither counted,
    # and the tenant was left out of the expiring zset with a slot held.
    keys = MailKeys("late")
    store = make_store(aredis, keys, lease_ms=100)
    await store.enqueue(jobs("acme", 1))
    [job] = await store.claim(10)

    async def reaped() -> bool:
        await store.reap()
        return await aredis.hget(keys.job(job.id), "state") == "queued"

    await wait_for_async(reaped, within=10, what="the lease to be reaped")
    await counters_agree(aredis, keys, "acme")
    await store.handed_off([job.id])
    assert await aredis.hget(keys.job(job.id), "state") == "dispatched"
    await counters_agree(aredis, keys, "acme")


async def test_a_hand_off_after_a_claim_dropped_its_expired_slot_counts_the_slot_again(
    aredis: redis.asyncio.Redis,
) -> None:
    # The claimed slot ran out (a lease and an in-flight TTL after it: both short
    # here); before the reaper came, a claim of the same tenant dropped the expired
    # slot (one in flight less: its cap came down to one, so the slot held it
    # there); the hand-off then gives the job a slot again. Before: not counted.
    keys = MailKeys("dropped")
    store = make_store(aredis, keys, default_cap=2, lease_ms=100, inflight_ttl_ms=100)
    await store.enqueue(jobs("acme", 2))
    [first] = await store.claim(1)

    async def expired() -> bool:
        seconds, micros = await aredis.time()
        slot = await aredis.zscore(keys.inflight("acme"), first.id)
        return slot is not None and slot < seconds * 1000 + micros / 1000

    await wait_for_async(expired, within=10, what="the claimed slot to expire")
    await store.sync_tenant_settings({}, {"acme": 1})
    [second] = await store.claim(1)
    assert await aredis.zscore(keys.inflight("acme"), first.id) is None
    await store.handed_off([first.id, second.id])
    await counters_agree(aredis, keys, "acme")


async def test_whole_system_stats_read_a_bounded_sample_and_the_counters(
    aredis: redis.asyncio.Redis, redis_url: str
) -> None:
    # Before: every tenant that ever enqueued was read, four commands each, on
    # every `fairpost stats` and every /metrics scrape of every replica.
    work = {}
    for count in (20, 400):
        keys = MailKeys(f"stats{count}")
        store = make_store(aredis, keys, default_cap=1)
        await store.enqueue([job for t in range(count) for job in jobs(f"t{t:04}", 1 + t % 3)])
        settings = load_settings(redis_url=redis_url, key_prefix=keys.prefix)
        await collect_stats(aredis, keys, settings, sample=10)  # loads the quota script
        before = await commands_run(aredis)
        stats = await collect_stats(aredis, keys, settings, sample=10)
        work[count] = sum(((await commands_run(aredis)) - before).values())
        assert len(stats.tenants) == 10 and stats.known_tenants == count
        # The largest backlogs are the ones shown, to within a factor of two.
        assert min(t.backlog for t in stats.tenants) * 2 > max(1 + t % 3 for t in range(count))
        assert stats.global_.backlog == sum(1 + t % 3 for t in range(count))
        one = await collect_stats(aredis, keys, settings, tenants=["t0001"])
        assert [(t.scope, t.backlog, t.inflight) for t in one.tenants] == [("t0001", 2, 0)]
    assert work[400] == work[20], work


async def test_a_groups_sent_records_are_one_call_that_keeps_every_counter(
    aredis: redis.asyncio.Redis,
) -> None:
    # Before: one finish call a job, each freeing its slot, counting it and
    # re-activating its tenant (11-17 commands a job), plus a DEL of its marker.
    keys = MailKeys("group")
    store = make_store(aredis, keys, default_cap=10)
    await store.enqueue(jobs("acme", 14))
    claimed = await store.claim(10)
    ids = [job.id for job in claimed]
    await store.handed_off(ids)
    for job_id in ids:
        await aredis.set(keys.sending(job_id), "1", px=60_000)
    await store.finish(ids[0], JobState.SENT)  # sent already: a retried record
    before = await commands_run(aredis)
    async with store.pipeline() as pipe:
        sent = [(job_id, f"ses-{job_id}") for job_id in [*ids, "never-enqueued"]]
        await MailJobs(store).record_sent(sent, keep_seconds=600, pipeline=pipe)
        [answers] = await pipe.execute()
    ran = await commands_run(aredis) - before
    assert answers == [0, *([1] * 9), -1]
    commands = script_commands(ran)
    assert commands <= 6 * len(sent), ran
    for job_id in ids[1:]:
        record = await aredis.hgetall(keys.job(job_id))
        assert record["state"] == "sent" and record["ses_message_id"] == f"ses-{job_id}"
        assert 0 < await aredis.ttl(keys.job(job_id)) <= 600
    assert not await aredis.exists(*(keys.sending(i) for i in ids))
    assert await aredis.zcount(keys.dispatched(), "-inf", "(inf") == 0  # the anchor left out
    assert await aredis.zcard(keys.inflight("acme")) == 0
    await counters_agree(aredis, keys, "acme")
    # Its slots came back: the tenant is in the ring again for its last four jobs.
    assert await aredis.lrange(keys.ring(), 0, -1) == ["acme"]
    assert len(await store.claim(10)) == 4


async def test_a_hand_off_batch_writes_its_indexes_once(aredis: redis.asyncio.Redis) -> None:
    # Before: a ZREM of the lease, a ZADD of the slot and one of the dispatched
    # index for every job (five commands a job).
    keys = MailKeys("handoff-batch")
    store = make_store(aredis, keys, default_cap=10, default_weight=10)
    await store.enqueue(jobs("acme", 10))
    claimed = await store.claim(10)
    ids = [job.id for job in claimed]
    before = await commands_run(aredis)
    now_ms = await store.handed_off(ids, claimed_ms=min(job.claimed_ms for job in claimed))
    ran = await commands_run(aredis) - before
    commands = script_commands(ran)
    assert commands <= 3 * len(ids), ran
    # Handed off within their claim's lease, the slots keep what the claim gave them
    # (the lease's end plus the in-flight TTL): only the dispatched index is written.
    assert ran["cmdstat_zadd"] == 1, ran
    slots: list[Any] = await aredis.zrange(keys.inflight("acme"), 0, -1, withscores=True)
    assert len(slots) == 10 and all(score >= now_ms + store.limits.inflight_ttl_ms for _, score in slots)
    assert await aredis.zcount(keys.dispatched(), "-inf", "(inf") == 10  # the anchor left out
    assert await aredis.zcard(keys.leases()) == 0
    assert {await aredis.hget(keys.job(i), "state") for i in ids} == {"dispatched"}
    await counters_agree(aredis, keys, "acme")


async def test_a_claim_turn_of_one_job_costs_seven_commands(aredis: redis.asyncio.Redis) -> None:
    # Before: about 23 commands a job (the ring head read then moved, a LPOP
    # and a LLEN per priority, the cap twice, three ZADDs and counters per job);
    # then ten (expired slots dropped, and the queues' EXISTS, on every turn);
    # then eight (a SET of its payload's key each).
    keys = MailKeys("turns")
    store = make_store(aredis, keys, default_cap=20)
    await store.enqueue([job for t in range(20) for job in jobs(f"t{t}", 2)])
    before = await commands_run(aredis)
    claimed = await store.claim(20)
    ran = await commands_run(aredis) - before
    assert sorted(job.tenant for job in claimed) == sorted(f"t{t}" for t in range(20))
    commands = script_commands(ran)
    # A turn: the ring's LMOVE, the slots' ZCARD, the LMPOP, the slot's ZADD and the
    # tenant's count; the job: its record read and marked. Then a few a call: the
    # time, the leases, the reaper's schedule, the payloads' keys (one MSET), the
    # totals, and the claim's record (read, written, given its lease: the answer
    # of a claim asked again under its token), and the write that adds nothing
    # every script starts with (dispatcher/scripts.py, WRITES_FIRST).
    assert commands <= 7 * len(claimed) + 13, ran
    assert ran["cmdstat_set"] <= 1 and ran["cmdstat_mset"] == 1, ran
    # Slots below the cap need no expired ones dropped; a count above zero says
    # the queues are not empty.
    assert ran["cmdstat_zremrangebyscore"] == 0, ran
    assert ran["cmdstat_exists"] <= 1, ran
    # Every tenant has one job waiting and one in flight, and the totals say so.
    assert await aredis.hmget(keys.counts(), TOTAL_WAITING, TOTAL_INFLIGHT, "t0", "t19") == [
        "20",
        "20",
        "1",
        "1",
    ]


async def test_a_claim_from_an_empty_ring_is_three_commands(aredis: redis.asyncio.Redis) -> None:
    # Before: the time, the overrides' EXISTS and the ring's LMOVE, on each of
    # the many calls that find nothing (after a short batch, after a wake-up).
    # Now the claim's record (none: it leased nothing yet) and the ring's head
    # (LRANGE: empty), after the write that adds nothing every script starts with
    # (WRITES_FIRST).
    keys = MailKeys("empty-ring")
    store = make_store(aredis, keys)
    assert await store.claim(10) == []  # the script is loaded
    before = await commands_run(aredis)
    assert await store.claim(10) == []
    ran = await commands_run(aredis) - before
    expected = {"cmdstat_evalsha", "cmdstat_del", "cmdstat_get", "cmdstat_lrange", "cmdstat_info"}
    assert set(ran) == expected, ran
    assert ran["cmdstat_del"] == ran["cmdstat_get"] == ran["cmdstat_lrange"] == 1, ran


async def test_a_batch_of_one_tenants_jobs_is_one_turn(aredis: redis.asyncio.Redis) -> None:
    # The common case under load: one tenant in the ring, the others at their
    # caps. Before: a turn (a ring move, a pop, a slot write) for every job; then
    # one ring move a call. Now the short ring is read once, turned in Lua and
    # written back once (claim.lua): no move at all.
    keys = MailKeys("one-tenant")
    store = make_store(aredis, keys, default_cap=20)
    await store.enqueue(jobs("acme", 30))
    before = await commands_run(aredis)
    claimed = await store.claim(10)
    ran = await commands_run(aredis) - before
    assert [job.id for job in claimed] == [f"acme-{i}" for i in range(10)]
    assert ran["cmdstat_lmpop"] == 1 and "cmdstat_lmove" not in ran, ran
    assert ran["cmdstat_lrange"] == ran["cmdstat_rpush"] == 1, ran
    assert await aredis.lrange(keys.ring(), 0, -1) == ["acme"]
    await store.handed_off([job.id for job in claimed])
    await counters_agree(aredis, keys, "acme")


async def test_an_enqueue_batch_counts_and_activates_once_a_tenant(aredis: redis.asyncio.Redis) -> None:
    # Before: two counter increments, a push and a ring check for every job.
    keys = MailKeys("enqueue-batch")
    store = make_store(aredis, keys, default_cap=100)
    batch = [
        *jobs("acme", 40),
        *jobs("beta", 30, priority="high"),
        *[
            NewJob(id=f"acme-low-{i}", tenant="acme", kind="mail", payload="{}", priority="low")
            for i in range(30)
        ],
    ]
    before = await commands_run(aredis)
    assert all(await store.enqueue(batch))
    ran = await commands_run(aredis) - before
    commands = script_commands(ran)
    assert commands <= 4 * len(batch), ran
    assert await aredis.hmget(keys.counts(), "acme", "beta", TOTAL_WAITING) == ["70", "30", "100"]
    assert await aredis.smembers(keys.tenants()) == {"acme", "beta"}
    assert sorted(await aredis.lrange(keys.ring(), 0, -1)) == ["acme", "beta"]
    # Each queue in the batch's order, priorities first.
    claimed = [job.id for job in await store.claim(100)]
    assert [i for i in claimed if i.startswith("acme")] == [
        *(f"acme-{i}" for i in range(40)),
        *(f"acme-low-{i}" for i in range(30)),
    ]
    assert [i for i in claimed if i.startswith("beta")] == [f"beta-{i}" for i in range(30)]


async def test_a_job_of_a_priority_no_claim_serves_is_refused_before_redis(
    aredis: redis.asyncio.Redis,
) -> None:
    # Before: NewJob took any priority; its entry went to a queue the claim
    # never pops (and, in an enqueue batch, a priority named like the batch's
    # own bookkeeping would have mixed into it). The SDK checked; the store did not.
    keys = MailKeys("priority")
    store = make_store(aredis, keys)
    for priority in ("urgent", "count", "order"):
        with pytest.raises(ValueError, match="priority must be one of high, normal, low"):
            await store.enqueue([NewJob(id="x", tenant="acme", kind="mail", payload="{}", priority=priority)])
    assert await aredis.exists(keys.job("x")) == 0
