"""The leases stay a skiplist: an anchor member, scored +inf, that no reader takes for a lease.

Redis keeps a sorted set of up to 128 members as a listpack, where each member
added or removed is a scan of the set: a claim of 50 leases and each hand-off's
ZREM paid for it (#41). The claim writes the anchor (dispatcher/keys.py ANCHOR)
with its leases; the script that removes the last lease removes it too
(ring.lua's drop_lone_anchor), so that a store with nothing claimed keeps no key.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
import redis.asyncio

from fairpost.dispatcher.jobs import JobState
from fairpost.dispatcher.keys import ANCHOR
from fairpost.dispatcher.lifecycle import Lifecycle
from fairpost.dispatcher.replies import time_ms
from fairpost.dispatcher.store import JobStore, NewJob, StoreLimits
from fairpost.mailer.sdk.keys import MailKeys
from fairpost.mailer.testing.wait import wait_for_async
from tests.support import JOB_SCORES

KEYS = MailKeys("leases-anchor")


async def claimed(
    client: redis.asyncio.Redis, count: int, lease_ms: int = 30_000
) -> tuple[JobStore, list[str]]:
    store = JobStore(client, KEYS, StoreLimits(default_cap=100, lease_ms=lease_ms))
    await store.enqueue([NewJob(id=f"j{i}", tenant="acme", kind="mail", payload="{}") for i in range(count)])
    return store, [job.id for job in await store.claim(count)]


async def test_a_claim_makes_the_leases_a_skiplist_and_its_anchor_is_no_lease(
    aredis: redis.asyncio.Redis,
) -> None:
    # Leases an earlier version wrote (a listpack, no anchor): the claim turns them.
    await aredis.zadd(KEYS.leases(), {"earlier": 2**50})
    assert await aredis.object("encoding", KEYS.leases()) == "listpack"
    store, ids = await claimed(aredis, 3)
    assert await aredis.object("encoding", KEYS.leases()) == "skiplist"
    assert await aredis.zscore(KEYS.leases(), ANCHOR) == float("inf")
    assert await aredis.zrange(KEYS.leases(), *JOB_SCORES, byscore=True) == [*ids, "earlier"]
    # Part handed off, the anchor stays with the rest; the last hand-off takes it.
    await store.handed_off(ids[:2])
    assert await aredis.zrange(KEYS.leases(), 0, -1) == [ids[2], "earlier", ANCHOR]
    await store.handed_off(ids[2:])
    assert await aredis.zrange(KEYS.leases(), 0, -1) == ["earlier", ANCHOR]
    assert await store.requeue(["earlier"]) == 1  # no record: its lease only ends
    assert not await aredis.exists(KEYS.leases())


async def test_a_lease_left_alone_in_a_set_with_no_anchor_stays(aredis: redis.asyncio.Redis) -> None:
    # Leases an earlier version wrote, none scored +inf: only the anchor goes with a last lease.
    store = JobStore(aredis, KEYS, StoreLimits())
    await aredis.zadd(KEYS.leases(), {"old": 2**50, "older": 2**50})
    assert await store.requeue(["old"]) == 1
    assert await aredis.zrange(KEYS.leases(), 0, -1) == ["older"]


async def test_the_reaper_never_takes_the_anchor_and_takes_it_with_the_last_lease(
    aredis: redis.asyncio.Redis,
) -> None:
    store, ids = await claimed(aredis, 3, lease_ms=1)
    due_ms = max([await aredis.zscore(KEYS.leases(), job_id) or 0.0 for job_id in ids])

    async def all_due() -> bool:
        return time_ms(await aredis.time()) > due_ms

    await wait_for_async(all_due, within=10, what="the leases to run out")
    assert await store.reap(2) == 2
    assert await aredis.zrange(KEYS.leases(), 0, -1) == [ids[2], ANCHOR]
    assert await store.reap() == 1
    assert not await aredis.exists(KEYS.leases())
    assert await store.reap() == 0


async def _requeue(store: JobStore, client: redis.asyncio.Redis, job_id: str) -> None:
    assert await store.requeue([job_id]) == 1


async def _cancel(store: JobStore, client: redis.asyncio.Redis, job_id: str) -> None:
    await Lifecycle(client, KEYS, StoreLimits()).cancel(job_id, 0)


async def _defer(store: JobStore, client: redis.asyncio.Redis, job_id: str) -> None:
    assert await store.defer([job_id], 60_000, "a hold") == [1]


async def _finish(store: JobStore, client: redis.asyncio.Redis, job_id: str) -> None:
    assert await store.finish(job_id, JobState.DEAD) == 1


async def _hand_off(store: JobStore, client: redis.asyncio.Redis, job_id: str) -> None:
    await store.handed_off([job_id])


Ending = Callable[[JobStore, redis.asyncio.Redis, str], Awaitable[None]]


@pytest.mark.parametrize(
    "end",
    [_requeue, _cancel, _defer, _finish, _hand_off],
    ids=["requeue", "cancel", "defer", "finish", "handoff"],
)
async def test_whatever_ends_the_last_lease_takes_the_anchor_with_it(
    aredis: redis.asyncio.Redis, end: Ending
) -> None:
    store, ids = await claimed(aredis, 2)
    await end(store, aredis, ids[0])
    assert await aredis.zrange(KEYS.leases(), 0, -1) == [ids[1], ANCHOR]
    await end(store, aredis, ids[1])
    assert not await aredis.exists(KEYS.leases())
