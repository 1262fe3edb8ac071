"""Variants of one replica, side by side: the daemon's CPU and Redis's cost per mail.

Each variant is the same ``fairpost run`` with other environment variables
(and, optionally, the application sending inside a span of its own). A round
gives each variant a world of its own on a ``redis-server`` of its own (the
SQS emulator is shared, each world has its own queue), starts one replica in
each, lets them settle, and drains a burst of mails through all of them **at
the same time** (enqueued by the SDK, as the throughput drain does): whatever
else the machine does meanwhile hits every variant alike. Each Redis's own
figures (``INFO``: the server's CPU, commands run, bytes in and out) are that
replica's and its load's. From round to round the servers change hands and
the order the replicas start and drain in turns, so no variant keeps a server
or a place; a first round, not counted, loads the scripts into every server.
Each figure is the median, over rounds, of a round's ratio.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import statistics
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio

from bench.cluster import Backend, BenchError, Replica, World, world
from bench.load import Load, wait_sent
from bench.scale_redis import server_cpu
from fairpost.mailer.testing.services import redis_server

SETTLE_SECONDS = 1.0
"""After a replica's first heartbeat, before the measured interval: its start-up work ends."""


@dataclass(frozen=True)
class Variant:
    name: str
    env: Mapping[str, str] = field(default_factory=dict)
    around: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext
    """What the application's sends run inside (an application span, for one)."""
    settled: Callable[[World, int], Awaitable[None]] | None = None
    """Awaited after the last mail reached SES, before the interval ends (with the world and
    the mails drained): for work the variant does after the mail (exporting spans)."""
    otel_imported: bool | None = None
    """What the replica must report of OpenTelemetry's import (None: not checked)."""
    inspect: Callable[[World], Awaitable[dict[str, float]]] | None = None
    """Read from the world after the interval (:attr:`Drained.extra`)."""


@dataclass(frozen=True)
class Drained:
    """One variant's round: its replica's CPU and its Redis's cost over the drain."""

    variant: str
    mails: int
    daemon_cpu: float
    redis_cpu: float
    commands: int
    net_bytes: int
    extra: dict[str, float] = field(default_factory=dict)

    def per_mail(self, what: str) -> float:
        value: float = getattr(self, what)
        return value / self.mails


async def redis_counters(client: redis.asyncio.Redis) -> tuple[float, int, int]:
    """(server CPU seconds, commands run, bytes in and out) so far; ``INFO`` itself left out."""
    cpu = await server_cpu(client)
    commands: dict[str, Any] = await client.info("commandstats")
    run = sum(int(v["calls"]) for name, v in commands.items() if not name.startswith("cmdstat_info"))
    stats: dict[str, Any] = await client.info("stats")
    return cpu, run, int(stats["total_net_input_bytes"]) + int(stats["total_net_output_bytes"])


async def drain(w: World, variant: Variant, replica: Replica, mails: int, tenants: int = 20) -> Drained:
    """``replica``, of ``variant``, drains ``mails`` from ``tenants`` tenants; then it is stopped."""
    client = redis.asyncio.Redis.from_url(w.config["redis_url"])
    try:
        await asyncio.sleep(SETTLE_SECONDS)
        already = w.ses.sent_count
        before = await asyncio.to_thread(replica.snapshot)
        redis_before = await redis_counters(client)
        async with Load(w.settings) as load:
            with variant.around():
                for n in range(tenants):
                    await load.burst(f"v{n}", mails // tenants)
        total = mails // tenants * tenants
        if not await wait_sent(w.ses, already + total, within=300):
            raise BenchError(f"variant {variant.name}: {w.ses.sent_count - already} of {total} mails sent")
        if variant.settled is not None:
            await variant.settled(w, total)
        await asyncio.sleep(0.5)  # the batch's deletes
        after = await asyncio.to_thread(replica.snapshot)
        redis_after = await redis_counters(client)
        extra = {} if variant.inspect is None else await variant.inspect(w)
    finally:
        await client.aclose()
        await asyncio.to_thread(w.stop_replicas)
    imported = replica.imported_otel()
    if variant.otel_imported is not None and imported != variant.otel_imported:
        raise BenchError(f"{variant.name}: OpenTelemetry imported is {imported}, not {variant.otel_imported}")
    counts = after.minus(before)
    cpu, run, net = (b - a for a, b in zip(redis_before, redis_after, strict=True))
    return Drained(variant.name, total, counts.cpu_seconds, cpu, int(run), int(net), extra)


async def rounds(
    backend: Backend,
    name: str,
    config: Mapping[str, Any],
    variants: Sequence[Variant],
    mails: int,
    count: int,
    *,
    warm: int = 200,
) -> list[dict[str, Drained]]:
    """``count`` rounds of every variant side by side, after a round of ``warm`` mails not counted."""
    with contextlib.ExitStack() as stack:
        servers = [backend] + [
            dataclasses.replace(backend, redis_port=stack.enter_context(redis_server()).port)
            for _ in variants[1:]
        ]
        out = []
        n = len(variants)
        for r in range(count + 1):
            # Who starts and drains first changes from round to round (the first replica
            # started has its burst to itself for a moment), and so does each one's server.
            order = [variants[(p + r) % n] for p in range(n)]
            placed = [servers[(p + 2 * r) % n] for p in range(n)]
            with contextlib.ExitStack() as worlds:
                each = [worlds.enter_context(world(s, f"{name}{i}", config)) for i, s in enumerate(placed)]
                # Started here, one after the other, before any drain: from the main thread,
                # so that each dies with the bench (bench.cluster, die_with_parent).
                started = [w.start_replicas(1, env=v.env)[0] for w, v in zip(each, order, strict=True)]
                size = mails if r else min(mails, warm)
                done = await asyncio.gather(
                    *(drain(w, v, p, size) for w, v, p in zip(each, order, started, strict=True))
                )
            if r:
                out.append({d.variant: d for d in done})
    return out


def ratios(results: list[dict[str, Drained]], what: str, variant: str, base: str) -> list[float]:
    """Each round's ``what`` per mail of ``variant`` over ``base``'s."""
    return [r[variant].per_mail(what) / r[base].per_mail(what) for r in results]


def median_per_mail(results: list[dict[str, Drained]], what: str, variant: str) -> float:
    return statistics.median(r[variant].per_mail(what) for r in results)


def spread(values: Sequence[float]) -> str:
    """``1.01x (0.99-1.03x over 3 rounds)``: the median and the range."""
    low, high = min(values), max(values)
    return f"{statistics.median(values):.3f}x ({low:.3f}-{high:.3f}x over {len(values)} rounds)"
