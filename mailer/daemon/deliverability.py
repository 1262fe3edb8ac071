"""The daemon's side of the deliverability rollups: each outcome's recipients told
apart by mailbox provider (:mod:`.mx`), queued as one script call on the caller's
pipeline (:class:`fairpost.mailer.sdk.rollups.RollupWriter`), and counted in
Prometheus once that pipeline ran (:class:`DeliverabilityMetrics`).

Callers: the sender (``sent``, a group at a time, with the send history, and
``suppressed``), the SES event consumer (``delivered``, ``hard_bounced``,
``soft_bounced``, ``complained``), and whatever records a ``recipient.unsubscribed``
outcome (:func:`fairpost.mailer.sdk.rollups.counter_of` maps an event type to its counter).
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Callable, Iterable, Mapping

import redis.asyncio
from prometheus_client import CollectorRegistry, Counter

from fairpost.config import Settings
from fairpost.mailer.daemon.mx import Lookup, ProviderMap
from fairpost.mailer.sdk.keys import MailKeys
from fairpost.mailer.sdk.rollups import COUNTERS, RollupWriter
from fairpost.mailer.sdk.suppression import normalize

__all__ = ["Counts", "DeliverabilityCounter", "DeliverabilityMetrics", "domain_of"]

Counts = Mapping[tuple[str, str], int]
"""(provider, counter) → recipients."""


def domain_of(address: str) -> str:
    return normalize(address).rpartition("@")[2].rstrip(".")


class DeliverabilityMetrics:
    """``fairpost_deliverability_total{provider, outcome}``: recipients this replica
    counted, by provider (a bounded set: config/providers.py and ``other``) and
    outcome (:data:`COUNTERS`); with FAIRPOST_DELIVERABILITY__METRICS_TENANT, also
    ``fairpost_deliverability_tenant_total{tenant, provider, outcome}``, its tenants
    bounded as every tenant label is."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.total = Counter(
            "fairpost_deliverability",
            "Recipients counted in the deliverability rollups, by mailbox provider and outcome.",
            ["provider", "outcome"],
            registry=registry,
        )
        self.by_tenant = Counter(
            "fairpost_deliverability_tenant",
            "Recipients counted in the deliverability rollups, by tenant, provider and outcome.",
            ["tenant", "provider", "outcome"],
            registry=registry,
        )

    def observe(self, counts: Counts, tenant_label: str | None = None) -> None:
        for (provider, outcome), n in counts.items():
            self.total.labels(provider, outcome).inc(n)
            if tenant_label is not None:
                self.by_tenant.labels(tenant_label, provider, outcome).inc(n)


class DeliverabilityCounter:
    def __init__(
        self,
        client: redis.asyncio.Redis,
        keys: MailKeys,
        settings: Settings,
        metrics: DeliverabilityMetrics,
        *,
        tenant_label: Callable[[str], str] | None = None,
        lookup: Lookup | None = None,
    ) -> None:
        self.enabled = settings.deliverability.enabled
        self.writer = RollupWriter(client, keys, settings)
        self.providers = ProviderMap(settings, lookup)
        self.metrics = metrics
        self._tenant_label = tenant_label if settings.deliverability.metrics_tenant else None

    def warm(self, addresses: Iterable[str]) -> None:
        """Start the MX lookups these recipients' domains need (before their mail is sent)."""
        if self.enabled:
            self.providers.warm({domain_of(a) for a in addresses})

    async def counts(self, counter: str, addresses: Iterable[str]) -> dict[tuple[str, str], int]:
        """The recipients by (provider, ``counter``): a lookup only for a domain not yet known."""
        assert counter in COUNTERS, counter
        if not self.enabled:
            return {}
        domains = [domain_of(a) for a in addresses]
        providers = await self.providers.providers(domains)
        return dict(Tally((providers[d], counter) for d in domains))

    async def queue(
        self, pipe: redis.asyncio.client.Pipeline, tenant: str, counts: Counts, *, sent_now: int = 0
    ) -> None:
        """One script call on ``pipe`` (the send history is kept even with the rollups
        off: the console's charts read it); call :meth:`counted` once it ran."""
        await self.writer.queue(pipe, tenant, counts, sent_now=sent_now)

    def counted(self, tenant: str, counts: Counts) -> None:
        label = self._tenant_label(tenant) if self._tenant_label is not None else None
        self.metrics.observe(counts, label)
