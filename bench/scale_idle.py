"""Redis CPU per second of an idle daemon over many tenants that each hold a
backlog over their in-flight cap (the cap handed off to SQS, the rest
waiting in Redis), against the same over 10 tenants.

Each world has a redis-server of its own (``INFO cpu`` is per server) and a
real ``fairpost run`` replica (its dispatcher loop reaps, promotes, claims
and waits; its reconciler, slot keeper, heartbeat and sender run as in
production); both replicas run at the same time, so machine noise hits both
alike. An idle redis-server's own timer work is most of what either uses, so
a hiccup of a millisecond in one world moves a single ratio by a third: the
figure is the median of the ratios of several slices, each taken on both
servers at once. Then a light tenant sends a few mails, one at a time, into each
world: its enqueue-to-SES latency over the blocked tenants against over 10.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
from collections.abc import Iterator
from typing import Any

import redis.asyncio

from bench.cluster import Backend, World, world
from bench.figures import Figure
from bench.load import Load, latencies, wait_sent
from bench.scale_redis import Side, server_cpu
from fairpost.dispatcher.calls import store_limits
from fairpost.mailer.testing.services import redis_server

CAP = 1


@contextlib.contextmanager
def _world(backend: Backend, name: str) -> Iterator[World]:
    with (
        redis_server() as server,
        world(backend, name, {"redis_url": server.url(), "inflight_cap": CAP}) as w,
    ):
        yield w


async def _fill(w: World, tenants: int) -> dict[str, Any]:
    """Every tenant: one job handed off (its cap), one waiting, blocked."""
    client = redis.asyncio.Redis.from_url(w.config["redis_url"])
    try:
        # The world's own prefix and limits, as its replica reads them.
        side = Side(client, "idle", tenants, keys=w.keys, limits=store_limits(w.settings))
        # A daemon reaped the store before its tenants came, as any store a daemon
        # serves: its once-a-store pass over the blocked tenants ended then, on none
        # (dispatcher/reap.lua). Without it the idle replica would make that pass,
        # over all of them, in the measured seconds.
        await side.store.reap()
        await side.fill(2)
        handed = await side.hold_every_slot()
        return {"tenants": tenants, "handed_off": handed, "blocked": await client.scard(side.keys.blocked())}
    finally:
        await client.aclose()


async def light_latency(w: World, mails: int) -> list[float]:
    """Enqueue-to-SES seconds of ``mails`` mails of a new tenant, one at a time."""
    already = w.ses.sent_count
    async with Load(w.settings) as load:
        t0 = time.time()
        for n in range(mails):
            await load.one("light")
            if not await wait_sent(w.ses, already + n + 1, within=30):
                raise RuntimeError(f"the light tenant's mail {n + 1} was not sent within 30 s")
        return latencies(load, w.ses.sent, ["light"], t0, time.time())


async def _cpu_slices(clients: list[Any], seconds: float, slices: int) -> list[list[float]]:
    """Each server's Redis CPU (ms per second) over each of ``slices`` back-to-back
    slices of ``seconds`` in all, the servers read together at every boundary."""
    out: list[list[float]] = []
    before = [await server_cpu(c) for c in clients]
    for _ in range(slices):
        await asyncio.sleep(seconds / slices)
        after = [await server_cpu(c) for c in clients]
        out.append([(a - b) / (seconds / slices) * 1000 for a, b in zip(after, before, strict=True)])
        before = after
    return out


async def measure(
    backend: Backend, big: int, small: int, seconds: float, light: int = 5, slices: int = 8
) -> list[Figure]:
    with _world(backend, "idle-small") as few_w, _world(backend, "idle-big") as many_w:
        info = [await _fill(few_w, small), await _fill(many_w, big)]
        clients = [redis.asyncio.Redis.from_url(w.config["redis_url"]) for w in (few_w, many_w)]
        try:
            few_w.start_replicas(1)
            many_w.start_replicas(1)
            await asyncio.sleep(3.0)  # past the replicas' first turns
            cpu = await _cpu_slices(clients, seconds, slices)
            # Alternating, one mail at a time, so that noise hits both alike.
            light_few: list[float] = []
            light_many: list[float] = []
            for _ in range(light):
                light_few += await light_latency(few_w, 1)
                light_many += await light_latency(many_w, 1)
            errors = few_w.replica_errors() + many_w.replica_errors()
        finally:
            for client in clients:
                await client.aclose()
    if errors:
        raise RuntimeError("idle replicas logged errors:\n" + "\n".join(errors[:5]))
    few, many = (statistics.fmean(side) for side in zip(*cpu, strict=True))
    ratios = [m / f for f, m in cpu if f > 0]
    few_ms, many_ms = statistics.median(light_few) * 1000, statistics.median(light_many) * 1000
    return [
        Figure(
            key="scale_idle_cpu_ratio",
            title=f"Scale: Redis CPU of an idle daemon, {big:,} blocked tenants / {small}",
            value=statistics.median(ratios) if ratios else float("nan"),
            unit="x",
            op="<=",
            target=1.5,
            detail=(
                f"{many:.2f} ms/s of Redis CPU (INFO cpu) over {info[1]['blocked']:,} blocked tenants, "
                f"{few:.2f} ms/s over {info[0]['blocked']}; each tenant 1 job handed off (its cap) and 1 "
                f"waiting; a fairpost run replica and a redis-server each, both at once, {seconds:.0f} s; "
                f"the median of {slices} slices' ratios ({min(ratios, default=0):.2f}-"
                f"{max(ratios, default=0):.2f}x)"
            ),
            data={"ms_per_s": {"big": many, "small": few}, "slices": cpu, "worlds": info},
        ),
        Figure(
            key="scale_light_latency_ratio",
            title=f"Scale: a light tenant's latency, {big:,} blocked tenants / {small}",
            value=many_ms / few_ms if few_ms else float("nan"),
            unit="x",
            detail=(
                f"median enqueue-to-SES {many_ms:.0f} ms beside {big:,} blocked tenants, {few_ms:.0f} ms "
                f"beside {small}; {light} mails each, one at a time, alternating"
            ),
            data={"big_s": light_many, "small_s": light_few},
        ),
    ]
