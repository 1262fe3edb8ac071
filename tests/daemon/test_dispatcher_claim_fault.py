"""The dispatcher's claim whose answer is lost: its jobs go out at once, not after a lease.

The claim (claim.lua) leases jobs out of their queues. When Redis ran it and the
reply never came back, nobody knows those jobs are leased: before the claim was
idempotent they waited, leased to nobody, until the lease ended and the reaper
returned them (30 s at defaults). The fault is injected at the Redis call by the
fault matrix's recorder (tests/faults/recorder.py: a client-side stand-in for the
network), against a real redis-server.
"""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio

from fairpost.dispatcher.jobs import JobState
from fairpost.dispatcher.runner import Dispatcher
from fairpost.dispatcher.store import JobStore, NewJob, StoreLimits
from fairpost.mailer.testing.wait import wait_for_async
from tests.daemon.test_dispatcher_settle_faults import AlwaysHandsOff
from tests.faults.recorder import MODES, Mode, Step, recording
from tests.support import JOB_SCORES, KEYS

LEASE_MS = 20_000

CLAIM = Step("redis", "script claim.lua", 1)


def make_store(client: redis.asyncio.Redis, lease_ms: int = LEASE_MS) -> JobStore:
    return JobStore(client, KEYS, StoreLimits(default_cap=100, lease_ms=lease_ms))


async def enqueue(store: JobStore, count: int, tenant: str = "acme") -> list[str]:
    ids = [f"{tenant}-{i}" for i in range(count)]
    await store.enqueue([NewJob(id=i, tenant=tenant, kind="test", payload=f'"{i}"') for i in ids])
    return ids


async def test_a_claim_asked_again_under_its_token_answers_its_jobs_and_claims_no_more(
    aredis: redis.asyncio.Redis,
) -> None:
    store = make_store(aredis)
    ids = await enqueue(store, 5)
    first = await store.claim(2, token="t1")
    again = await store.claim(2, token="t1")
    assert again == first
    # Claimed when it was claimed: a hand-off within its lease leaves the slots be.
    assert [job.claimed_ms for job in again] == [job.claimed_ms for job in first] and first[0].claimed_ms > 0
    assert [job.id for job in first] == ids[:2]
    assert [job.payload for job in first] == [f'"{i}"' for i in ids[:2]]
    # A new token is a new claim: the next jobs.
    assert [job.id for job in await store.claim(2, token="t2")] == ids[2:4]
    assert await aredis.zcount(KEYS.leases(), *JOB_SCORES) == 4


async def test_a_claim_asked_again_leaves_out_the_jobs_settled_since(aredis: redis.asyncio.Redis) -> None:
    store = make_store(aredis)
    ids = await enqueue(store, 3)
    await store.claim(3, token="t1")
    await store.handed_off([ids[0]])
    await store.requeue([ids[1]])
    assert [job.id for job in await store.claim(3, token="t1")] == [ids[2]]


async def test_a_claim_asked_again_after_its_lease_ran_out_answers_nothing(
    aredis: redis.asyncio.Redis,
) -> None:
    store = make_store(aredis, lease_ms=50)
    ids = await enqueue(store, 2)
    await store.claim(2, token="t1")

    async def reaped() -> bool:
        return await store.reap() > 0 or await aredis.zcard(KEYS.leases()) == 0

    await wait_for_async(reaped, within=5, what="the leases to run out and be reaped")
    # Claimed again under another token: the first claim's no longer.
    assert [job.id for job in await store.claim(2, token="t2")] == ids
    assert await store.claim(2, token="t1") == []
    assert await aredis.zcount(KEYS.leases(), *JOB_SCORES) == 2


async def assert_handed_off_within_a_lease(
    aredis: redis.asyncio.Redis, monkeypatch: pytest.MonkeyPatch, fault: Step, mode: Mode, linger: float
) -> None:
    """Three jobs through a dispatcher whose claim ``fault`` fails: each is handed
    off once, before the lease of the claim that leased it could have ended."""
    with recording(monkeypatch) as recorder:
        store = make_store(aredis)
        # Nothing to claim yet: this loads the script, so the call that fails below
        # is the claim itself, not the EVALSHA that Redis answers NOSCRIPT.
        assert await store.claim(10) == []
        ids = await enqueue(store, 3)
        before_ms = await store.now_ms()
        recorder.reset(fault, mode)
        recorder.armed = True
        worker = AlwaysHandsOff()
        dispatcher = Dispatcher(store, [worker], reap_interval=0.05, linger_seconds=linger)
        stop = asyncio.Event()
        task = asyncio.create_task(dispatcher.run(stop))
        try:

            async def handed_off() -> bool:
                states = [(await store.job(i)).get("state") for i in ids]
                return states == [JobState.DISPATCHED] * len(ids)

            # Generous: the promise is checked below, on Redis's clock.
            await wait_for_async(handed_off, within=3 * LEASE_MS / 1000, what="every job handed off")
        finally:
            stop.set()
            await asyncio.wait_for(task, 5)
            await dispatcher.drain(1)
    assert recorder.fired == fault, f"{fault} never failed"
    for job_id in ids:
        record = await store.job(job_id)
        # Claimed once (after before_ms), and handed off before that claim's lease
        # could have ended: not left to the reaper.
        assert int(record["dispatched_ms"]) < before_ms + LEASE_MS, (record, before_ms)
    assert worker.seen == dict.fromkeys(ids, 1), worker.seen


async def test_a_claim_whose_answer_is_lost_hands_its_jobs_off_within_their_first_lease(
    aredis: redis.asyncio.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    await assert_handed_off_within_a_lease(aredis, monkeypatch, CLAIM, "lost-answer", linger=0.0)


@pytest.mark.parametrize("mode", MODES)
async def test_a_lingering_claim_that_fails_lets_the_first_claims_jobs_go(
    aredis: redis.asyncio.Redis, monkeypatch: pytest.MonkeyPatch, mode: Mode
) -> None:
    # A short batch (3 of 10) lingers, then claims again: that second claim fails.
    # What the first one claimed is leased to this dispatcher alone, and goes out now.
    second = Step("redis", "script claim.lua", 2)
    await assert_handed_off_within_a_lease(aredis, monkeypatch, second, mode, linger=0.05)


async def test_a_dispatcher_stopping_after_a_lost_claim_answer_gives_its_jobs_back(
    aredis: redis.asyncio.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The claim's answer is lost and the dispatcher stops before it asks again:
    # drain gives back what that claim leased, as it does every claim it holds.
    failed = asyncio.Event()
    with recording(monkeypatch) as recorder:
        store = make_store(aredis)
        assert await store.claim(10) == []
        ids = await enqueue(store, 3)
        recorder.reset(CLAIM, "lost-answer")
        recorder.armed = True
        dispatcher = Dispatcher(
            store, [AlwaysHandsOff()], reap_interval=0.05, on_error=lambda task, exc: failed.set()
        )
        stop = asyncio.Event()
        task = asyncio.create_task(dispatcher.run(stop))
        await asyncio.wait_for(failed.wait(), 10)
        stop.set()
        await asyncio.wait_for(task, 5)
        assert await aredis.zcount(KEYS.leases(), *JOB_SCORES) == len(ids), "the lost claim leased the jobs"
        await dispatcher.drain(1)
    assert recorder.fired == CLAIM
    assert [(await store.job(i))["state"] for i in ids] == [JobState.QUEUED] * len(ids)
    assert await aredis.zcard(KEYS.leases()) == 0
    assert [job.id for job in await store.claim(10)] == ids
