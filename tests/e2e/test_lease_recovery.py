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

from dispatcher.jobs import Job, JobState
from dispatcher.keys import Keys
from dispatcher.runner import Dispatcher
from dispatcher.store import JobStore, NewJob, StoreLimits
from dispatcher.worker import Done, Outcome

ROOT = Path(__file__).resolve().parents[2]
KEYS = Keys("kill")


class CountingWorker:
    kind = "test"
    max_batch = 10

    def __init__(self) -> None:
        self.seen: collections.Counter[str] = collections.Counter()

    async def handle(self, jobs: Sequence[Job]) -> Sequence[Outcome]:
        self.seen.update(job.id for job in jobs)
        return [Done() for _ in jobs]


async def test_sigkilled_dispatcher_loses_no_job(redis_url: str, redis_client: redis.Redis) -> None:
    client = redis.asyncio.Redis.from_url(redis_url)
    store = JobStore(client, KEYS, StoreLimits(default_cap=1000, lease_ms=500))
    ids = [f"{tenant}-{i}" for tenant in ("a", "b", "c") for i in range(30)]
    await store.enqueue([NewJob(id=i, tenant=i[0], kind="test", payload="{}") for i in ids])

    victim = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.support.hanging_dispatcher", redis_url, KEYS.prefix, "500", cwd=ROOT
    )
    try:
        deadline = asyncio.get_running_loop().time() + 15
        while await client.zcard(KEYS.leases()) < 20:
            assert asyncio.get_running_loop().time() < deadline, "the victim never claimed jobs"
            await asyncio.sleep(0.02)
    finally:
        os.kill(victim.pid, signal.SIGKILL)
        await asyncio.wait_for(victim.wait(), 5)
    held = redis_client.zcard(KEYS.leases())
    assert held >= 20

    worker = CountingWorker()
    survivor = Dispatcher(store, [worker], reap_interval=0.1)
    stop = asyncio.Event()
    task = asyncio.create_task(survivor.run(stop))
    try:
        deadline = asyncio.get_running_loop().time() + 15
        while len(worker.seen) < len(ids):
            assert asyncio.get_running_loop().time() < deadline, (
                f"only {len(worker.seen)} of {len(ids)} came back"
            )
            await asyncio.sleep(0.05)
    finally:
        stop.set()
        await asyncio.wait_for(task, 5)
        await survivor.drain(1)
    assert set(worker.seen) == set(ids)
    assert max(worker.seen.values()) == 1
    states = {(await store.job(i))["state"] for i in ids}
    assert states == {JobState.SENT}
    assert redis_client.zcard(KEYS.leases()) == 0
    await client.aclose()
