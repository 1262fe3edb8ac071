"""A Redis error while the dispatcher settles a batch: nothing stays claimed for ever.

The store's settling calls (``handed_off``, ``finish``, ``requeue``) are made to
fail on the client side, against a real redis-server: once with the request
lost (the call never reaches Redis) and once with the answer lost (Redis ran it,
the reply never came back). Either way the settle must land in the end, and no
job may keep a lease that its dispatcher renews for as long as it lives.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import pytest
import redis.asyncio
from redis.exceptions import ConnectionError as RedisConnectionError

from fairpost.dispatcher.jobs import Job, JobState
from fairpost.dispatcher.runner import Dispatcher
from fairpost.dispatcher.store import JobStore, NewJob, StoreLimits
from fairpost.dispatcher.worker import Dead, Done, HandedOff, Outcome, Requeue
from fairpost.mailer.testing.wait import wait_for_async
from tests.support import KEYS


def make_store(client: redis.asyncio.Redis, lease_ms: int = 30_000) -> JobStore:
    return JobStore(client, KEYS, StoreLimits(default_weight=1, default_cap=100_000, lease_ms=lease_ms))


def fail(store: JobStore, method: str, lost: str, times: int | None = 1) -> list[int]:
    """Make ``store.<method>`` raise a ConnectionError ``times`` times (None: always),
    before the call (``lost="request"``) or after Redis ran it (``"answer"``).
    Returns a one-item list counting the failures injected."""
    real: Callable[..., Awaitable[Any]] = getattr(store, method)
    failed = [0]

    async def flaky(*args: Any, **kwargs: Any) -> Any:
        if times is not None and failed[0] >= times:
            return await real(*args, **kwargs)
        failed[0] += 1
        if lost == "answer":
            await real(*args, **kwargs)
        raise RedisConnectionError(f"injected: {method}'s {lost} lost")

    setattr(store, method, flaky)
    return failed


class OnceThen:
    """Answers ``first`` the first time it sees a job, ``Done`` afterwards."""

    kind = "test"
    max_batch = 10

    def __init__(self, first: Outcome) -> None:
        self.first = first
        self.seen: collections.Counter[str] = collections.Counter()

    async def handle(self, jobs: Sequence[Job]) -> Sequence[Outcome]:
        self.seen.update(job.id for job in jobs)
        return [self.first if self.seen[job.id] == 1 else Done() for job in jobs]


async def run_while(dispatcher: Dispatcher, condition: Callable[[], Awaitable[bool]], what: str) -> None:
    stop = asyncio.Event()
    task = asyncio.create_task(dispatcher.run(stop))
    try:
        await wait_for_async(condition, within=15, what=what, interval=0.02)
    finally:
        stop.set()
        await asyncio.wait_for(task, 5)
        await dispatcher.drain(1)


CASES = [
    pytest.param("handed_off", HandedOff(), JobState.DISPATCHED, id="handed_off"),
    pytest.param("finish", Done(), JobState.SENT, id="finish-done"),
    pytest.param("finish", Dead("no such thing"), JobState.DEAD, id="finish-dead"),
    pytest.param("requeue", Requeue("downstream busy"), JobState.SENT, id="requeue-retry"),
]


@pytest.mark.parametrize("lost", ["request", "answer"])
@pytest.mark.parametrize(("method", "outcome", "final"), CASES)
async def test_a_settle_that_fails_once_lands_and_nothing_stays_held(
    aredis: redis.asyncio.Redis, method: str, outcome: Outcome, final: JobState, lost: str
) -> None:
    store = make_store(aredis)
    ids = [f"acme-{i}" for i in range(3)]
    await store.enqueue([NewJob(id=i, tenant="acme", kind="test", payload="{}") for i in ids])
    failed = fail(store, method, lost)
    worker = OnceThen(outcome)
    dispatcher = Dispatcher(store, [worker], reap_interval=0.05)

    async def settled() -> bool:
        states = [(await store.job(i)).get("state") for i in ids]
        return states == [final] * len(ids) and await aredis.zcard(KEYS.leases()) == 0

    await run_while(dispatcher, settled, f"every job {final} and no lease left")
    assert failed == [1], "the fault was never injected"
    # A Requeue comes back to the worker once requeued; the others are handled once.
    assert set(worker.seen.values()) == ({2} if isinstance(outcome, Requeue) else {1}), worker.seen


class AlwaysHandsOff:
    kind = "test"
    max_batch = 10

    def __init__(self) -> None:
        self.seen: collections.Counter[str] = collections.Counter()

    async def handle(self, jobs: Sequence[Job]) -> Sequence[Outcome]:
        self.seen.update(job.id for job in jobs)
        return [HandedOff() for _ in jobs]


async def test_a_settle_that_never_lands_lets_the_leases_lapse(aredis: redis.asyncio.Redis) -> None:
    # Redis refuses every hand-off record for longer than the outage the dispatcher
    # rides out: it gives the settle up, stops renewing those claims, and the
    # reaper returns them to their queue (where they are claimed again).
    store = make_store(aredis, lease_ms=400)
    await store.enqueue([NewJob(id="acme-0", tenant="acme", kind="test", payload="{}")])
    fail(store, "handed_off", "request", times=None)
    worker = AlwaysHandsOff()
    dispatcher = Dispatcher(store, [worker], reap_interval=0.05, max_outage_seconds=0.2)

    async def handed_out_again() -> bool:
        return worker.seen["acme-0"] >= 2

    await run_while(dispatcher, handed_out_again, "the job's lease to lapse and the job to come back")
