"""Bulk lanes (notification mail, issue #42) against a real redis-server: a
tenant's bulk backlog never delays its urgent jobs, in Redis or in its slots."""

from __future__ import annotations

import redis.asyncio

from fairpost.config import Settings
from fairpost.dispatcher.jobs import JobState
from fairpost.dispatcher.keys import lane
from fairpost.dispatcher.store import JobStore, NewJob, StoreLimits
from fairpost.mailer.quota.overrides import QuotaAdmin
from tests.support import KEYS


def make_store(client: redis.asyncio.Redis, cap: int) -> JobStore:
    return JobStore(client, KEYS, StoreLimits(default_weight=1, default_cap=cap, lease_ms=30_000))


def jobs(tenant: str, name: str, count: int, *, bulk: bool) -> list[NewJob]:
    return [
        NewJob(id=f"{name}-{i}", tenant=tenant, kind="test", payload="{}", priority=lane("normal", bulk=bulk))
        for i in range(count)
    ]


async def test_urgent_jobs_are_claimed_before_an_earlier_bulk_backlog(aredis: redis.asyncio.Redis) -> None:
    store = make_store(aredis, cap=1000)
    await store.enqueue(jobs("acme", "bulk", 500, bulk=True))
    await store.enqueue(jobs("acme", "urgent", 3, bulk=False))
    claimed = [job.id for job in await store.claim(5)]
    assert claimed[:3] == ["urgent-0", "urgent-1", "urgent-2"]
    assert claimed[3:] == ["bulk-0", "bulk-1"]


async def test_bulk_jobs_leave_a_quarter_of_the_slots_to_urgent_ones(aredis: redis.asyncio.Redis) -> None:
    store = make_store(aredis, cap=8)
    await store.enqueue(jobs("acme", "bulk", 100, bulk=True))
    taken = await store.claim(50)
    # Bulk jobs hold at most 6 of the 8 slots: the tenant is blocked for them...
    assert [job.id for job in taken] == [f"bulk-{i}" for i in range(6)]
    assert await store.claim(50) == []
    # ...yet an urgent job finds a slot at once, twice, and then the cap binds.
    await store.enqueue(jobs("acme", "urgent", 3, bulk=False))
    assert [job.id for job in await store.claim(50)] == ["urgent-0", "urgent-1"]
    assert await store.claim(50) == []
    # A finished bulk job frees a slot: the urgent job waiting goes first.
    await store.finish("bulk-0", JobState.SENT, keep_seconds=60)
    assert [job.id for job in await store.claim(50)] == ["urgent-2"]


async def test_a_blocked_bulk_tenant_comes_back_when_a_slot_frees(aredis: redis.asyncio.Redis) -> None:
    store = make_store(aredis, cap=4)
    await store.enqueue(jobs("acme", "bulk", 10, bulk=True))
    assert len(await store.claim(10)) == 3
    assert await store.claim(10) == []
    await store.finish("bulk-0", JobState.SENT, keep_seconds=60)
    assert [job.id for job in await store.claim(10)] == ["bulk-3"]


async def test_a_cap_of_one_still_sends_bulk_jobs(aredis: redis.asyncio.Redis) -> None:
    store = make_store(aredis, cap=1)
    await store.enqueue(jobs("acme", "bulk", 2, bulk=True))
    assert [job.id for job in await store.claim(10)] == ["bulk-0"]


async def test_a_tenant_left_out_of_the_ring_with_bulk_jobs_comes_back_on_resume(
    aredis: redis.asyncio.Redis, settings: Settings
) -> None:
    # A 0.1.0 dispatcher (CHANGELOG, upgrade notes) drops a tenant from the ring when
    # its three priority queues are empty, bulk jobs waiting or not: done here by hand.
    store = make_store(aredis, cap=4)
    await store.enqueue(jobs("acme", "bulk", 2, bulk=True))
    await aredis.lrem(KEYS.ring(), 0, "acme")
    await aredis.srem(KEYS.ring_members(), "acme")
    assert await store.claim(10) == []
    with QuotaAdmin(settings) as admin:
        assert not admin.resume("acme")  # no hold to lift, yet back in the ring
    assert [job.id for job in await store.claim(10)] == ["bulk-0", "bulk-1"]
