"""Quota safety: three replicas, limits that bind, every window checked at the SES side.

Global limits and one tenant's limits bind (several windows each); every
tenant starts with a deep backlog. The recording SES server does not
enforce anything here (an enforcing server would refuse, and so hide, the
mail over the limit): it records the arrival of every send, and the
largest count in any sliding window of each limit is compared with the
limit. Then every mail must have arrived exactly once.

Two runs: SES answering at once, and one mail in five reaching SES 1.2 s
after the daemon sent it (a slow network, a connection set-up retried:
longer than the shortest window), so that it arrives among mails granted
after it. The sender must keep a mail counted from its grant until a
window after SES has it, however long the call takes to get there.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import redis.asyncio

from bench.cluster import Backend, World, world
from bench.figures import Figure
from bench.load import TENANT_TAG, Load, loss_and_duplicates, wait_sent
from fairpost.config.limits import parse_limits
from fairpost.mailer.testing.ses_server import SentMail, SesServer, max_in_window

REPLICAS = 3
SLOW_ARRIVAL = 1.2
SLOW_EVERY = 5


@dataclass
class Run:
    global_ratio: float
    global_parts: list[str]
    tenant_ratio: float
    tenant_parts: list[str]
    lost: int
    duplicates: int
    total: int
    sends: int
    seconds: float
    lag: float
    errors: int
    sqs_calls: int = 0
    """Every SQS request the replicas made while the backlog drained (hand-off included)."""

    def common(self) -> str:
        return (
            f"{REPLICAS} replicas, {self.total} mails, {self.seconds:.1f} s; SES arrival to the "
            f"daemon's record: max {self.lag * 1000:.0f} ms"
            + (f"; {self.errors} error lines in replica logs" if self.errors else "")
        )


async def one_run(
    backend: Backend, name: str, limits: tuple[str, str, str], backlog: dict[str, int], delay: float
) -> Run:
    global_limits, tenant_limits, tight = limits
    config = {
        "global_limits": global_limits,
        "tenant_limits": tenant_limits,
        "tenants": {"tight": {"limits": tight}},
    }
    total = sum(backlog.values())
    # SES must not refuse what it receives: the windows are measured on what arrives.
    ses = SesServer(enforce_rate=False, arrival_delay=delay, arrival_delay_every=SLOW_EVERY)
    with world(backend, name, config, ses=ses) as w:
        w.start_replicas(REPLICAS)
        async with Load(w.settings) as load:
            before = w.snapshot()
            started = time.monotonic()
            for tenant, count in backlog.items():
                await load.burst(tenant, count)
            drained = await wait_sent(w.ses, total, within=180)
            seconds = time.monotonic() - started
            sqs_calls = w.snapshot().minus(before).sqs_calls()
            # Anything sent twice would arrive a little after the last first send.
            await asyncio.sleep(1.0 + delay)
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
    return Run(
        g_ratio,
        g_parts,
        t_ratio,
        t_parts,
        lost if drained else max(lost, 1),
        duplicates + unknown,
        total,
        len(sent),
        seconds,
        lag,
        len(errors),
        sqs_calls,
    )


async def run(backend: Backend, quick: bool) -> list[Figure]:
    if quick:
        limits = ("20/second; 40/3 seconds", "8/second", "3/second; 6/3 seconds")
        backlog = {"tight": 6, "b": 22, "c": 22}
        slow_backlog = {"tight": 4, "b": 12, "c": 12}
    else:
        limits = ("30/second; 200/10 seconds", "10/second; 60/10 seconds", "5/second; 25/10 seconds")
        backlog = {"tight": 70, "b": 160, "c": 160, "d": 160, "e": 160}
        slow_backlog = {"tight": 30, "b": 60, "c": 60, "d": 60, "e": 60}
    fast = await one_run(backend, "safety", limits, backlog, 0.0)
    slow = await one_run(backend, "safety-slow", limits, slow_backlog, SLOW_ARRIVAL)
    slow_note = f"one mail in {SLOW_EVERY} reaches SES {SLOW_ARRIVAL} s after it was sent; "
    return [
        Figure(
            key="safety_global_window",
            title="Quota safety: global, largest window count / limit",
            value=fast.global_ratio,
            op="<=",
            target=1.0,
            safety=True,
            detail=f"{'; '.join(fast.global_parts)} ({fast.common()})",
            data={"windows": fast.global_parts},
        ),
        Figure(
            key="safety_tenant_window",
            title="Quota safety: per tenant, largest window count / limit",
            value=fast.tenant_ratio,
            op="<=",
            target=1.0,
            safety=True,
            detail="; ".join(fast.tenant_parts),
            data={"tenants": fast.tenant_parts},
        ),
        Figure(
            key="safety_global_window_slow_ses",
            title="Quota safety, slow network to SES: global window / limit",
            value=slow.global_ratio,
            op="<=",
            target=1.0,
            safety=True,
            detail=f"{slow_note}{'; '.join(slow.global_parts)} ({slow.common()})",
            data={"windows": slow.global_parts},
        ),
        Figure(
            key="safety_tenant_window_slow_ses",
            title="Quota safety, slow network to SES: tenant window / limit",
            value=slow.tenant_ratio,
            op="<=",
            target=1.0,
            safety=True,
            detail=slow_note + "; ".join(slow.tenant_parts),
            data={"tenants": slow.tenant_parts},
        ),
        Figure(
            key="safety_sqs_requests_per_mail",
            title="SQS cost under binding quotas: requests per delivered mail",
            value=fast.sqs_calls / max(1, fast.sends),
            op="<=",
            target=1.5,
            detail=(
                f"{fast.sqs_calls} SQS calls (hand-off, receives, deletes, visibility) for "
                f"{fast.sends} mails; limits {'; '.join(limits)} ({fast.common()})"
            ),
        ),
        Figure(
            key="safety_lost",
            title="Quota safety runs: mails lost",
            value=float(fast.lost + slow.lost),
            op="==",
            target=0,
            safety=True,
            detail=f"{fast.sends + slow.sends} sends for {fast.total + slow.total} enqueued",
        ),
        Figure(
            key="safety_duplicates",
            title="Quota safety runs: mails sent twice",
            value=float(fast.duplicates + slow.duplicates),
            op="==",
            target=0,
            safety=True,
            detail="job ids sent more than once, or sends of jobs never enqueued",
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
