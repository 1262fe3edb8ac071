"""Each sending pool's mails counted by pool (#43): a daemon serving two pools counts every
tenant's mails once in the per-tenant families (no pool label) and each pool's own in
``fairpost_pool_*_total{pool}``, all on the one /metrics."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from fairpost.mailer.daemon.metric_labels import TenantLabels
from fairpost.mailer.daemon.metrics import Metrics
from fairpost.mailer.daemon.pool_counts import PoolCounts


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    found = registry.get_sample_value(name, labels)
    return 0.0 if found is None else found


def test_each_pool_s_parts_count_their_own_mails_beside_the_daemon_s_totals() -> None:
    metrics = Metrics(TenantLabels(["acme"]))
    default, eu = PoolCounts(metrics, "default"), PoolCounts(metrics, "eu")
    for _ in range(3):
        default.sent("acme", 0)
    eu.sent("acme", 0)  # the same tenant, moved to eu, its last mails draining there
    eu.dead("acme", "rejected")
    eu.throttled("acme", "quota", 4)
    default.retried("acme")  # what the view does not count by pool still reaches the daemon's
    r = metrics.registry
    assert value(r, "fairpost_mail_sent_total", tenant="acme") == 4
    assert value(r, "fairpost_pool_sent_total", pool="default") == 3
    assert value(r, "fairpost_pool_sent_total", pool="eu") == 1
    assert value(r, "fairpost_pool_dead_total", pool="eu", reason="rejected") == 1
    assert value(r, "fairpost_pool_dead_total", pool="default", reason="rejected") == 0
    assert value(r, "fairpost_pool_throttled_total", pool="eu", reason="quota") == 4
    assert value(r, "fairpost_mail_retried_total", tenant="acme") == 1
    assert eu.render() == metrics.render()
    # A pool that has sent nothing yet shows 0, not no series.
    assert b'fairpost_pool_sent_total{pool="eu"} 1.0' in metrics.render()
    PoolCounts(metrics, "apac")
    assert b'fairpost_pool_sent_total{pool="apac"} 0.0' in metrics.render()
