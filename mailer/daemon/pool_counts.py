"""One sending pool's parts counting into the daemon's metrics (#43).

The per-tenant counters (``fairpost_mail_sent_total`` and the rest) carry no pool
label: a daemon serving several pools adds each tenant's mails up over them. Each
pool's parts (:func:`~fairpost.mailer.daemon.parts.build_parts`) count through a
:class:`PoolCounts` instead of the daemon's :class:`~fairpost.mailer.daemon.metrics.Metrics`:
every family is the daemon's own (the same objects, one registry), and the mails
the pool's SES accepted, made dead letters or deferred are also counted by pool
(``fairpost_pool_sent_total{pool}``, ``fairpost_pool_dead_total{pool,reason}``,
``fairpost_pool_throttled_total{pool,reason}``: bounded by the pools declared times
the reasons fairpost names).
"""

from __future__ import annotations

from typing import Any

from fairpost.config.pools import DEFAULT_POOL
from fairpost.mailer.daemon.metrics import Metrics
from fairpost.mailer.daemon.pool_metrics import PoolMetrics
from fairpost.mailer.ops.stats import Stats

__all__ = ["PoolCounts"]


class PoolCounts(Metrics):
    """The daemon's metrics as one pool's parts see them: each call the daemon's, and the
    pool's own count of its sent, dead and throttled mails besides."""

    def __init__(self, shared: Metrics, pool: str) -> None:  # no super(): nothing of its own
        self._shared = shared
        self.pool = pool
        self._pools: PoolMetrics = shared.pools
        self._pools.sent_total.labels(pool)

    def __getattr__(self, name: str) -> Any:
        # Every family and every piece of state is the daemon's: read there, never copied.
        return getattr(self._shared, name)

    def sent(self, tenant: str, created_ms: int) -> None:
        self._shared.sent(tenant, created_ms)
        self._pools.sent_total.labels(self.pool).inc()

    def dead(self, tenant: str, reason: str) -> None:
        self._shared.dead(tenant, reason)
        self._pools.dead_total.labels(self.pool, reason).inc()

    def throttled(self, tenant: str, reason: str, count: int = 1) -> None:
        self._shared.throttled(tenant, reason, count)
        self._pools.throttled_total.labels(self.pool, reason).inc(count)

    def update(self, stats: Stats, pool: str = DEFAULT_POOL, *, global_: bool = True) -> None:
        self._shared.update(stats, pool, global_=global_)

    def render(self) -> bytes:
        return self._shared.render()
