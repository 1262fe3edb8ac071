"""A dispatcher process SIGKILLed while holding claims loses no job."""

from __future__ import annotations

import asyncio
import collections
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

import redis
import redis.asyncio

from fairpost.dispatcher.jobs import Job, JobState
from fairpost.dispatcher.runner import Dispatcher
from fairpost.dispatcher.store import JobStore, NewJob, StoreLimits
from fairpost.dispatcher.worker import Done, Outcome
from fairpost.mailer.testing.services import die_with_parent
from fairpost.mailer.testing.wait import wait_for_async
from tests.support import JOB_SCORES, KEYS

ROOT = Path(__file__).resolve().parents[2]


class CountingWorker:
    kind = "test"
    max_batch = 10

    def __init__(self) -> None:
        self.seen: collections.Counter[str] = collections.Counter()

    async def handle(self, jobs: Sequence[Job]) -> Sequence[Outcome]:
        self.seen.update(job.id for job in jobs)
        return [Done() for _ in jobs]


async def test_sigkilled_dispatcher_loses_no_job(
    redis_url: str, redis_client: redis.Redis, aredis: redis.asyncio.Redis
) -> None:
    store = JobStore(aredis, KEYS, StoreLimits(default_cap=1000, lease_ms=500))
    ids = [f"{tenant}-{i}" for tenant in ("a", "b", "c") for i in range(30)]
    await store.enqueue([NewJob(id=i, tenant=i[0], kind="test", payload="{}") for i in ids])

    victim = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.support.hanging_dispatcher",
        redis_url,
        KEYS.prefix,
        "500",
        cwd=ROOT,
        preexec_fn=die_with_parent(),
    )
    try:

        async def victim_claimed() -> bool:
            return await aredis.zcount(KEYS.leases(), *JOB_SCORES) >= 20

        await wait_for_async(victim_claimed, within=15, what="the victim to claim jobs", interval=0.02)
    finally:
        os.kill(victim.pid, signal.SIGKILL)
        await asyncio.wait_for(victim.wait(), 5)
    held = redis_client.zcount(KEYS.leases(), *JOB_SCORES)
    assert held >= 20

    worker = CountingWorker()
    survivor = Dispatcher(store, [worker], reap_interval=0.1)
    stop = asyncio.Event()
    task = asyncio.create_task(survivor.run(stop))
    try:
        await wait_for_async(
            lambda: len(worker.seen) >= len(ids), within=15, what=f"all {len(ids)} jobs to come back"
        )
    finally:
        stop.set()
        await asyncio.wait_for(task, 5)
        await survivor.drain(1)
    assert set(worker.seen) == set(ids)
    assert max(worker.seen.values()) == 1
    states = {(await store.job(i))["state"] for i in ids}
    assert states == {JobState.SENT}
    assert redis_client.zcard(KEYS.leases()) == 0
