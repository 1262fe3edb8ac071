"""Quota safety: three replicas, limits that bind, every window checked at the SES side.

Global limits and one tenant's limits bind (several windows each); every
tenant starts with a deep backlog. The recording SES server does not
enforce anything here (an enforcing server would refuse, and so hide, the
mail over the limit): it records the arrival of every send, and the
largest count in any sliding window of each limit is compared with the
limit. Then every mail must have arrived exactly once.
"""

from __future__ import annotations

import asyncio
import time

import redis.asyncio

from bench.cluster import Backend, World, world
from bench.figures import Figure
from bench.load import TENANT_TAG, Load, loss_and_duplicates, wait_sent
from config.limits import parse_limits
from tests.support.ses_server import SentMail, SesServer, max_in_window

REPLICAS = 3


async def run(backend: Backend, quick: bool) -> list[Figure]:
    if quick:
        global_limits, tenant_limits, tight = "20/second; 40/3 seconds", "8/second", "3/second; 6/3 seconds"
        backlog = {"tight": 6, "b": 22, "c": 22}
    else:
        global_limits, tenant_limits = "30/second; 200/10 seconds", "10/second; 60/10 seconds"
        tight = "5/second; 25/10 seconds"
        backlog = {"tight": 70, "b": 160, "c": 160, "d": 160, "e": 160}
    config = {
        "global_limits": global_limits,
        "tenant_limits": tenant_limits,
        "tenants": {"tight": {"limits": tight}},
    }
    total = sum(backlog.values())
    # SES must not refuse what it receives: the windows are measured on what arrives.
    with world(backend, "safety", config, ses=SesServer(enforce_rate=False)) as w:
        w.start_replicas(REPLICAS)
        async with Load(w.settings) as load:
            started = time.monotonic()
            for tenant, count in backlog.items():
                await load.burst(tenant, count)
            drained = await wait_sent(w.ses, total, within=60 if quick else 180)
            seconds = time.monotonic() - started
            # Anything sent twice would arrive a little after the last first send.
            await asyncio.sleep(1.0)
        sent = w.ses.sent
        lost, duplicates, unknown = loss_and_duplicates(load, sent)
        errors = w.replica_errors()
        lag = await record_lag(w, sent)

    def worst(windows: str, key: str | None) -> tuple[float, list[str]]:
        ratio, parts = 0.0, []
        for window in parse_limits(windows):
            mails = sent if key is None else [m for m in sent if m.tag(TENANT_TAG) == key]
            peak = max_in_window(mails, float(window.seconds))
            ratio = max(ratio, peak / window.limit)
            parts.append(f"{window}: peak {peak}")
        return ratio, parts

    g_ratio, g_parts = worst(global_limits, None)
    t_ratio, t_parts = 0.0, []
    for tenant in backlog:
        r, parts = worst(tight if tenant == "tight" else tenant_limits, tenant)
        t_ratio = max(t_ratio, r)
        t_parts.append(f"{tenant} ({'; '.join(parts)})")
    common = (
        f"{REPLICAS} replicas, {total} mails, {seconds:.1f} s; SES arrival to the daemon's record: "
        f"max {lag * 1000:.0f} ms"
    )
    detail_errors = f"; replica errors: {len(errors)}" if errors else ""
    return [
        Figure(
            key="safety_global_window",
            title="Quota safety: global, largest window count / limit",
            value=g_ratio,
            op="<=",
            target=1.0,
            safety=True,
            detail=f"{'; '.join(g_parts)} ({common})",
            data={"windows": g_parts},
        ),
        Figure(
            key="safety_tenant_window",
            title="Quota safety: per tenant, largest window count / limit",
            value=t_ratio,
            op="<=",
            target=1.0,
            safety=True,
            detail="; ".join(t_parts),
            data={"tenants": t_parts},
        ),
        Figure(
            key="safety_lost",
            title="Quota safety run: mails lost",
            value=float(lost if drained else max(lost, 1)),
            op="==",
            target=0,
            safety=True,
            detail=f"{len(sent)} sends for {total} enqueued{detail_errors}",
        ),
        Figure(
            key="safety_duplicates",
            title="Quota safety run: mails sent twice",
            value=float(duplicates + unknown),
            op="==",
            target=0,
            safety=True,
            detail=f"{duplicates} job ids sent more than once, {unknown} sends of unknown jobs",
        ),
    ]


async def record_lag(w: World, sent: list[SentMail]) -> float:
    """The longest time, in seconds, from a mail's arrival at SES to the daemon's record
    of it (``sent_ms``): how long the sender took to learn and record an answer."""
    client = redis.asyncio.Redis.from_url(w.config["redis_url"])
    try:
        async with client.pipeline(transaction=False) as pipe:
            for m in sent:
                pipe.hget(w.keys.job(m.job_id or ""), "sent_ms")
            recorded = await pipe.execute()
    finally:
        await client.aclose()
    lags = [int(r) / 1000 - m.wall_time for m, r in zip(sent, recorded, strict=True) if r is not None]
    return max(lags, default=0.0)
