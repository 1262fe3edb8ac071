"""The cost of each per-mail and per-second operation with many tenants waiting
and with 10, on one Redis: the server's CPU time per operation (``INFO cpu``:
the commands, the scripts and the network I/O they cost). Each operation
runs on both worlds of a comparison back to back, in an order that alternates
from round to round, so that the machine's noise hits both halves of a pair
alike; a figure is the median of the rounds' ratios.

Two comparisons, each of two worlds:

- **The same busy tenants** (``scale_op_<op>``, judged): the operations touch
  the same 10 busy tenants in both worlds. In the big world the other tenants
  only wait, each with a backlog over its in-flight cap (its one slot handed
  off, a job waiting: blocked, out of the ring) and contending for a global
  quota that binds. What differs is only what the waiting tenants cost each
  operation: the question of issue 14.
- **A random tenant** (``scale_op_<op>_random``, reported, no target): each
  operation picks a random tenant among all of its world's (100,000, each in
  the ring with two jobs waiting, against 10). In the big world nearly every
  job of a round is a different, cold tenant's, so this adds the cost of
  touching a cold tenant's keys (CPU caches) and the work a tenant's first job
  in a batch does that the next ones do not (its activation, its backlog
  reaching two, its only slot given back).
"""

from __future__ import annotations

import asyncio
import random
import statistics
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import redis.asyncio

from bench.figures import Figure, markdown_table
from bench.scale_redis import Side, chunks, commands_run, new_job, server_cpu
from fairpost.config.limits import parse_limits
from fairpost.dispatcher.jobs import JobState
from fairpost.mailer.ops.stats import collect_stats
from fairpost.mailer.testing.services import redis_server
from fairpost.mailer.testing.wait import wait_for_async

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
    """Server CPU microseconds per unit of ``work`` (which returns how many units it did),
    and Redis commands per unit."""
    # INFO commandstats (about 100 µs of server CPU) is read outside the CPU
    # window; inside it are only the tail of one INFO cpu and the head of the
    # next (about 30 µs, a few per cent of each measurement at most).
    calls = await commands_run(client)
    before = await server_cpu(client)
    units = await work()
    cpu = (await server_cpu(client) - before) * 1e6 / max(1, units)
    # commands_run leaves INFO out: what it counts is the work's alone.
    return cpu, (await commands_run(client) - calls) / max(1, units)


async def contend(side: Side) -> None:
    """Every tenant of the side contends for a global quota that binds."""
    for group in chunks(side.tenants, 100):
        await asyncio.gather(*(side.quota.acquire(t, [1], GLOBAL, TENANT, weight=1) for t in group))


async def prepare_busy(side: Side, per_tenant: int) -> None:
    """Every tenant waiting with ``per_tenant`` jobs, all contending."""
    await side.fill(per_tenant)
    await contend(side)


async def prepare_waiting_behind(side: Side, busy: Sequence[str], per_tenant: int) -> None:
    """The ``busy`` tenants as :func:`prepare_busy` makes them; every other tenant
    waiting with a backlog over its in-flight cap (of 1: its slot handed off, a
    job waiting, blocked); all contending."""
    idle = [t for t in side.tenants if t not in set(busy)]
    await side.store.sync_tenant_settings({}, dict.fromkeys(idle, 1))
    await side.fill(2, tenants=idle)
    await side.hold_every_slot()
    await side.fill(per_tenant, tenants=busy)
    await contend(side)


Work = Callable[[], Awaitable[int]]
Prep = Callable[[], Awaitable[None]] | None


def steps(side: Side, pick: Sequence[str], k: int, rng: random.Random) -> list[tuple[str, Prep, Work]]:
    """One round's operations on one side, in order: (name, unmeasured set-up,
    measured work); each operation that names a tenant picks one of ``pick``."""
    store, lifecycle = side.store, side.lifecycle
    # Low priority: they wait behind every tenant's normal jobs, so they are
    # still waiting when cancelled below.
    fresh = [new_job(rng.choice(pick), priority="low") for _ in range(k)]
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
        for job in fresh[: k // 5]:
            await lifecycle.cancel(job.id, 600)
        return k // 5

    async def claim_again() -> None:
        for _ in range(k // 10):
            again.extend(job.id for job in await store.claim(10))

    async def requeue() -> int:
        return await store.requeue(again)

    async def reap() -> int:
        for _ in range(k // 5):
            await store.reap()
        return k // 5

    async def schedule() -> None:
        due_at = await store.now_ms() + 20
        await store.enqueue([new_job(rng.choice(pick), send_at_ms=due_at) for _ in range(k // 2)])

        async def due() -> bool:
            return await store.now_ms() > due_at

        await wait_for_async(due, within=10, what="the scheduled jobs to be due", interval=0.005)

    async def promote() -> int:
        moved, _ = await lifecycle.promote_due()
        return moved

    async def stats_tenant() -> int:
        for _ in range(k // 20):
            await collect_stats(side.client, side.keys, side.settings, tenants=[rng.choice(pick)])
        return k // 20

    async def acquire() -> int:
        for _ in range(k // 5):
            await side.quota.acquire(rng.choice(pick), [1], GLOBAL, TENANT, weight=1)
        return k // 5

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


@dataclass
class Comparison:
    """Two worlds, and the tenants the operations pick from in the big one (the
    small one's are all its tenants)."""

    key: str
    few: Side
    many: Side
    pick: Sequence[str]

    def __post_init__(self) -> None:
        names = ("few", "many")
        self.cpu: dict[str, dict[str, list[float]]] = {n: {op: [] for op in OPS} for n in names}
        self.calls: dict[str, dict[str, list[float]]] = {n: {op: [] for op in OPS} for n in names}


async def measure(client: redis.asyncio.Redis, big: int, small: int, rounds: int, k: int) -> list[Figure]:
    rng = random.Random(14)
    # The small worlds' tenants hold as many jobs as the rounds claim.
    per_tenant = max(2, rounds * (k + 10) // small + 2)
    many, spread_many = Side(client, "ops-many", big), Side(client, "ops-random-many", big)
    same = Comparison("", Side(client, "ops-few", small), many, many.tenants[:small])
    spread = Comparison("_random", Side(client, "ops-random-few", small), spread_many, spread_many.tenants)
    await prepare_busy(same.few, per_tenant)
    await prepare_waiting_behind(same.many, same.pick, per_tenant)
    await prepare_busy(spread.few, per_tenant)
    await prepare_busy(spread.many, 2)
    comparisons = [same, spread]
    for r in range(rounds):
        plans = [
            list(zip(steps(c.few, c.few.tenants, k, rng), steps(c.many, c.pick, k, rng), strict=True))
            for c in comparisons
        ]
        for i in range(len(OPS)):
            for c, plan in zip(comparisons, plans, strict=True):
                # Both worlds back to back, the order alternating: the machine's
                # noise (it is shared) hits the two halves of a pair alike.
                pair = (("few", c.few, plan[i][0]), ("many", c.many, plan[i][1]))
                for name, side, (op, prep, work) in pair[:: 1 if r % 2 else -1]:
                    if prep is not None:
                        await prep()
                    cpu, commands = await _cost(side.client, work)
                    c.cpu[name][op].append(cpu)
                    c.calls[name][op].append(commands)
    return [figure(c, op, big, small, rounds, k) for c in comparisons for op in OPS]


def figure(c: Comparison, op: str, big: int, small: int, rounds: int, k: int) -> Figure:
    many, few = c.cpu["many"][op], c.cpu["few"][op]
    ratios = [b / s for b, s in zip(many, few, strict=True) if s]
    commands = (
        f"Redis commands per unit {statistics.median(c.calls['many'][op]):.1f} / "
        f"{statistics.median(c.calls['few'][op]):.1f}"
    )
    how = (
        f"(medians; the figure is the median of {rounds} rounds' ratios, each operation run on both "
        f"sides back to back, {k} jobs a round)"
    )
    if c.key:
        return Figure(
            key=f"scale_op_{op}{c.key}",
            title=f"Scale: {OPS[op]}, a random one of {big:,} tenants / of {small}",
            value=statistics.median(ratios) if ratios else float("nan"),
            unit="x",
            detail=(
                f"{statistics.median(many):.1f} µs of Redis CPU (INFO cpu) on a random tenant of {big:,} "
                f"waiting, {statistics.median(few):.1f} µs on one of {small} {how}; {commands}; includes "
                "touching a cold tenant's keys (CPU caches) and a tenant's first job in a batch"
            ),
            data={"big_us": many, "small_us": few},
        )
    return Figure(
        key=f"scale_op_{op}",
        title=f"Scale: {OPS[op]}, {big:,} tenants / {small}",
        value=statistics.median(ratios) if ratios else float("nan"),
        unit="x",
        op="<=",
        target=1.2,
        detail=(
            f"{statistics.median(many):.1f} µs of Redis CPU (INFO cpu) on {small} busy tenants with "
            f"{big - small:,} more waiting, {statistics.median(few):.1f} µs on the same {small} alone "
            f"{how}; {commands}"
        ),
        data={"big_us": many, "small_us": few},
    )


async def on_own_server(quick: bool) -> list[Figure]:
    """Every operation's figures, on a redis-server of their own: 100,000 tenants
    against 10 (``quick``: 2,000, fewer rounds)."""
    rounds, k = (3, 100) if quick else (9, 300)
    with redis_server() as server:
        client = redis.asyncio.Redis.from_url(server.url())
        try:
            return await measure(client, 2_000 if quick else 100_000, 10, rounds, k)
        finally:
            await client.aclose()


if __name__ == "__main__":
    # python -m bench.scale_ops [--quick]: this part of --only scale alone.
    print(markdown_table(asyncio.run(on_own_server("--quick" in sys.argv[1:]))))
