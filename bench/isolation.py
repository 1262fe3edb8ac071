"""Isolation, utilisation and the cost of throttling, from one pair of runs.

Light tenants send the same steady Poisson stream (one SDK call per mail)
into two worlds at the same time, each with its own replica: in one they
are alone (the baseline), in the other a noisy tenant also enqueues 100
times its per-second quota at once. Figures:

- isolation: p99 enqueue→SES latency of the light tenants with the burst,
  divided by the same without it;
- utilisation: the share of its quota the noisy tenant (a deep backlog)
  got over the measured interval;
- receives per mail of a throttled tenant: SQS receptions of the noisy
  tenant's messages (counted in the replica, bench.replica) per mail of it
  sent. 1.0 is every mail received once; a sender that put a refused mail
  back for SQS to redeliver pays one more per quota window it waits, a busy
  retry many more. The job records' ``throttled`` counts (refusals, SQS's or
  the sender's own timed retries) are reported beside it.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass

import redis.asyncio

from bench.cluster import Backend, World, world
from bench.figures import Figure, percentile
from bench.load import Load, latencies, sent_by_tenant

NOISY = "noisy"


@dataclass(frozen=True)
class Plan:
    light: dict[str, float]
    seconds: float
    quota: int
    burst_at: float
    window: tuple[float, float]
    """Utilisation interval, seconds after the burst."""


def plan(quick: bool) -> Plan:
    if quick:
        return Plan({f"light{i}": 6.0 for i in range(4)}, 3.0, 5, 0.5, (1.0, 2.5))
    return Plan({f"light{i}": 2.0 for i in range(8)}, 66.0, 10, 1.0, (3.0, 63.0))


def config(p: Plan) -> dict[str, object]:
    return {
        "global_limits": "1000/second",
        "tenant_limits": "50/second",
        "tenants": {NOISY: {"limits": f"{p.quota}/second"}},
    }


@dataclass
class Outcome:
    light_latencies: list[float]
    noisy_sent: int = 0
    window_seconds: float = 0.0
    parks: int = 0
    parked_mails: int = 0
    receptions: int = 0
    noisy_sent_total: int = 0


async def one_run(w: World, p: Plan, burst: bool) -> Outcome:
    async with Load(w.settings) as load:
        start = time.time()
        steady = asyncio.create_task(load.steady(p.light, p.seconds))
        burst_wall = start + p.burst_at
        if burst:
            await asyncio.sleep(p.burst_at)
            burst_wall = time.time()
            await load.burst(NOISY, 100 * p.quota, chunk=500)
        await steady
        end = time.time()
        await asyncio.sleep(1.0)
        counts = w.snapshot()
    sent = w.ses.sent
    out = Outcome(latencies(load, sent, p.light, start + min(2.0, p.burst_at), end))
    if burst:
        since, until = burst_wall + p.window[0], burst_wall + p.window[1]
        out.noisy_sent = sent_by_tenant(sent, since, until)[NOISY]
        out.window_seconds = until - since
        out.noisy_sent_total = sent_by_tenant(sent, 0, math.inf)[NOISY]
        out.receptions = counts.received_by_group.get(NOISY, 0)
        client = redis.asyncio.Redis.from_url(w.config["redis_url"])
        try:
            async with client.pipeline(transaction=False) as pipe:
                for job_id in load.ids([NOISY]):
                    pipe.hget(w.keys.job(job_id), "throttled")
                throttled = [int(v or 0) for v in await pipe.execute()]
        finally:
            await client.aclose()
        out.parks = sum(throttled)
        out.parked_mails = sum(1 for t in throttled if t > 0)
    return out


async def run(backend: Backend, quick: bool) -> list[Figure]:
    p = plan(quick)
    # Both at once, each with its own replica, queue and SES: whatever else the
    # machine does meanwhile slows both alike, and only one has the burst.
    with (
        world(backend, "isolation-control", config(p)) as control,
        world(backend, "isolation-burst", config(p)) as treated,
    ):
        control.start_replicas(1)
        treated.start_replicas(1)
        base, noisy = await asyncio.gather(one_run(control, p, burst=False), one_run(treated, p, burst=True))
    p99_base = percentile(base.light_latencies, 99)
    p99_burst = percentile(noisy.light_latencies, 99)
    quota_units = p.quota * noisy.window_seconds
    light = f"{len(p.light)} light tenants, {sum(p.light.values()):.0f} mails/s in all, {p.seconds:.0f} s"
    return [
        Figure(
            key="isolation_p99_ratio",
            title="Isolation: light tenants' p99 latency, burst / no burst",
            value=p99_burst / p99_base,
            unit="x",
            op="<=",
            target=1.2,
            detail=(
                f"p99 {p99_burst * 1000:.0f} ms with the burst, {p99_base * 1000:.0f} ms without; "
                f"p50 {percentile(noisy.light_latencies, 50) * 1000:.0f} / "
                f"{percentile(base.light_latencies, 50) * 1000:.0f} ms; "
                f"{len(noisy.light_latencies)} / {len(base.light_latencies)} mails; {light}; "
                f"noisy: {100 * p.quota} mails at once, quota {p.quota}/second; 1 replica"
            ),
            data={"p99_burst": p99_burst, "p99_base": p99_base},
        ),
        Figure(
            key="utilisation",
            title="Utilisation: deep-backlog tenant's share of its quota",
            value=100 * noisy.noisy_sent / quota_units,
            unit=" %",
            op=">=",
            target=97.0,
            detail=(
                f"{noisy.noisy_sent} sent of {quota_units:.0f} allowed ({p.quota}/second) "
                f"over {noisy.window_seconds:.0f} s of backlog"
            ),
            data={"sent": noisy.noisy_sent, "allowed": quota_units, "seconds": noisy.window_seconds},
        ),
        Figure(
            key="receives_per_throttled_mail",
            title="SQS cost: receives per mail of a throttled tenant",
            value=noisy.receptions / noisy.noisy_sent_total if noisy.noisy_sent_total else math.nan,
            op="<=",
            target=1.2,
            detail=(
                f"{noisy.receptions} SQS receptions of the noisy tenant's messages for "
                f"{noisy.noisy_sent_total} of its mails sent; {noisy.parked_mails} of them refused "
                f"by the quota at least once, {noisy.parks} refusals in all"
            ),
            data={
                "parks": noisy.parks,
                "throttled_mails": noisy.parked_mails,
                "receptions": noisy.receptions,
                "sent": noisy.noisy_sent_total,
            },
        ),
    ]
