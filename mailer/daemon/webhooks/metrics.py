"""The webhook deliveries' metrics, in the daemon's registry
(:class:`fairpost.mailer.daemon.metrics.Metrics`).

Counters count what this replica did (sum them across replicas); the gauges are
read from Redis at scrape time and describe every endpoint (take ``max``).
"""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from fairpost.mailer.sdk.outcomes.pending import PendingDeliveries

__all__ = ["ATTEMPT_RESULTS", "DELIVERY_RESULTS", "DISABLE_REASONS", "WebhookMetrics"]

ATTEMPT_RESULTS = ("delivered", "http_error", "gone", "timeout", "connection", "blocked")
"""``fairpost_webhook_attempts_total{result}`` (mailer/daemon/webhooks/post.py)."""
DELIVERY_RESULTS = ("delivered", "given_up")
"""``fairpost_webhook_deliveries_total{result}``: how deliveries ended."""
DISABLE_REASONS = ("gone", "failing")
"""``fairpost_webhook_endpoints_disabled_total{reason}``: a 410, or failing for
FAIRPOST_WEBHOOK_DISABLE_AFTER."""

_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class WebhookMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.attempts = Counter(
            "fairpost_webhook_attempts", "Webhook delivery attempts, by result.", ["result"], registry=r
        )
        self.deliveries = Counter(
            "fairpost_webhook_deliveries", "Webhook deliveries ended, by result.", ["result"], registry=r
        )
        self.disabled = Counter(
            "fairpost_webhook_endpoints_disabled",
            "Webhook endpoints the daemon disabled, by reason.",
            ["reason"],
            registry=r,
        )
        self.seconds = Histogram(
            "fairpost_webhook_attempt_seconds",
            "How long a delivery attempt took.",
            buckets=_BUCKETS,
            registry=r,
        )
        self.pending = Gauge(
            "fairpost_webhook_pending", "Webhook deliveries waiting, every endpoint.", registry=r
        )
        self.oldest = Gauge(
            "fairpost_webhook_oldest_pending_seconds",
            "Age of the oldest event a webhook endpoint still waits for (0: none waits).",
            registry=r,
        )
        self.endpoints = Gauge(
            "fairpost_webhook_endpoints", "Webhook endpoints, by state.", ["state"], registry=r
        )
        for state in ("enabled", "disabled"):
            self.endpoints.labels(state).set(0)

    def attempted(self, result: str, seconds: float) -> None:
        self.attempts.labels(result).inc()
        self.seconds.observe(seconds)

    def ended(self, result: str) -> None:
        self.deliveries.labels(result).inc()

    def endpoint_disabled(self, reason: str) -> None:
        self.disabled.labels(reason).inc()

    def update(self, pending: Mapping[str, PendingDeliveries], at_ms: int) -> None:
        """The gauges, from what every endpoint has waiting (read at scrape time)."""
        self.pending.set(sum(p.pending for p in pending.values()))
        oldest = [p.oldest_ms for p in pending.values() if p.oldest_ms is not None]
        self.oldest.set(max(0, at_ms - min(oldest)) / 1000 if oldest else 0)
        disabled = sum(p.disabled for p in pending.values())
        self.endpoints.labels("enabled").set(sum(p.endpoints for p in pending.values()) - disabled)
        self.endpoints.labels("disabled").set(disabled)
