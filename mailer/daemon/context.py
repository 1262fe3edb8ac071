"""What every part of the sender shares: its settings, stores, limits and counters."""

from __future__ import annotations

from dataclasses import dataclass, field

from config import Settings
from config.limits import Limits
from dispatcher.store import JobStore
from mailer.daemon.feedback import Feedback
from mailer.daemon.metrics import Metrics
from mailer.quota.engine import QuotaEngine
from mailer.quota.overrides import LimitSource


@dataclass
class SenderStats:
    received: int = 0
    sent: int = 0
    throttled_by_quota: int = 0
    throttled_by_ses: int = 0
    dead: int = 0
    dropped: int = 0
    retried: int = 0
    receives: int = 0
    empty_receives: int = 0
    by_reason: dict[str, int] = field(default_factory=dict)


@dataclass
class SenderContext:
    settings: Settings
    store: JobStore
    quota: QuotaEngine
    limits: LimitSource
    """Quota limits and pauses: the settings, or live overrides (mailer.quota.overrides)."""
    metrics: Metrics
    stats: SenderStats = field(default_factory=SenderStats)
    feedback: Feedback | None = None
    """Reputation (mailer.daemon.feedback): suppression lists, SES's verdict on SES
    tenants, sends counted for the guard; None: none of it."""

    def windows(self, tenant: str) -> tuple[Limits, Limits]:
        """The global and the tenant's quota windows, as the quota engine takes them."""
        return self.limits.global_limits(), self.limits.limits_for(tenant)

    @property
    def finished_ttl(self) -> int:
        return self.settings.job_ttl
