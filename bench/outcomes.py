"""What the outcome feed costs, and how fast its webhooks go out (issue #28).

- **Redis's cost of an event**: rounds of a replica draining a burst with the
  feed on (the default: each mail's ``mail.sent`` appended by ``finish.lua``
  in the step that records it, the webhook fan-out following the feed with no
  endpoint registered) and off (``FAIRPOST_OUTCOMES__ENABLED=false``), side by
  side, each on a Redis of its own (:mod:`bench.variants`); Redis's CPU,
  commands and bytes a mail, the difference being one event's; and the feed's
  memory per event.
- **Deliveries a second**: one replica fills the feed with the ``mail.sent`` of
  a burst, its webhooks off, and stops; then one replica with the ``webhooks``
  role alone (``fairpost run --role webhooks``) delivers every event to its
  tenant's endpoint at a local receiver (:mod:`bench.sink`, its own process,
  which verifies each delivery with the ``standardwebhooks`` package and
  answers 200 at once). The rate is over the middle 80 % of the arrivals.
"""

from __future__ import annotations

import statistics
from typing import Any

import redis.asyncio

from bench.cluster import Backend, BenchError, World, world
from bench.figures import Figure
from bench.sink import Sink
from bench.variants import Variant, drain, median_per_mail, ratios, redis_counters, rounds, spread
from fairpost.config import Settings
from fairpost.mailer.errors import TimedOut
from fairpost.mailer.sdk.outcomes.endpoints import Webhooks
from fairpost.mailer.testing.wait import wait_for_async

UNBOUND = {"global_limits": "100000/second", "tenant_limits": "100000/second"}
DELIVERY_TARGET = 1000.0
"""Deliveries a second one replica sustains against a local receiver (issue #28, build 6)."""
ENDPOINTS = 16


async def feed_memory(w: World) -> dict[str, float]:
    """The feed's events and the Redis memory they take."""
    client = redis.asyncio.Redis.from_url(w.config["redis_url"])
    try:
        feed = w.keys.outcomes()
        return {"events": await client.xlen(feed), "memory": await client.memory_usage(feed, samples=0) or 0}
    finally:
        await client.aclose()


async def event_cost(backend: Backend, quick: bool) -> list[Figure]:
    mails, count = (100, 1) if quick else (2000, 3)
    on, append, off = "events", "events, no webhook task", "no events"
    variants = [
        Variant(on, inspect=feed_memory),
        Variant(append, {"FAIRPOST_WEBHOOK_ENABLED": "false"}),
        Variant(off, {"FAIRPOST_OUTCOMES__ENABLED": "false"}),
    ]
    results = await rounds(backend, "outcomes", UNBOUND, variants, mails, count)
    events = int(sum(r[on].extra["events"] for r in results))
    memory = int(sum(r[on].extra["memory"] for r in results))

    def each(what: str, scale: float = 1.0, digits: int = 1) -> str:
        return " / ".join(f"{scale * median_per_mail(results, what, v.name):.{digits}f}" for v in variants)

    def more(variant: str) -> list[float]:
        return [1e6 * (r[variant].per_mail("redis_cpu") - r[off].per_mail("redis_cpu")) for r in results]

    def more_of(what: str, variant: str) -> float:
        return median_per_mail(results, what, variant) - median_per_mail(results, what, off)

    cpu = ratios(results, "redis_cpu", on, off)
    common = (
        f"per mail with the feed / with the feed and no webhook task / without (medians): Redis CPU "
        f"{each('redis_cpu', 1e6)} µs, commands {each('commands', digits=2)}, bytes in+out "
        f"{each('net_bytes', digits=0)}, the replica's CPU {each('daemon_cpu', 1e3, 2)} ms; the feed: "
        f"{memory / max(1, events):.0f} bytes of Redis memory an event ({events} events); one event "
        f"(mail.sent) a mail, {mails} mails of 20 tenants a round, a replica and a Redis each, side by "
        "side, enqueue included, no webhook endpoint"
    )
    return [
        Figure(
            key="outcome_redis_cpu_ratio",
            title="Outcome feed on / off: Redis CPU per mail",
            value=statistics.median(cpu),
            unit="x",
            detail=f"{spread(cpu)}; {common}",
            data={"ratios": cpu, "memory_per_event": memory / max(1, events)},
        ),
        Figure(
            key="outcome_event_redis_usec",
            title="Outcome feed: Redis CPU of one event",
            value=statistics.median(more(on)),
            unit=" µs",
            detail=(
                f"a mail with the feed less one without, by round: {', '.join(f'{i:.1f}' for i in more(on))} "
                f"µs, {more_of('commands', on):+.2f} commands, {more_of('net_bytes', on):+.0f} bytes in+out; "
                f"of which the append alone (no webhook task following the feed): "
                f"{', '.join(f'{i:.1f}' for i in more(append))} µs, {more_of('commands', append):+.2f} "
                f"commands, {more_of('net_bytes', append):+.0f} bytes; {common}"
            ),
            data={"increments_usec": more(on), "append_only_usec": more(append)},
        ),
    ]


async def delivery_rate(backend: Backend, quick: bool) -> Figure:
    mails = 200 if quick else 5000
    sink = Sink(backend.workdir)
    try:
        with world(backend, "webhooks", UNBOUND) as w:
            admin = Settings(**{**w.config, "webhook": {"allow_private": True}})
            with Webhooks(admin) as hooks:
                for n in range(ENDPOINTS):
                    made = hooks.add(f"v{n}", sink.hook_url(f"v{n}"))
                    sink.secret(f"v{n}", made.secret)
            fill = Variant("fill", {"FAIRPOST_WEBHOOK_ENABLED": "false"})
            (filler,) = w.start_replicas(1, env=fill.env)
            filled = await drain(w, fill, filler, mails, tenants=ENDPOINTS)
            env = {"FAIRPOST_WEBHOOK_ALLOW_PRIVATE": "true"}
            (replica,) = w.start_replicas(1, env=env, args=["--role", "webhooks"])
            client = redis.asyncio.Redis.from_url(w.config["redis_url"])
            try:
                before, redis_before = replica.snapshot(), await redis_counters(client)
                try:
                    await wait_for_async(
                        lambda: len(sink.stats()["arrivals"]) >= filled.mails,
                        within=300,
                        what="every delivery at the receiver",
                        interval=0.25,
                    )
                except TimedOut:
                    raise BenchError(f"webhooks: {len(sink.stats()['arrivals'])} of {filled.mails}") from None
                after, redis_after = replica.snapshot(), await redis_counters(client)
            finally:
                await client.aclose()
        got: dict[str, Any] = sink.stats()
    finally:
        sink.stop()
    arrivals = sorted(got["arrivals"])
    lo, hi = len(arrivals) // 10, len(arrivals) * 9 // 10
    rate = (hi - lo) / (arrivals[hi] - arrivals[lo])
    n = len(arrivals)
    cpu = after.minus(before).cpu_seconds / n
    redis_cpu = (redis_after[0] - redis_before[0]) / n
    commands = (redis_after[1] - redis_before[1]) / n
    return Figure(
        key="webhook_deliveries_per_second",
        title="Webhooks: deliveries a second, one replica",
        value=rate,
        unit="/s",
        op=">=",
        target=DELIVERY_TARGET,
        detail=(
            f"{n} deliveries of {filled.mails} events ({got['distinct_events']} distinct ids, "
            f"{sum(got['unverified'].values())} not verified) to {ENDPOINTS} tenants' endpoints in "
            f"{arrivals[-1] - arrivals[0]:.1f} s, each verified with standardwebhooks at a local receiver "
            f"answering 200; the replica (--role webhooks, default concurrency 64, 4 an endpoint) "
            f"{1000 * cpu:.2f} ms CPU a delivery; Redis {1e6 * redis_cpu:.0f} µs CPU and "
            f"{commands:.1f} commands a delivery, the fan-out included"
        ),
        data={"deliveries": n, "cpu_ms": 1000 * cpu, "redis_usec": 1e6 * redis_cpu, "commands": commands},
    )


async def run(backend: Backend, quick: bool) -> list[Figure]:
    return [*await event_cost(backend, quick), await delivery_rate(backend, quick)]
