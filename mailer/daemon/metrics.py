"""Prometheus metrics of one daemon (served on ``/metrics`` by :mod:`fairpost.mailer.daemon.http`).

Counters and histograms count what *this* replica did (sum them across
replicas). Gauges (``fairpost_backlog``, ``fairpost_inflight``, quota use)
are read from Redis when ``/metrics`` is scraped and describe the whole
system, so every replica reports the same values (take ``max``, not ``sum``).

Per-tenant gauges also carry the sending pool they are read in (``pool``, #43; bounded
by the pools declared, ``default`` without any): a moved tenant in both while it drains.

The ``tenant`` label is bounded (:class:`TenantLabels`): tenants configured
in ``FAIRPOST_TENANTS`` always get their own value, plus the first
``FAIRPOST_METRICS_TENANT_LABELS`` (default 50) other tenants a replica
meets; every other tenant is counted under ``tenant="~other"`` (``~`` is not
allowed in tenant ids, so it never collides with one).

The SDK does not import this module (an application enqueuing mail needs no
prometheus-client), so there is no "enqueued" counter: enqueues show as
``fairpost_backlog`` growing, and every enqueued mail is counted by
``fairpost_mail_dispatched_total`` when it reaches SQS.
"""

from __future__ import annotations

import time

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

from fairpost.config import Settings
from fairpost.config.pools import DEFAULT_POOL
from fairpost.mailer.daemon.deliverability import DeliverabilityMetrics
from fairpost.mailer.daemon.metric_labels import (
    DEAD_REASONS,
    DROP_REASONS,
    EVENT_OUTCOMES,
    HELD_REASONS,
    OTHER_TENANT,
    RECONCILE_REASONS,
    SES_RESULTS,
    TASKS,
    THROTTLE_REASONS,
    TenantLabels,
)
from fairpost.mailer.daemon.pool_metrics import PoolMetrics
from fairpost.mailer.daemon.redis_metrics import RedisMemoryMetrics
from fairpost.mailer.daemon.webhooks.metrics import WebhookMetrics
from fairpost.mailer.ops.stats import ScopeStats, Stats
from fairpost.mailer.quota.warmup import HOLD_KINDS

__all__ = ["CONTENT_TYPE", "Metrics"]

DEFAULT_HIGH_WATER: float = Settings.model_fields["redis_high_water"].default
"""FAIRPOST_REDIS_HIGH_WATER's default, for the metrics of a part built without settings."""

_LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600, 4 * 3600, 86400)
_SES_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)

CONTENT_TYPE = CONTENT_TYPE_LATEST
"""The exposition format's content type, for :mod:`fairpost.mailer.daemon.http`."""


class _Children:
    """A labelled counter's children, each looked up once: ``labels()`` checks its
    values and takes a lock on every call, a cost paid per mail. As bounded as the
    label values are (the tenants by :class:`TenantLabels`)."""

    def __init__(self, counter: Counter) -> None:
        self._counter = counter
        self._children: dict[tuple[str, ...], Counter] = {}

    def __call__(self, *values: str) -> Counter:
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = self._counter.labels(*values)
        return child


class Metrics:
    """Every metric of one daemon, in its own registry (none is global)."""

    def __init__(
        self,
        labels: TenantLabels | None = None,
        *,
        process_metrics: bool = False,
        high_water: float = DEFAULT_HIGH_WATER,
    ) -> None:
        """``process_metrics``: for the daemon, which owns its process: add process,
        platform and GC metrics, and drop the ``*_created`` series (process-wide).
        ``high_water``: FAIRPOST_REDIS_HIGH_WATER, published beside Redis's memory.

        A declarative table, long on purpose: each metric declared once, with its
        name, help and labels."""
        self.registry = CollectorRegistry()
        self.labels = labels or TenantLabels()
        self._other_seen: set[str] = set()
        """The pools whose ``~other`` series exist."""
        self._shown: dict[str, set[str]] = {}
        """Pool → the labelled tenants whose series it has (a tenant moved away loses them)."""
        self._ses_holds_seen: set[tuple[str, str, str]] = set()
        if process_metrics:
            # The daemon owns its process: its memory, CPU and file descriptors are
            # worth a series; each counter's "_created" twin is not.
            disable_created_metrics()  # type: ignore[no-untyped-call]  # unannotated upstream
            ProcessCollector(registry=self.registry)
            PlatformCollector(registry=self.registry)
            GCCollector(registry=self.registry)
        r = self.registry
        self.dispatched_total = Counter(
            "fairpost_mail_dispatched", "Mails handed to the SQS FIFO queue.", ["tenant"], registry=r
        )
        self.sent_total = Counter("fairpost_mail_sent", "Mails SES accepted.", ["tenant"], registry=r)
        self.throttled_total = Counter(
            "fairpost_mail_throttled",
            "Mails held back (parked in SQS or backed off), by reason: "
            + ", ".join(THROTTLE_REASONS)
            + ", ses_<code> (SES refused the tenant's own set-up: the tenant is held alone)"
            + ", provider_paused:<provider> (the tenant held at one mailbox provider).",
            ["tenant", "reason"],
            registry=r,
        )
        self.retried_total = Counter(
            "fairpost_mail_retried", "Transient SES failures that will be retried.", ["tenant"], registry=r
        )
        self.dead_total = Counter(
            "fairpost_mail_dead",
            "Mails dead-lettered, by reason: " + ", ".join(DEAD_REASONS) + ".",
            ["tenant", "reason"],
            registry=r,
        )
        self.dropped_total = Counter(
            "fairpost_mail_dropped",
            "SQS messages deleted unsent, by reason: " + ", ".join(DROP_REASONS) + ".",
            ["tenant", "reason"],
            registry=r,
        )
        self.reconciled_total = Counter(
            "fairpost_jobs_reconciled",
            "Dispatched jobs SQS no longer held, by what the reconciler did: "
            + ", ".join(RECONCILE_REASONS)
            + ".",
            ["reason"],
            registry=r,
        )
        self.ses_calls_total = Counter(
            "fairpost_ses_calls", "SES SendEmail calls, by result.", ["result"], registry=r
        )
        self.sqs_receives_total = Counter(
            "fairpost_sqs_receives",
            "SQS receives, by result: messages, empty, error.",
            ["result"],
            registry=r,
        )
        self.handed_back_total = Counter(
            "fairpost_sqs_handed_back",
            "Received messages handed back at shutdown (visibility 0).",
            registry=r,
        )
        self.newer_format_total = Counter(
            "fairpost_newer_format",
            "Messages written in a format newer than this fairpost reads, left for a newer one "
            "(format: what; found: its version; reads: the newest this fairpost reads).",
            ["format", "found", "reads"],
            registry=r,
        )
        self.pools = PoolMetrics(r)
        """Per sending pool (#43): fairpost.mailer.daemon.pool_metrics."""
        self.latency = Histogram(
            "fairpost_mail_latency_seconds",
            "From enqueue to SES accepting the mail.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.ses_call_seconds = Histogram(
            "fairpost_ses_call_seconds",
            "Duration of one SES SendEmail call.",
            buckets=_SES_BUCKETS,
            registry=r,
        )
        # Gauges: the whole system's state, read from Redis at scrape time. Per tenant,
        # also by the sending pool its numbers are read in (#43): bounded by the pools
        # declared; "default" without any.
        self.backlog = Gauge("fairpost_backlog", "Jobs waiting in Redis.", ["tenant", "pool"], registry=r)
        self.inflight = Gauge(
            "fairpost_inflight", "Jobs claimed or in SQS, not finished.", ["tenant", "pool"], registry=r
        )
        self.tenant_quota_used = Gauge(
            "fairpost_tenant_quota_used",
            "Recipients counted in a tenant window.",
            ["tenant", "pool", "window"],
            registry=r,
        )
        self.tenant_quota_limit = Gauge(
            "fairpost_tenant_quota_limit",
            "A tenant window's limit.",
            ["tenant", "pool", "window"],
            registry=r,
        )
        self.global_quota_used = Gauge(
            "fairpost_global_quota_used", "Recipients counted in a global window.", ["window"], registry=r
        )
        self.global_quota_limit = Gauge(
            "fairpost_global_quota_limit", "A global window's limit.", ["window"], registry=r
        )
        self.tenant_paused = Gauge(
            "fairpost_tenant_paused",
            "1 while an operator has paused the tenant.",
            ["tenant", "pool"],
            registry=r,
        )
        self.tenant_retry_after = Gauge(
            "fairpost_tenant_retry_after_seconds",
            "Seconds until the tenant's quota fits one more recipient (0: now).",
            ["tenant", "pool"],
            registry=r,
        )
        self.global_retry_after = Gauge(
            "fairpost_global_retry_after_seconds",
            "Seconds until the global quota fits one more recipient (0: now).",
            registry=r,
        )
        # Reputation (mailer/quota/reputation.py, mailer/daemon/events.py).
        self.ses_events_total = Counter(
            "fairpost_ses_events", "SES events read, by outcome: " + ", ".join(EVENT_OUTCOMES) + ".",
            ["outcome"], registry=r,
        )  # fmt: skip
        self.suppressed_total = Counter(
            "fairpost_mail_suppressed",
            "Recipients dropped unsent: on their tenant's suppression list.",
            ["tenant"],
            registry=r,
        )
        self.guard_actions_total = Counter(
            "fairpost_reputation_guard_actions",
            "Reputation guard actions: throttle, pause, unthrottle; provider_pause, provider_resume.",
            ["tenant", "action"],
            registry=r,
        )
        self.tenant_bounce_rate = Gauge(
            "fairpost_tenant_bounce_rate",
            "Permanently bounced recipients / recipients sent, over a sliding window (24h, 7d).",
            ["tenant", "pool", "window"],
            registry=r,
        )
        self.tenant_complaint_rate = Gauge(
            "fairpost_tenant_complaint_rate",
            "Complaints / recipients sent, over a sliding window (24h, 7d).",
            ["tenant", "pool", "window"],
            registry=r,
        )
        self.tenant_held = Gauge(
            "fairpost_tenant_held",
            "1 while the tenant is held, by reason: "
            + ", ".join(HELD_REASONS)
            + ", ses_<code> (SES refused the tenant's own set-up).",
            ["tenant", "pool", "reason"],
            registry=r,
        )
        self.tenant_warmup_step = Gauge(
            "fairpost_tenant_warmup_step",
            "The step (1, 2, ...) a warming tenant's plan is on; 0: not warming up.",
            ["tenant", "pool"],
            registry=r,
        )
        self.tenant_warmup_held = Gauge(
            "fairpost_tenant_warmup_held",
            "1 while a warming tenant's next step is held, by reason: " + ", ".join(HOLD_KINDS) + ".",
            ["tenant", "pool", "reason"],
            registry=r,
        )
        self.replicas = Gauge("fairpost_replicas", "Replicas with a live heartbeat.", registry=r)
        # The webhook deliveries' own (fairpost_webhook_*), and Redis's memory (fairpost_redis_*).
        self.webhooks = WebhookMetrics(r)
        self.redis_memory = RedisMemoryMetrics(r, high_water)
        # The deliverability rollups' (fairpost_deliverability_*).
        self.deliverability = DeliverabilityMetrics(r)
        self.stats_errors_total = Counter(
            "fairpost_stats_errors", "Scrapes whose gauges could not be read from Redis.", registry=r
        )
        self.task_errors_total = Counter(
            "fairpost_task_errors",
            "Steps of a background task that failed; the task backs off and goes on.",
            ["task"],
            registry=r,
        )
        # The counters moved once or more per mail, their children looked up once each.
        self._dispatched = _Children(self.dispatched_total)
        self._sent = _Children(self.sent_total)
        self._throttled = _Children(self.throttled_total)
        self._ses_calls = _Children(self.ses_calls_total)
        self._receives = _Children(self.sqs_receives_total)
        for result in SES_RESULTS:
            self.ses_calls_total.labels(result)
        for result in ("messages", "empty", "error"):
            self.sqs_receives_total.labels(result)
        for outcome in EVENT_OUTCOMES:
            self.ses_events_total.labels(outcome)
        for task in TASKS:
            self.task_errors_total.labels(task)

    # -- events (called by the sender and the mail worker) ------------------------
    def dispatched(self, tenant: str, count: int = 1) -> None:
        self._dispatched(self.labels(tenant)).inc(count)

    def sent(self, tenant: str, created_ms: int) -> None:
        self._sent(self.labels(tenant)).inc()
        if created_ms > 0:
            self.latency.observe(max(0.0, time.time() - created_ms / 1000))

    def throttled(self, tenant: str, reason: str, count: int = 1) -> None:
        self._throttled(self.labels(tenant), reason).inc(count)

    def retried(self, tenant: str) -> None:
        self.retried_total.labels(self.labels(tenant)).inc()

    def dead(self, tenant: str, reason: str) -> None:
        self.dead_total.labels(self.labels(tenant), reason).inc()

    def newer_format(self, what: str, found: int, reads: int) -> None:
        self.newer_format_total.labels(what, str(found), str(reads)).inc()

    def dropped(self, tenant: str, reason: str) -> None:
        self.dropped_total.labels(self.labels(tenant), reason).inc()

    def reconciled(self, reason: str) -> None:
        self.reconciled_total.labels(reason).inc()

    def ses_event(self, outcome: str) -> None:
        self.ses_events_total.labels(outcome).inc()

    def task_failed(self, task: str, exc: Exception | None = None) -> None:
        """A step of a background task failed (an ``on_error`` of fairpost.dispatcher.loop)."""
        self.task_errors_total.labels(task).inc()

    def suppressed(self, tenant: str, recipients: int) -> None:
        self.suppressed_total.labels(self.labels(tenant)).inc(recipients)

    def guard_action(self, tenant: str, action: str) -> None:
        self.guard_actions_total.labels(self.labels(tenant), action).inc()

    def ses_call(self, result: str, seconds: float) -> None:
        self._ses_calls(result).inc()
        self.ses_call_seconds.observe(seconds)

    def received(self, count: int) -> None:
        self._receives("messages" if count else "empty").inc()

    def receive_failed(self) -> None:
        self._receives("error").inc()

    def handed_back(self, count: int) -> None:
        self.handed_back_total.inc(count)

    # -- gauges -----------------------------------------------------------------
    def update(self, stats: Stats, pool: str = DEFAULT_POOL, *, global_: bool = True) -> None:
        """Set the gauges from a :func:`fairpost.mailer.ops.stats.collect_stats` result of
        one sending pool: its tenants' under ``pool``; with ``global_``, the unlabelled
        global ones too (the first pool served).

        ``stats`` may list only some tenants (a sample): ``~other`` is what the
        pool's counts hold beyond the labelled tenants, so the labels still sum
        to the pool's figure.
        """
        backlog: dict[str, int] = {}
        inflight: dict[str, int] = {}
        for t in stats.tenants:
            label = self.labels(t.scope)
            if label == OTHER_TENANT:
                self._other_seen.add(pool)
                continue
            backlog[label] = backlog.get(label, 0) + t.backlog
            inflight[label] = inflight.get(label, 0) + t.inflight
            self._tenant(label, pool, t)
        if gone := self._shown.get(pool, set()) - set(backlog):
            self._forget(pool, gone)
        self._shown[pool] = set(backlog)
        g = stats.global_
        other_backlog = max(0, g.backlog - sum(backlog.values()))
        other_inflight = max(0, g.inflight - sum(inflight.values()))
        if pool in self._other_seen or other_backlog or other_inflight:
            self._other_seen.add(pool)
            backlog[OTHER_TENANT] = other_backlog
            inflight[OTHER_TENANT] = other_inflight
        for label, value in backlog.items():
            self.backlog.labels(label, pool).set(value)
        for label, value in inflight.items():
            self.inflight.labels(label, pool).set(value)
        if global_:
            self._global(stats)

    def _tenant(self, label: str, pool: str, t: ScopeStats) -> None:
        """One labelled tenant's gauges, as its pool holds it."""
        self.tenant_paused.labels(label, pool).set(1 if t.paused else 0)
        self.tenant_retry_after.labels(label, pool).set(max(0.0, t.retry_after))
        for reason in HELD_REASONS:
            self.tenant_held.labels(label, pool, reason).set(1 if t.held == reason else 0)
        # A hold for the tenant's own SES set-up is labelled with its ses_<code>.
        for seen in [r for held, in_pool, r in self._ses_holds_seen if (held, in_pool) == (label, pool)]:
            self.tenant_held.labels(label, pool, seen).set(1 if t.held_by == seen else 0)
        if t.held_by is not None:
            self._ses_holds_seen.add((label, pool, t.held_by))
            self.tenant_held.labels(label, pool, t.held_by).set(1)
        if t.reputation is not None:
            for rw in t.reputation.windows:
                self.tenant_bounce_rate.labels(label, pool, rw.name).set(rw.bounce_rate)
                self.tenant_complaint_rate.labels(label, pool, rw.name).set(rw.complaint_rate)
        place = None if t.warmup is None else t.warmup.place
        self.tenant_warmup_step.labels(label, pool).set(0 if place is None else place.step + 1)
        for kind in HOLD_KINDS:
            self.tenant_warmup_held.labels(label, pool, kind).set(1 if place and place.held == kind else 0)
        for w in t.windows:
            self.tenant_quota_used.labels(label, pool, w.name).set(w.used)
            self.tenant_quota_limit.labels(label, pool, w.name).set(w.limit)

    def _forget(self, pool: str, tenants: set[str]) -> None:
        """Drop the pool's series of tenants it no longer holds (moved away, drained)."""
        for gauge in (self.backlog, self.inflight, self.tenant_paused, self.tenant_retry_after,
                      self.tenant_held, self.tenant_bounce_rate, self.tenant_complaint_rate,
                      self.tenant_warmup_step, self.tenant_warmup_held, self.tenant_quota_used,
                      self.tenant_quota_limit):  # fmt: skip
            for sample in [s for m in gauge.collect() for s in m.samples]:
                if sample.labels["pool"] == pool and sample.labels["tenant"] in tenants:
                    gauge.remove(*sample.labels.values())  # in the gauge's label order
        self._ses_holds_seen = {h for h in self._ses_holds_seen if h[1] != pool or h[0] not in tenants}

    def _global(self, stats: Stats) -> None:
        g = stats.global_
        self.global_quota_used.clear()
        self.global_quota_limit.clear()
        for w in g.windows:
            self.global_quota_used.labels(w.name).set(w.used)
            self.global_quota_limit.labels(w.name).set(w.limit)
        self.global_retry_after.set(max(0.0, g.retry_after))
        self.replicas.set(len(stats.replicas))
        if stats.memory is not None:
            self.redis_memory.update(stats.memory)

    def render(self) -> bytes:
        return generate_latest(self.registry)
