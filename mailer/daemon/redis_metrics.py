"""Redis's memory on the daemon's ``/metrics`` (:class:`fairpost.mailer.daemon.metrics.Metrics`).

Set from every reading: a scrape's (:func:`fairpost.mailer.ops.stats.collect_stats`)
and the memory watch's (:mod:`fairpost.mailer.daemon.redis_watch`). Every replica
reads the same Redis: take ``max`` across replicas, never ``sum``.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Gauge

from fairpost.dispatcher.redis_memory import RedisMemory

__all__ = ["RedisMemoryMetrics"]


class RedisMemoryMetrics:
    def __init__(self, registry: CollectorRegistry, high_water: float) -> None:
        r = registry
        self.used = Gauge("fairpost_redis_used_memory_bytes", "Redis's used_memory.", registry=r)
        self.limit = Gauge("fairpost_redis_maxmemory_bytes", "Redis's maxmemory; 0: no limit.", registry=r)
        self.evicted = Gauge(
            "fairpost_redis_evicted_keys",
            "Keys Redis evicted since it started (INFO stats evicted_keys): any may be fairpost's.",
            registry=r,
        )
        self.policy = Gauge(
            "fairpost_redis_maxmemory_policy",
            "1 for Redis's maxmemory-policy (an allkeys-* policy stops the daemon).",
            ["policy"],
            registry=r,
        )
        self.high_water = Gauge(
            "fairpost_redis_high_water_ratio",
            "FAIRPOST_REDIS_HIGH_WATER: the share of maxmemory above which the SDK refuses new mail.",
            registry=r,
        )
        self.high_water.set(high_water)

    def update(self, memory: RedisMemory) -> None:
        self.used.set(memory.used_memory)
        self.limit.set(memory.maxmemory)
        self.evicted.set(memory.evicted_keys)
        self.policy.clear()  # one policy at a time: a changed one replaces the old
        self.policy.labels(memory.policy).set(1)
