"""The sending pools on the daemon's ``/metrics`` (#43; :class:`fairpost.mailer.daemon.metrics.Metrics`).

Labelled by pool: bounded by the pools the settings declare. The gauges are set at
each scrape from every served pool's own numbers (its backlog, its global windows);
the unlabelled families beside them read the first pool served.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from fairpost.mailer.ops.stats import Stats

__all__ = ["PoolMetrics"]


class PoolMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.failovers_total = Counter(
            "fairpost_pool_failovers",
            "Switches of a sending pool's fallback tenants: to their fallback pool (to=fallback, its "
            "SES failing) and back (to=own).",
            ["pool", "to"],
            registry=r,
        )
        self.fallback_checks_total = Counter(
            "fairpost_pool_fallback_checks",
            "The daemon's looks at a pool's SES for the identities of the tenants falling back to it: "
            "result=verified, refused or unanswered.",
            ["pool", "result"],
            registry=r,
        )
        self.sent_total = Counter(
            "fairpost_pool_sent", "Mails SES accepted, per sending pool.", ["pool"], registry=r
        )
        self.dead_total = Counter(
            "fairpost_pool_dead", "Mails made dead letters, per sending pool.", ["pool", "reason"], registry=r
        )
        self.throttled_total = Counter(
            "fairpost_pool_throttled",
            "Mails deferred by a quota, a hold or SES's throttling, per sending pool.",
            ["pool", "reason"],
            registry=r,
        )
        self.backlog = Gauge(
            "fairpost_pool_backlog", "Jobs waiting in Redis, per sending pool.", ["pool"], registry=r
        )
        self.inflight = Gauge(
            "fairpost_pool_inflight", "Jobs in SQS, not finished, per sending pool.", ["pool"], registry=r
        )
        self.global_quota_used = Gauge(
            "fairpost_pool_global_quota_used",
            "Recipients counted in a pool's global window.",
            ["pool", "window"],
            registry=r,
        )
        self.global_quota_limit = Gauge(
            "fairpost_pool_global_quota_limit", "A pool's global limit.", ["pool", "window"], registry=r
        )

    def update(self, pool: str, stats: Stats) -> None:
        """Set one pool's gauges from its :func:`~fairpost.mailer.ops.stats.collect_stats`."""
        g = stats.global_
        self.backlog.labels(pool).set(g.backlog)
        self.inflight.labels(pool).set(g.inflight)
        for w in g.windows:
            self.global_quota_used.labels(pool, w.name).set(w.used)
            self.global_quota_limit.labels(pool, w.name).set(w.limit)
