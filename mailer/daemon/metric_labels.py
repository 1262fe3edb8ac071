"""The label values of the daemon's metrics, each set bounded: the reasons, outcomes
and tasks each metric may carry, and the tenants that get a ``tenant`` label of their
own (:class:`TenantLabels`); every other tenant is counted under ``~other``."""

from __future__ import annotations

from collections.abc import Iterable

__all__ = [
    "DEAD_REASONS",
    "DROP_REASONS",
    "EVENT_OUTCOMES",
    "HELD_REASONS",
    "OTHER_TENANT",
    "RECONCILE_REASONS",
    "SES_RESULTS",
    "TASKS",
    "THROTTLE_REASONS",
    "TenantLabels",
]

OTHER_TENANT = "~other"
"""The ``tenant`` label of every tenant beyond the bounded set."""

THROTTLE_REASONS = (
    "tenant_quota", "global_quota", "global_share", "ses", "paused", "reputation_paused",
    "ses_tenant_disabled", "warmup", "warmup_held",
)  # fmt: skip
"""``fairpost_mail_throttled_total{reason}``: who held the mail back (``warmup``: the
tenant's warm-up step; ``warmup_held``: a step held for its bounce or complaint rate;
``paused``, ``reputation_paused``, ``ses_tenant_disabled`` and ``ses_<code>``: the tenant's
hold, fairpost.mailer.daemon.holds; ``provider_paused:<provider>``: the guard per provider,
fairpost.mailer.daemon.provider_holds)."""

DEAD_REASONS = (
    "rejected",
    "attempts",
    "too_many_recipients",
    "poison",
    "too_large",
    "sqs_rejected",
    "stranded",
)
"""``fairpost_mail_dead_total{reason}``: SES refused it for good; transient failures
ran out of attempts; more recipients than a quota window allows; an unreadable
SQS message; bigger than an SQS message; SQS refused the entry; SQS lost its
message again and again (mailer/daemon/reconcile.py)."""

RECONCILE_REASONS = ("handed_again", "dead")
"""``fairpost_jobs_reconciled_total{reason}``: dispatched jobs SQS no longer held
(a redrive policy, a purge, the retention period): handed to SQS again, or,
after FAIRPOST_RECONCILE_HANDOFFS such hand-offs, dead-lettered."""

DROP_REASONS = ("no_record",)
"""``fairpost_mail_dropped_total{reason}``: SQS messages deleted unsent because
nothing says they may go: their job record is gone (purged, expired)."""

HELD_REASONS = ("ses_tenant_disabled", "reputation_paused", "reputation_throttled")
"""``fairpost_tenant_held{reason}``: SES disabled the tenant's SES tenant; the reputation
guard paused or throttled the tenant (mailer/quota/reputation.py)."""

EVENT_OUTCOMES = (
    "bounce", "complaint", "delivery", "reject", "delivery_delay", "received",
    "ignored", "duplicate", "unmatched", "unparseable", "poison",
)  # fmt: skip
"""``fairpost_ses_events_total{outcome}`` (mailer/daemon/events.py); ``poison``: handling
the event raised while Redis answered, so it was dropped."""

TASKS = (
    "dispatcher", "reconciler", "sender", "slots", "ses-account", "ses-tenants", "events",
    "overrides", "heartbeat", "webhook-fanout", "webhooks", "redis-memory",
)  # fmt: skip
"""``fairpost_task_errors_total{task}``: the daemon's background tasks, whose failed steps
are counted (fairpost.dispatcher.loop)."""


SES_RESULTS = ("sent", "throttled", "paused", "tenant", "permanent", "transient")


class TenantLabels:
    """Maps a tenant id to its label value, keeping the label set bounded."""

    def __init__(self, configured: Iterable[str] = (), limit: int = 50) -> None:
        self._fixed = frozenset(configured)
        self._limit = limit
        self._seen: set[str] = set()

    def __call__(self, tenant: str) -> str:
        if tenant in self._fixed or tenant in self._seen:
            return tenant
        if len(self._seen) < self._limit:
            self._seen.add(tenant)
            return tenant
        return OTHER_TENANT

    def labelled(self, tenant: str) -> bool:
        """Whether the tenant has (or now gets) a label of its own."""
        return self(tenant) != OTHER_TENANT

    @property
    def limit(self) -> int:
        return self._limit

    def known(self) -> frozenset[str]:
        """The tenants that have a label of their own so far."""
        return self._fixed | self._seen
