"""A second job kind: plain tasks, served by the dispatcher as it serves mail.

The kind has keys of its own (:class:`TaskKeys`, a subclass of the dispatcher's
``Keys``), a busy marker of its own passed through ``Keys.busy_markers``, and a
tiny worker of its own. Tasks are enqueued, claimed fairly across tenants, run
by the dispatch loop, and finished, requeued or dead-lettered through the
dispatcher's public API, against a real redis-server. Nothing here imports
``fairpost.mailer``: an import-linter contract holds ``tests.dispatcher`` to it.
"""

from __future__ import annotations

import asyncio
import collections
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass

import pytest
import redis.asyncio

from fairpost.dispatcher import Job, JobState, JobStore, NewJob, TooLateToCancel
from fairpost.dispatcher.keys import BusyMarker, Keys
from fairpost.dispatcher.layout import LAYOUT, read_layout
from fairpost.dispatcher.lifecycle import Lifecycle
from fairpost.dispatcher.runner import Dispatcher
from fairpost.dispatcher.store import StoreLimits
from fairpost.dispatcher.stranded import StrandedJobs
from fairpost.dispatcher.worker import Dead, Done, Outcome, Requeue

TASK = "task"
RUNNING = "running"
"""The state a cancel refused reports for a task its worker is at."""


@dataclass(frozen=True)
class TaskKeys(Keys):
    """The task kind's keys: the dispatcher's, its busy marker, and a result per task."""

    def running(self, job_id: str) -> str:
        return f"{self.root}:task-running:{job_id}"

    def result(self, job_id: str) -> str:
        return f"{self.root}:task-result:{job_id}"

    def busy_markers(self) -> tuple[BusyMarker, ...]:
        return (BusyMarker(RUNNING, f"{self.root}:task-running:"),)

    def data_keys(self) -> list[str]:
        return [*super().data_keys(), f"{self.root}:task-registry"]


KEYS = TaskKeys("tasks")


class TaskWorker:
    """Runs a task: adds two numbers and stores the sum. A task says what it wants
    done: ``add`` (done), ``flaky`` (fails the first time: requeued), ``bad`` (can
    never succeed: dead), ``wait`` (holds on until the test lets it go)."""

    kind = TASK
    max_batch = 4

    def __init__(self, store: JobStore) -> None:
        self.store = store
        self.keys = KEYS
        self.seen: list[str] = []
        self.started = asyncio.Event()
        self.release = asyncio.Event()

    async def handle(self, jobs: Sequence[Job]) -> Sequence[Outcome]:
        return [await self._run(job) for job in jobs]

    async def _run(self, job: Job) -> Outcome:
        self.seen.append(job.id)
        task = json.loads(job.payload)
        # Its busy marker while it is at the task, with a TTL as a worker that dies leaves it.
        await self.store.redis.set(self.keys.running(job.id), "1", px=60_000)
        if task["do"] == "wait":
            self.started.set()
            await self.release.wait()
        if task["do"] == "bad":
            return Dead("a task that cannot add")
        if task["do"] == "flaky" and self.seen.count(job.id) == 1:
            # The worker lets go of its marker itself: a requeue leaves it to the worker.
            await self.store.redis.delete(self.keys.running(job.id))
            return Requeue("first try fails")
        await self.store.redis.set(self.keys.result(job.id), sum(task["add"]))
        return Done()


def task(job_id: str, tenant: str, do: str = "add") -> NewJob:
    return NewJob(id=job_id, tenant=tenant, kind=TASK, payload=json.dumps({"do": do, "add": [2, 3]}))


async def eventually(check: Callable[[], Awaitable[bool]], within: float = 20.0) -> None:
    """Wait until ``check`` holds, failing after ``within`` seconds."""
    deadline = time.monotonic() + within
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {within}s: {check.__name__}")
        await asyncio.sleep(0.02)


def make_store(client: redis.asyncio.Redis, **limits: int) -> JobStore:
    return JobStore(client, KEYS, StoreLimits(**{"default_cap": 1000, **limits}))


@asynccontextmanager
async def running(store: JobStore, worker: TaskWorker) -> AsyncIterator[Dispatcher]:
    dispatcher = Dispatcher(store, [worker], batch_size=4, reap_interval=0.2, finished_ttl_seconds=3600)
    stop = asyncio.Event()
    loop = asyncio.create_task(dispatcher.run(stop))
    try:
        yield dispatcher
    finally:
        worker.release.set()
        stop.set()
        await loop
        await dispatcher.drain(grace=5)


async def test_tasks_are_claimed_fairly_across_tenants(aredis: redis.asyncio.Redis) -> None:
    store = make_store(aredis)
    await store.sync_tenant_settings({"big": 2}, {})
    for tenant in ("big", "small", "tiny"):
        await store.enqueue([task(f"{tenant}-{i}", tenant) for i in range(40)])
    picked: collections.Counter[str] = collections.Counter()
    for _ in range(10):
        for job in await store.claim(8):
            assert job.kind == TASK
            picked[job.tenant] += 1
    # Weights 2:1:1 over 80 claims, however deep each backlog is.
    assert picked == {"big": 40, "small": 20, "tiny": 20}


async def test_the_dispatch_loop_runs_tasks_through_their_own_worker(aredis: redis.asyncio.Redis) -> None:
    store = make_store(aredis)
    worker = TaskWorker(store)
    await store.enqueue(
        [task("ok-1", "a"), task("ok-2", "b"), task("flaky", "a", "flaky"), task("bad", "b", "bad")]
    )
    async with running(store, worker):

        async def all_finished() -> bool:
            states = await store.job_states(["ok-1", "ok-2", "flaky", "bad"])
            return all(state in (JobState.SENT, JobState.DEAD) for state in states.values())

        await eventually(all_finished)
    for job_id in ("ok-1", "ok-2", "flaky"):
        record = await store.job(job_id)
        assert record["state"] == JobState.SENT, record
        assert await aredis.get(KEYS.result(job_id)) == "5"
    assert worker.seen.count("flaky") == 2  # requeued once, then done
    dead = await store.job("bad")
    assert dead["state"] == JobState.DEAD and dead["dead_reason"] == "a task that cannot add"
    assert await aredis.zscore(KEYS.dead(), "bad") is not None
    # A finished task's busy marker went with its finish (finish.lua), dead or done.
    for job_id in ("ok-1", "ok-2", "flaky", "bad"):
        assert not await aredis.exists(KEYS.running(job_id)), job_id


async def test_cancel_refuses_a_task_its_worker_is_at(aredis: redis.asyncio.Redis) -> None:
    store = make_store(aredis)
    worker = TaskWorker(store)
    lifecycle = Lifecycle(aredis, KEYS, store.limits)
    await store.enqueue([task("slow", "a", "wait")])
    async with running(store, worker):
        await asyncio.wait_for(worker.started.wait(), 20)
        # Its record still says claimed, but its worker is at it: too late.
        with pytest.raises(TooLateToCancel) as refused:
            await lifecycle.cancel("slow", keep_seconds=60)
        assert refused.value.state == RUNNING
        worker.release.set()

        async def slow_done() -> bool:
            return (await store.job("slow")).get("state") == JobState.SENT

        await eventually(slow_done)
    assert await aredis.get(KEYS.result("slow")) == "5"


async def test_cancel_takes_a_task_no_worker_is_at(aredis: redis.asyncio.Redis) -> None:
    store = make_store(aredis)
    lifecycle = Lifecycle(aredis, KEYS, store.limits)
    await store.enqueue([task("t", "a")])
    [claimed] = await store.claim(1)
    assert await lifecycle.cancel(claimed.id, keep_seconds=60) == JobState.CLAIMED
    record = await store.job("t")
    assert record["state"] == JobState.DEAD and record["dead_reason"] == "cancelled"


async def test_defer_and_the_reconciler_leave_a_busy_task_alone(aredis: redis.asyncio.Redis) -> None:
    store = make_store(aredis, stranded_after_ms=0)
    await store.enqueue([task("busy", "a"), task("free", "a")])
    await store.claim(2)
    await aredis.set(KEYS.running("busy"), "1", px=60_000)
    assert await store.defer(["busy", "free"], 60_000, "rate limit") == [0, 1]
    assert (await store.job("free"))["state"] == JobState.SCHEDULED
    # Handed downstream, then stranded at once (stranded_after_ms=0): the busy one
    # shows progress, the other is handed again.
    await store.enqueue([task("lost", "b")])
    await store.claim(5)
    await store.handed_off(["busy", "lost"])
    stranded = await StrandedJobs(aredis, KEYS, store.limits).scan(handoffs_allowed=3)
    assert [(s.job.id, s.outcome) for s in stranded] == [("lost", "again")]


async def test_a_store_holding_only_the_kinds_data_is_no_empty_store(aredis: redis.asyncio.Redis) -> None:
    await aredis.sadd(f"{KEYS.root}:task-registry", "x")
    assert await read_layout(aredis, KEYS) == 0  # data written before versions
    await aredis.flushdb()
    assert await read_layout(aredis, KEYS) == LAYOUT  # empty: stamped


def test_a_kinds_keys_are_the_dispatchers_with_its_own_beside() -> None:
    plain = Keys("tasks")
    assert plain.busy_markers() == ()
    assert (KEYS.job("x"), KEYS.queue("a", "normal")) == (plain.job("x"), plain.queue("a", "normal"))
    assert [marker.key("x") for marker in KEYS.busy_markers()] == [KEYS.running("x")]
