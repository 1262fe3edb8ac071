"""What one Redis shard carries, and what throttled tenants hold in SQS, with
real daemon replicas (LocalStack's SQS, the recording SES server).

- Redis CPU per delivered mail: ``INFO cpu`` of the bench's redis-server
  around a one-replica drain of mails enqueued by 20 tenants through the
  SDK (enqueue, claim, hand-off, quota, send claim, finish: all of a mail's
  life), and the mails per second one shard can carry at that cost. ``INFO
  commandstats`` shows where it goes (a script's commands are counted in
  the script and again under their own names).
- SQS messages in flight per throttled tenant: tenants whose quota allows
  one mail a minute, each with a backlog over its in-flight cap; SQS's
  ``ApproximateNumberOfMessagesNotVisible`` over the tenants, the largest of
  a few samples once they are parked.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import redis

from bench.cluster import Backend, world
from bench.figures import Figure
from bench.load import Load, wait_sent

UNBOUND = {"global_limits": "100000/second", "tenant_limits": "100000/second"}


def _cpu(client: redis.Redis) -> float:
    info: dict[str, Any] = client.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def _usec(client: redis.Redis) -> dict[str, int]:
    stats: dict[str, Any] = client.info("commandstats")
    return {name[8:]: int(v["usec"]) for name, v in stats.items()}


async def redis_cpu_per_mail(backend: Backend, mails: int) -> list[Figure]:
    tenants = 20
    with world(backend, "scale-cpu", UNBOUND) as w:
        w.start_replicas(1)
        client = redis.Redis.from_url(w.config["redis_url"])
        try:
            async with Load(w.settings) as load:
                for n in range(tenants):
                    await load.burst(f"warm{n}", 5)
                if not await wait_sent(w.ses, 5 * tenants, within=60):
                    raise RuntimeError("the warm-up mails were not sent")
                cpu0, usec0, t0 = _cpu(client), _usec(client), time.monotonic()
                for n in range(tenants):
                    await load.burst(f"d{n}", mails // tenants)
                if not await wait_sent(w.ses, 5 * tenants + mails, within=300):
                    raise RuntimeError(f"{w.ses.sent_count - 5 * tenants} of {mails} mails sent")
                seconds = time.monotonic() - t0
                cpu1, usec1 = _cpu(client), _usec(client)
        finally:
            client.close()
    per_mail = (cpu1 - cpu0) / mails
    spent = {k: v - usec0.get(k, 0) for k, v in usec1.items() if not k.startswith("info")}
    top = sorted(spent.items(), key=lambda kv: -kv[1])[:6]
    breakdown = ", ".join(f"{k} {v / mails:.0f}" for k, v in top)
    return [
        Figure(
            key="scale_redis_cpu_per_mail",
            title="Scale: Redis server CPU per delivered mail",
            value=per_mail * 1e6,
            unit=" µs",
            detail=(
                f"{(cpu1 - cpu0) * 1000:.0f} ms of Redis CPU (INFO cpu) for {mails} mails of {tenants} "
                f"tenants in {seconds:.1f} s, 1 replica, enqueue included; command µs per mail "
                f"(commandstats, script commands counted twice): {breakdown}"
            ),
            data={"cpu_seconds": cpu1 - cpu0, "mails": mails, "commandstats_usec": spent},
        ),
        Figure(
            key="scale_mails_per_shard",
            title="Scale: mails per second one Redis shard can carry",
            value=1 / per_mail if per_mail > 0 else float("inf"),
            unit="/s",
            op=">=",
            target=20_000,
            detail=f"one core's second of Redis CPU over {per_mail * 1e6:.1f} µs per mail",
        ),
    ]


async def inflight_per_throttled_tenant(backend: Backend, quick: bool) -> Figure:
    tenants, per_tenant, cap = 4, 40, 20
    config = {"global_limits": "100000/second", "tenant_limits": "1/minute", "inflight_cap": cap}
    with world(backend, "scale-parked", config) as w:
        w.start_replicas(1)
        sqs = backend.sqs()
        async with Load(w.settings) as load:
            for n in range(tenants):
                await load.burst(f"p{n}", per_tenant)
            if not await wait_sent(w.ses, tenants, within=60):
                raise RuntimeError("the throttled tenants' first mails were not sent")
            await asyncio.sleep(3.0 if quick else 8.0)
            samples: list[tuple[int, int]] = []
            for _ in range(4 if quick else 10):
                attrs = sqs.get_queue_attributes(
                    QueueUrl=w.queue_url,
                    AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
                )["Attributes"]
                samples.append(
                    (
                        int(attrs["ApproximateNumberOfMessagesNotVisible"]),
                        int(attrs["ApproximateNumberOfMessages"]),
                    )
                )
                await asyncio.sleep(0.5)
        sqs.close()
    inflight = max(s[0] for s in samples) / tenants
    depth = max(s[0] + s[1] for s in samples) / tenants
    return Figure(
        key="scale_sqs_inflight_per_throttled_tenant",
        title="Scale: SQS messages in flight per throttled tenant",
        value=inflight,
        op="<=",
        target=1,
        detail=(
            f"largest of {len(samples)} samples: {inflight:.1f} messages in flight (not visible) and "
            f"{depth:.1f} in SQS in all per tenant (in-flight cap {cap}); {tenants} tenants of "
            f"{per_tenant} mails each, quota 1/minute, 1 replica"
        ),
        data={"samples": samples, "tenants": tenants},
    )
