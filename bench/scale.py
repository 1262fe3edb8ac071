"""``--only scale``: fairpost with 100,000 tenants and a million-job backlog.

Every figure is a ratio (or a count) taken within one run:

- each per-mail and per-second operation's Redis cost on 10 busy tenants
  with 99,990 more waiting against on the same 10 alone, and (reported) on a
  random tenant of 100,000 against one of 10 (:mod:`bench.scale_ops`, which
  ``python -m bench.scale_ops`` runs alone);
- Redis CPU of an idle dispatcher over 100,000 blocked tenants against 10
  (:mod:`bench.scale_idle`);
- enqueue and drain rates of a 1,000,000-job backlog against a 10,000-job
  one, and Redis memory per waiting job with a 1 KB mail
  (:mod:`bench.scale_backlog`);
- Redis CPU per delivered mail and SQS messages in flight per throttled
  tenant, with real daemon replicas (:mod:`bench.scale_pipeline`), and the
  mails per second one busy shard carries: the same drain's commands
  replayed on a shard of their own (:mod:`bench.shard_replay`).

``--quick`` runs the same with smaller numbers (2,000 tenants, a 20,000-job
backlog against 2,000) and reports the same ratios.
"""

from __future__ import annotations

from bench import scale_backlog, scale_idle, scale_ops, scale_pipeline, shard_replay
from bench.cluster import Backend
from bench.figures import Figure


async def run(backend: Backend, quick: bool) -> list[Figure]:
    tenants = 2_000 if quick else 100_000
    figures: list[Figure] = []
    figures += await scale_ops.on_own_server(quick)
    figures += await scale_idle.measure(backend, tenants, 10, 4.0 if quick else 32.0)
    big, small = (20_000, 2_000) if quick else (1_000_000, 10_000)
    figures += await scale_backlog.measure(big, small, small)
    figures += await scale_pipeline.redis_cpu_per_mail(backend, 200 if quick else 2_000)
    figures += await shard_replay.measure(backend, 200 if quick else 2_000)
    figures.append(await scale_pipeline.inflight_per_throttled_tenant(backend, quick))
    return figures
