"""In-flight slots last as long as their messages may wait in SQS (issue 12, item 4).

Real dispatcher scripts on a real redis-server, with a short in-flight TTL. A
slot lapsing while its message still waits in SQS lets the dispatcher hand
another cap's worth of the tenant's backlog to SQS.
"""

from __future__ import annotations

import asyncio

import redis.asyncio

from fairpost.config.limits import Limits, Window
from fairpost.dispatcher.replies import time_ms
from fairpost.dispatcher.store import JobStore, NewJob, StoreLimits
from fairpost.mailer.daemon.gate import Gate
from fairpost.mailer.daemon.slots import SlotKeeper
from fairpost.mailer.quota.engine import QuotaEngine
from fairpost.mailer.testing.wait import wait_for_async
from tests.support import JOB_SCORES, KEYS

TTL_MS = 2_000
DAY_LIMITS: Limits = (Window(1, 100), Window(86400, 10))


class Limited:
    """The global limits the keeper sees (a LimitSource with only what it reads)."""

    def __init__(self, windows: Limits) -> None:
        self.windows = windows

    def global_limits(self) -> Limits:
        return self.windows

    def limits_for(self, tenant: str) -> Limits:
        return ()

    def is_paused(self, tenant: str) -> bool:
        return False


def make_store(client: redis.asyncio.Redis) -> JobStore:
    limits = StoreLimits(
        default_cap=2, lease_ms=1_000, inflight_ttl_ms=TTL_MS, stranded_after_ms=TTL_MS * 100
    )
    return JobStore(client, KEYS, limits)


async def hand_off_cap(store: JobStore, tenant: str = "acme", backlog: int = 6) -> list[str]:
    """The tenant's backlog waits in Redis; a cap's worth (2) goes to SQS."""
    await store.enqueue(
        [
            NewJob(id=f"{tenant}-{i}", tenant=tenant, kind="mail", payload="{}", priority="normal")
            for i in range(backlog)
        ]
    )
    claimed = [job.id for job in await store.claim(10)]
    assert len(claimed) == 2
    await store.handed_off(claimed)
    return claimed


async def server_ms(client: redis.asyncio.Redis) -> int:
    return time_ms(await client.time())


async def claimable(store: JobStore) -> int:
    await store.reap()
    return len(await store.claim(10))


async def test_a_claimed_slot_lasts_its_lease_and_a_ttl_and_a_hand_off_within_the_lease_leaves_it(
    aredis: redis.asyncio.Redis,
) -> None:
    # Before: the claim gave the slot its lease's end, and every hand-off wrote it
    # again (a scan of the tenant's slots, two for a new score), #41.
    store = make_store(aredis)
    await store.enqueue([NewJob(id=f"j{i}", tenant="acme", kind="mail", payload="{}") for i in range(2)])
    claimed = await store.claim(10)
    at = claimed[0].claimed_ms
    assert at > 0 and {job.claimed_ms for job in claimed} == {at}
    slot_ms = at + store.limits.lease_ms + TTL_MS
    slots = [("j0", slot_ms), ("j1", slot_ms)]
    assert await aredis.zrange(KEYS.inflight("acme"), 0, -1, withscores=True) == slots
    due = await aredis.zscore(KEYS.expiring(), "acme")
    assert due is not None and due <= slot_ms
    now = await store.handed_off([job.id for job in claimed], claimed_ms=at)
    assert now < at + store.limits.lease_ms
    assert await aredis.zrange(KEYS.inflight("acme"), 0, -1, withscores=True) == slots
    assert slot_ms >= now + TTL_MS


async def test_a_hand_off_past_the_claims_lease_gives_the_slot_a_ttl_from_then(
    aredis: redis.asyncio.Redis,
) -> None:
    store = make_store(aredis)
    await store.enqueue([NewJob(id="j1", tenant="acme", kind="mail", payload="{}")])
    [job] = await store.claim(1)

    async def lease_over() -> bool:
        return await server_ms(aredis) >= job.claimed_ms + store.limits.lease_ms

    await wait_for_async(lease_over, within=10, what="the claim's lease to end")
    # Renewed all along (its worker was busy): still claimed, its slot a TTL from
    # the hand-off now, later than its claim gave it.
    assert await store.renew([job.id]) == 1
    now = await store.handed_off([job.id], claimed_ms=job.claimed_ms)
    assert await aredis.zscore(KEYS.inflight("acme"), job.id) == now + TTL_MS


async def test_a_reaped_lease_frees_its_slot_that_would_have_outlived_it(aredis: redis.asyncio.Redis) -> None:
    store = make_store(aredis)
    await store.enqueue([NewJob(id=f"j{i}", tenant="acme", kind="mail", payload="{}") for i in range(3)])
    claimed = await store.claim(10)
    assert len(claimed) == 2  # the cap
    assert await store.claim(10) == []
    # The claimer dies; its leases end long before its slots would.
    expiry = claimed[0].claimed_ms + store.limits.lease_ms + TTL_MS
    await wait_for_async(lambda: claimable(store), within=10, what="the reaped leases to free their slots")
    assert await server_ms(aredis) < expiry, "claimable only once the slots expired: the reaper freed none"
    assert await aredis.zcard(KEYS.inflight("acme")) == 2
    assert await aredis.zcount(KEYS.leases(), *JOB_SCORES) == 2


async def test_handoff_does_not_shorten_a_slot_the_sender_already_kept_longer(
    aredis: redis.asyncio.Redis,
) -> None:
    # The sender parked the message (touch: 10 h) before the dispatcher recorded its hand-off.
    store = make_store(aredis)
    await store.enqueue([NewJob(id="j1", tenant="acme", kind="mail", payload="{}", priority="normal")])
    (job,) = await store.claim(1)
    now = await server_ms(aredis)
    await store.touch_inflight("acme", now + 36_000_000)

    await store.handed_off([job.id])

    expiry = await aredis.zscore(KEYS.inflight("acme"), job.id)
    assert expiry is not None and expiry >= now + 36_000_000


async def test_slots_outlive_their_ttl_while_the_global_gate_is_closed(aredis: redis.asyncio.Redis) -> None:
    store = make_store(aredis)
    quota = QuotaEngine(aredis, KEYS)
    # The global day quota is spent for the rest of the day: nothing is received.
    assert (await quota.acquire("other", [10], DAY_LIMITS, ())).granted == 1
    assert await quota.global_retry_after(DAY_LIMITS) > 3600
    await hand_off_cap(store)
    keeper = SlotKeeper(store, quota, Limited(DAY_LIMITS), ttl_ms=TTL_MS)
    stop = asyncio.Event()
    task = asyncio.create_task(keeper.run(stop))
    try:
        start = await server_ms(aredis)

        async def three_ttls_passed() -> bool:
            return await server_ms(aredis) > start + 3 * TTL_MS

        await wait_for_async(three_ttls_passed, within=30, what="three in-flight TTLs")
        # Today the slots lapsed after one TTL and the next cap's worth was claimed.
        assert await claimable(store) == 0
        assert keeper.passes >= 3
    finally:
        stop.set()
        await task

    # Every replica died (no keeper): the slots come back by themselves.
    async def slots_back() -> bool:
        return await claimable(store) == 2

    await wait_for_async(slots_back, within=10, what="the slots to expire without a keeper")


async def test_with_the_gate_open_slots_are_not_kept_past_their_ttl(aredis: redis.asyncio.Redis) -> None:
    # Mail is being received: a slot whose message is gone must still come back.
    store = make_store(aredis)
    quota = QuotaEngine(aredis, KEYS)
    await hand_off_cap(store)
    keeper = SlotKeeper(store, quota, Limited(DAY_LIMITS), ttl_ms=TTL_MS)
    stop = asyncio.Event()
    task = asyncio.create_task(keeper.run(stop))
    try:

        async def slots_back() -> bool:
            return await claimable(store) == 2

        await wait_for_async(slots_back, within=10, what="the slots to expire with the gate open")
    finally:
        stop.set()
        await task


async def test_a_sender_hold_keeps_slots_too(aredis: redis.asyncio.Redis) -> None:
    # SES's daily quota: the sender holds itself, the global quota has room.
    store = make_store(aredis)
    quota = QuotaEngine(aredis, KEYS)
    await hand_off_cap(store)
    keeper = SlotKeeper(store, quota, Limited(DAY_LIMITS), ttl_ms=TTL_MS, held=lambda: True)
    stop = asyncio.Event()
    task = asyncio.create_task(keeper.run(stop))
    try:
        start = await server_ms(aredis)

        async def two_ttls_passed() -> bool:
            return await server_ms(aredis) > start + 2 * TTL_MS

        await wait_for_async(two_ttls_passed, within=30, what="two in-flight TTLs")
        assert await claimable(store) == 0
    finally:
        stop.set()
        await task


async def test_a_pass_costs_work_only_for_tenants_whose_slots_are_due(aredis: redis.asyncio.Redis) -> None:
    store = make_store(aredis)
    quota = QuotaEngine(aredis, KEYS)
    assert (await quota.acquire("other", [10], DAY_LIMITS, ())).granted == 1
    for t in range(30):
        await hand_off_cap(store, tenant=f"t{t}", backlog=2)
    # A keeper with a long TTL: every slot (TTL_MS from the hand-off) is due now.
    keeper = SlotKeeper(store, quota, Limited(DAY_LIMITS), ttl_ms=600_000, page=7)
    assert await keeper.keep_once() == 30  # every tenant visited once, in pages of 7
    assert await keeper.keep_once() == 0  # just renewed for 10 minutes: none due
    assert await claimable(store) == 0


async def test_the_senders_own_hold_closes_the_gate_for_the_keeper(aredis: redis.asyncio.Redis) -> None:
    # SES throttled or paused the account (or its daily quota): the global quota has room.
    quota = QuotaEngine(aredis, KEYS)
    gate = Gate(quota, Limited(DAY_LIMITS))
    keeper = SlotKeeper(make_store(aredis), quota, Limited(DAY_LIMITS), ttl_ms=TTL_MS, held=gate.holding)
    assert not gate.holding()
    assert not await keeper.gate_closed()

    gate.hold(60)

    assert gate.holding()
    assert await keeper.gate_closed()
    gate.regate()  # a change of limits ends the global quota's hold, not SES's
    assert await keeper.gate_closed()
