"""Fair share under a binding global quota: each tenant's share of what was sent, against its weight.

Four tenants with weights 1, 1, 2 and 4 each have a deep backlog; their own
limits do not bind, the global limit does. Over the measured interval each
tenant's share of the recipients SES accepted is compared with its weight
divided by the sum of weights; the figure is the largest relative
difference.
"""

from __future__ import annotations

import asyncio
import time

from bench.cluster import Backend, world
from bench.figures import Figure
from bench.load import Load, sent_by_tenant

WEIGHTS = {"w1a": 1, "w1b": 1, "w2": 2, "w4": 4}


async def run(backend: Backend, quick: bool) -> list[Figure]:
    rate = 40
    warmup, seconds = (0.5, 2.5) if quick else (4.0, 30.0)
    backlog = int(rate * (warmup + seconds) * 1.2)  # every tenant could take it all alone
    config = {
        "global_limits": f"{rate}/second",
        "tenant_limits": "1000/second",
        "tenants": {t: {"weight": w} for t, w in WEIGHTS.items()},
    }
    with world(backend, "fairshare", config) as w:
        w.start_replicas(1)
        async with Load(w.settings) as load:
            for tenant in WEIGHTS:
                await load.burst(tenant, backlog)
            start = time.time()
            await asyncio.sleep(warmup + seconds)
        sent = sent_by_tenant(w.ses.sent, start + warmup, start + warmup + seconds)
    total = sum(sent[t] for t in WEIGHTS)
    weight_sum = sum(WEIGHTS.values())
    deviations = {}
    parts = []
    for tenant, weight in WEIGHTS.items():
        want = weight / weight_sum
        got = sent[tenant] / total if total else 0.0
        deviations[tenant] = abs(got / want - 1)
        parts.append(f"{tenant} (w{weight}): {100 * got:.1f} % for {100 * want:.1f} %")
    worst = max(deviations.values())
    return [
        Figure(
            key="fair_share_deviation",
            title="Fair share: largest deviation of a share from its weight",
            value=100 * worst,
            unit=" %",
            op="<=",
            target=10.0,
            detail=(
                f"{'; '.join(parts)}; {total} sent in {seconds:.0f} s at a global "
                f"{rate}/second ({total / seconds:.1f}/s), 1 replica"
            ),
            data={"shares": {t: sent[t] for t in WEIGHTS}, "weights": WEIGHTS},
        )
    ]
