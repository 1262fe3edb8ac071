"""Streams: a tenant's notification backlog beside its own transactional mail (issue #42).

One tenant sends a steady Poisson stream of transactional mail (one SDK call a
mail) into two worlds at the same time, each with its own replica: in one it
is alone (the baseline), in the other the same tenant has enqueued a
notification backlog (10,000; 1,000 quick) just before, held to half the
tenant's rate by the stream's own limit, which lasts the whole run. Figure: the tenant's transactional p99
enqueue→SES latency with the backlog, divided by the same without it (target
≤ 1.2: the backlog moves it by at most 20 %); and the notification stream's
rate over the run, against its limit.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from bench.cluster import Backend, World, world
from bench.figures import Figure, percentile
from bench.load import Load, latencies

TENANT = "acme"
KEY = "bench-unsubscribe-key-0123456789abcdef"


@dataclass(frozen=True)
class Plan:
    rate: float
    """Transactional mails a second (the steady stream)."""
    seconds: float
    backlog: int
    quota: int
    """The tenant's mails a second; its notifications get half."""
    warmup: float
    """Seconds of the steady stream not measured (both worlds' first mails)."""


def plan(quick: bool) -> Plan:
    if quick:
        return Plan(rate=8.0, seconds=4.0, backlog=1_000, quota=40, warmup=0.5)
    return Plan(rate=8.0, seconds=40.0, backlog=10_000, quota=40, warmup=2.0)


def config(p: Plan) -> dict[str, object]:
    return {
        "global_limits": "1000/second",
        "tenant_limits": "50/second",
        "tenants": {TENANT: {"limits": f"{p.quota}/second", "notification_limits": f"{p.quota // 2}/second"}},
        "unsubscribe": {"keys": [KEY], "base_url": "https://unsubscribe.bench.example"},
    }


@dataclass
class Outcome:
    latencies: list[float]
    notifications_sent: int = 0
    most_in_a_second: int = 0
    """The most notifications SES got in any one second."""


async def enqueue_backlog(w: World, p: Plan) -> set[str]:
    """The notification backlog, enqueued before either steady stream starts: building
    10,000 mails in this process (which also serves both worlds' SES) must not stall the
    measured interval, in one world only."""
    async with Load(w.settings) as load:
        return set(await load.burst(TENANT, p.backlog, chunk=500, stream="notification"))


async def one_run(w: World, p: Plan, notes: set[str]) -> Outcome:
    """The steady transactional stream; ``notes``: the backlog's job ids (none: the baseline)."""
    async with Load(w.settings) as load:
        start = time.time()
        await load.steady({TENANT: p.rate}, p.seconds)
        end = time.time()
        await asyncio.sleep(1.0)
    sent = w.ses.sent
    transactional = [m for m in sent if m.job_id not in notes]
    out = Outcome(latencies(load, transactional, [TENANT], start + p.warmup, end))
    out.notifications_sent = sum(1 for m in sent if m.job_id in notes)
    if notes:
        out.most_in_a_second = w.ses.max_in_window_by(1.0, key=lambda m: m.job_id in notes).get(True, 0)
    return out


async def run(backend: Backend, quick: bool) -> list[Figure]:
    p = plan(quick)
    # Both streams at once, each world with its own replica, queue and SES: whatever
    # else the machine does meanwhile slows both alike, and only one has the backlog.
    with (
        world(backend, "streams-control", config(p)) as control,
        world(backend, "streams-backlog", config(p)) as treated,
    ):
        control.start_replicas(1)
        treated.start_replicas(1)
        notes = await enqueue_backlog(treated, p)
        base, loaded = await asyncio.gather(one_run(control, p, set()), one_run(treated, p, notes))
    p99_base, p99_loaded = percentile(base.latencies, 99), percentile(loaded.latencies, 99)
    limit = p.quota // 2
    return [
        Figure(
            key="streams_transactional_p99_ratio",
            title="Streams: a tenant's transactional p99, notification backlog / none",
            value=p99_loaded / p99_base,
            unit="x",
            op="<=",
            target=1.2,
            detail=(
                f"p99 {p99_loaded * 1000:.0f} ms beside {p.backlog} notifications, {p99_base * 1000:.0f} ms "
                f"without; p50 {percentile(loaded.latencies, 50) * 1000:.0f} / "
                f"{percentile(base.latencies, 50) * 1000:.0f} ms; {len(loaded.latencies)} / "
                f"{len(base.latencies)} mails at {p.rate:.0f}/s over {p.seconds:.0f} s; tenant quota "
                f"{p.quota}/second, notifications {limit}/second; 1 replica"
            ),
            data={"p99_backlog": p99_loaded, "p99_base": p99_base},
        ),
        Figure(
            key="streams_notification_window",
            title="Streams: the most notifications in a second, against the stream's own limit",
            value=float(loaded.most_in_a_second),
            unit="/s",
            op="<=",
            target=float(limit),
            safety=True,
            detail=(
                f"{loaded.notifications_sent} of {p.backlog} notifications sent while the run lasted "
                f"(limit {limit}/second, within the tenant's {p.quota}/second)"
            ),
            data={"sent": loaded.notifications_sent, "most_in_a_second": loaded.most_in_a_second},
        ),
    ]
