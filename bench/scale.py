"""``--only scale``: fairpost with 100,000 tenants and a million-job backlog.

Every figure is a ratio (or a count) taken within one run:

- each per-mail and per-second operation's Redis cost with 100,000 tenants
  waiting against 10 (:mod:`bench.scale_ops`);
- Redis CPU of an idle dispatcher over 100,000 blocked tenants against 10
  (:mod:`bench.scale_idle`);
- enqueue and drain rates of a 1,000,000-job backlog against a 10,000-job
  one, and Redis memory per waiting job with a 1 KB mail
  (:mod:`bench.scale_backlog`);
- Redis CPU per delivered mail, the mails per second one shard carries at
  that cost, and SQS messages in flight per throttled tenant, with real
  daemon replicas (:mod:`bench.scale_pipeline`).

``--quick`` runs the same with smaller numbers (2,000 tenants, a 20,000-job
backlog against 2,000) and reports the same ratios.
"""

from __future__ import annotations

import redis.asyncio

from bench import scale_backlog, scale_idle, scale_ops, scale_pipeline
from bench.cluster import Backend
from bench.figures import Figure
from mailer.testing.services import redis_server


async def run(backend: Backend, quick: bool) -> list[Figure]:
    tenants = 2_000 if quick else 100_000
    figures: list[Figure] = []
    with redis_server() as server:
        client = redis.asyncio.Redis.from_url(server.url())
        try:
            rounds, k = (3, 100) if quick else (9, 300)
            figures += await scale_ops.measure(client, tenants, 10, rounds, k)
        finally:
            await client.aclose()
    figures += await scale_idle.measure(backend, tenants, 10, 3.0 if quick else 20.0)
    big, small = (20_000, 2_000) if quick else (1_000_000, 10_000)
    figures += await scale_backlog.measure(big, small, small)
    figures += await scale_pipeline.redis_cpu_per_mail(backend, 200 if quick else 2_000)
    figures.append(await scale_pipeline.inflight_per_throttled_tenant(backend, quick))
    return figures
