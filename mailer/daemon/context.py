"""What every part of the sender shares: its settings, stores, limits and counters."""

from __future__ import annotations

from dataclasses import dataclass, field

from fairpost.config import Settings
from fairpost.config.limits import Limits
from fairpost.dispatcher.store import JobStore
from fairpost.mailer.daemon.feedback import Feedback
from fairpost.mailer.daemon.holds import Holds
from fairpost.mailer.daemon.loaded_scripts import LoadedScripts
from fairpost.mailer.daemon.mail_jobs import MailJobs
from fairpost.mailer.daemon.metrics import Metrics
from fairpost.mailer.daemon.provider_holds import ProviderHolds
from fairpost.mailer.quota.engine import Grant, QuotaEngine
from fairpost.mailer.quota.overrides import LimitSource, OverrideCache


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
    """Quota limits and pauses: the settings, or live overrides (fairpost.mailer.quota.overrides)."""
    metrics: Metrics
    holds: Holds
    """Whether a tenant may send now, and its holds told (fairpost.mailer.daemon.holds)."""
    mail: MailJobs
    """What only mail keeps of its jobs (fairpost.mailer.daemon.mail_jobs)."""
    stats: SenderStats = field(default_factory=SenderStats)
    feedback: Feedback | None = None
    """Reputation (fairpost.mailer.daemon.feedback): suppression lists, sends counted for
    the guard, SES asked about a tenant's SES tenant; None: none of it."""
    provider_holds: ProviderHolds | None = None
    """The per-provider guard's holds (fairpost.mailer.daemon.provider_holds); None: off."""
    scripts: LoadedScripts = field(default_factory=LoadedScripts)
    """The scripts this process has seen loaded (its pipelines skip ``SCRIPT EXISTS``)."""

    def windows(self, tenant: str) -> tuple[Limits, Limits]:
        """The global and the tenant's quota windows, as the quota engine takes them."""
        return self.limits.global_limits(), self.limits.limits_for(tenant)

    def refusal_reason(self, tenant: str, grant: Grant) -> str | None:
        """``warmup`` or ``warmup_held`` when the tenant's warm-up step refused its mail
        (mailer/quota/warmup.py); None otherwise (the quota's own reason applies)."""
        if grant.blocked_by != "tenant" or not isinstance(self.limits, OverrideCache):
            return None
        return self.limits.refusal_reason(tenant, grant.binding)

    @property
    def finished_ttl(self) -> int:
        return self.settings.job_ttl
