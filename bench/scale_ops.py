"""The cost of each per-mail and per-second operation with many tenants waiting
and with 10, on one Redis: the server's CPU time per operation (``INFO cpu``:
the commands, the scripts and the network I/O they cost). Each operation
runs on both worlds back to back, in an order that alternates from round to
round, so that the machine's noise hits both halves of a pair alike; the
figure is the median of the rounds' ratios.
"""

from __future__ import annotations

import asyncio
import random
import statistics
from collections.abc import Awaitable, Callable

import redis.asyncio

from bench.figures import Figure
from bench.scale_redis import Side, chunks, commands_run, new_job, server_cpu
from config.limits import parse_limits
from dispatcher.jobs import JobState
from mailer.ops.stats import collect_stats

OPS = {
    "enqueue": "enqueue (per job)",
    "claim": "claim (per job)",
    "handoff": "hand-off (per job)",
    "finish": "finish (per job)",
    "cancel": "cancel of a waiting job",
    "requeue": "requeue (per job)",
    "reap": "reap, nothing expired (per call)",
    "promote": "promote of due jobs (per job)",
    "stats_tenant": "stats for one tenant (per call)",
    "acquire": "fair-share acquire, all tenants contending (per call)",
}
GLOBAL = parse_limits("1/minute")
TENANT = parse_limits("100000/second")


async def _cost(client: redis.asyncio.Redis, work: Callable[[], Awaitable[int]]) -> tuple[float, float]:
    """Server CPU microseconds per unit of ``work`` (which returns how many units it did)."""
    before, calls = await server_cpu(client), await commands_run(client)
    units = await work()
    cpu = (await server_cpu(client) - before) * 1e6 / max(1, units)
    # The INFO call between the two reads is itself counted once.
    return cpu, (await commands_run(client) - calls - 1) / max(1, units)


async def prepare(side: Side, per_tenant: int) -> None:
    """Every tenant waiting with ``per_tenant`` jobs and contending for a global quota that binds."""
    await side.fill(per_tenant)
    for group in chunks(side.tenants, 100):
        await asyncio.gather(*(side.quota.acquire(t, [1], GLOBAL, TENANT, weight=1) for t in group))


Work = Callable[[], Awaitable[int]]
Prep = Callable[[], Awaitable[None]] | None


def steps(side: Side, k: int, rng: random.Random) -> list[tuple[str, Prep, Work]]:
    """One round's operations on one side, in order: (name, unmeasured set-up, measured work)."""
    store, lifecycle = side.store, side.lifecycle
    # Low priority: they wait behind every tenant's normal jobs, so they are
    # still waiting when cancelled below.
    fresh = [new_job(rng.choice(side.tenants), priority="low") for _ in range(k)]
    claimed: list[str] = []
    again: list[str] = []

    async def enqueue() -> int:
        for group in range(0, k, 100):
            await store.enqueue(fresh[group : group + 100])
        return k

    async def claim() -> int:
        for _ in range(k // 10):
            claimed.extend(job.id for job in await store.claim(10))
        return len(claimed)

    async def handoff() -> int:
        for group in chunks(claimed, 10):
            await store.handed_off(list(group))
        return len(claimed)

    async def finish() -> int:
        for job_id in claimed:
            await store.finish(job_id, JobState.SENT, keep_seconds=600)
        return len(claimed)

    async def cancel() -> int:
        for job in fresh[: k // 10]:
            await lifecycle.cancel(job.id, 600)
        return k // 10

    async def claim_again() -> None:
        for _ in range(max(1, k // 50)):
            again.extend(job.id for job in await store.claim(10))

    async def requeue() -> int:
        return await store.requeue(again)

    async def reap() -> int:
        for _ in range(k // 10):
            await store.reap()
        return k // 10

    async def schedule() -> None:
        seconds, micros = await side.client.time()
        due_at = int(seconds) * 1000 + int(micros) // 1000 + 20
        await store.enqueue([new_job(rng.choice(side.tenants), send_at_ms=due_at) for _ in range(k // 5)])
        await asyncio.sleep(0.05)

    async def promote() -> int:
        moved, _ = await lifecycle.promote_due()
        return moved

    async def stats_tenant() -> int:
        for _ in range(k // 20):
            await collect_stats(side.client, side.keys, side.settings, tenants=[rng.choice(side.tenants)])
        return k // 20

    async def acquire() -> int:
        for _ in range(k // 10):
            await side.quota.acquire(rng.choice(side.tenants), [1], GLOBAL, TENANT, weight=1)
        return k // 10

    return [
        ("enqueue", None, enqueue),
        ("claim", None, claim),
        ("handoff", None, handoff),
        ("finish", None, finish),
        ("cancel", None, cancel),
        ("requeue", claim_again, requeue),
        ("reap", None, reap),
        ("promote", schedule, promote),
        ("stats_tenant", None, stats_tenant),
        ("acquire", None, acquire),
    ]


async def measure(client: redis.asyncio.Redis, big: int, small: int, rounds: int, k: int) -> list[Figure]:
    rng = random.Random(14)
    sides = [Side(client, "ops-small", small), Side(client, "ops-big", big)]
    # The small world's tenants hold as many jobs as the rounds claim.
    await prepare(sides[0], max(2, rounds * (k + 10) // small + 2))
    await prepare(sides[1], 2)
    per_op: dict[str, dict[str, list[float]]] = {s.name: {op: [] for op in OPS} for s in sides}
    calls: dict[str, dict[str, list[float]]] = {s.name: {op: [] for op in OPS} for s in sides}
    for r in range(rounds):
        # Each operation on both sides back to back, the order alternating: the
        # machine's noise (it is shared) hits the two halves of a pair alike.
        pairs = zip(steps(sides[0], k, rng), steps(sides[1], k, rng), strict=True)
        for step_few, step_many in pairs:
            for side, (op, prep, work) in ((sides[0], step_few), (sides[1], step_many))[
                :: 1 if r % 2 else -1
            ]:
                if prep is not None:
                    await prep()
                cpu, commands = await _cost(side.client, work)
                per_op[side.name][op].append(cpu)
                calls[side.name][op].append(commands)
    figures = []
    for op, title in OPS.items():
        many = statistics.median(per_op["ops-big"][op])
        few = statistics.median(per_op["ops-small"][op])
        ratios = [b / s for b, s in zip(per_op["ops-big"][op], per_op["ops-small"][op], strict=True) if s]
        figures.append(
            Figure(
                key=f"scale_op_{op}",
                title=f"Scale: {title}, {big:,} tenants / {small}",
                value=statistics.median(ratios) if ratios else float("nan"),
                unit="x",
                op="<=",
                target=1.2,
                detail=(
                    f"{many:.1f} µs of Redis CPU (INFO cpu) with {big:,} tenants waiting, {few:.1f} µs with "
                    f"{small} (medians; the figure is the median of {rounds} rounds' ratios, each operation "
                    f"run on both sides back to back, {k} jobs a round); Redis commands per unit "
                    f"{statistics.median(calls['ops-big'][op]):.1f} / "
                    f"{statistics.median(calls['ops-small'][op]):.1f}"
                ),
                data={"big_us": per_op["ops-big"][op], "small_us": per_op["ops-small"][op]},
            )
        )
    return figures
