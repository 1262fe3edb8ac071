"""Which mailbox provider a recipient's domain belongs to: by the domain itself, or by
the hosts its MX records name, so that a Google Workspace or Microsoft 365 custom
domain counts as Gmail or Outlook (config/providers.py holds the table).

MX records are looked up lazily, the first time a domain is met, and
remembered for ``FAIRPOST_DELIVERABILITY__MX_CACHE_SECONDS`` in a cache of at
most ``MX_CACHE_SIZE`` domains (the least recently used leave first). At most
:data:`MAX_LOOKUPS` lookups run at once; a domain met beyond that, or whose lookup
fails or takes longer than ``MX_TIMEOUT_SECONDS`` (DNS away), counts by its name
alone (``other`` unless it is a provider's own), and a failed lookup is tried
again after :data:`RETRY_SECONDS`, not at every mail.

The lookup is injectable (:data:`Lookup`): the tests give a local fake, so they
need no DNS.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable

from fairpost.config import Settings
from fairpost.config.providers import OTHER, by_domain, by_mx

__all__ = ["MAX_LOOKUPS", "RETRY_SECONDS", "Lookup", "ProviderMap", "dns_lookup"]

log = logging.getLogger("fairpost.deliverability")

MAX_LOOKUPS = 32
RETRY_SECONDS = 60.0

Lookup = Callable[[str, float], Awaitable[list[str]]]
"""(domain, timeout in seconds) → the hosts its MX records name; raises if it cannot tell."""


async def dns_lookup(domain: str, lifetime: float) -> list[str]:
    """MX hosts through the system's resolver (dnspython, which email-validator brings);
    a domain with no MX record has none (an empty list)."""
    import dns.asyncresolver
    import dns.resolver

    try:
        answer = await dns.asyncresolver.resolve(domain, "MX", lifetime=lifetime)
    except (dns.resolver.NXDOMAIN, dns.resolver.NoAnswer):
        return []
    return [str(r.exchange) for r in answer]


class ProviderMap:
    """Domain → provider name, for the providers ``FAIRPOST_DELIVERABILITY__PROVIDERS`` names."""

    def __init__(
        self,
        settings: Settings,
        lookup: Lookup | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        conf = settings.deliverability
        self.named = frozenset(conf.providers)
        self.ttl = conf.mx_cache_seconds
        self.size = conf.mx_cache_size
        self.timeout = conf.mx_timeout_seconds
        self._lookup = lookup or dns_lookup
        self._clock = clock
        self._cache: OrderedDict[str, tuple[float, str]] = OrderedDict()
        """Domain → (until when it holds, provider)."""
        self._pending: dict[str, asyncio.Task[str]] = {}
        self.lookups = 0
        """MX lookups started (the tests read it)."""

    def known(self, domain: str) -> str | None:
        """The provider, if it is told without a lookup (a provider's own domain, or cached)."""
        own = by_domain(domain, self.named)
        if own is not None:
            return own
        hit = self._cache.get(domain)
        if hit is None:
            return None
        if hit[0] < self._clock():
            del self._cache[domain]
            return None
        self._cache.move_to_end(domain)
        return hit[1]

    def warm(self, domains: Iterable[str]) -> None:
        """Start the lookups these domains need, without waiting for them."""
        for domain in domains:
            if self.known(domain) is None:
                self._start(domain)

    async def providers(self, domains: Iterable[str]) -> dict[str, str]:
        """Each domain's provider; waits for the lookups it needs (each within the timeout)."""
        found: dict[str, str] = {}
        waiting: dict[str, asyncio.Task[str]] = {}
        for domain in set(domains):
            name = self.known(domain)
            if name is not None:
                found[domain] = name
                continue
            task = self._start(domain)
            if task is None:
                found[domain] = OTHER
            else:
                waiting[domain] = task
        for domain, task in waiting.items():
            found[domain] = await asyncio.shield(task)
        return found

    def _start(self, domain: str) -> asyncio.Task[str] | None:
        task = self._pending.get(domain)
        if task is None and len(self._pending) < MAX_LOOKUPS:
            self.lookups += 1
            task = asyncio.create_task(self._resolve(domain), name=f"mx-{domain[:40]}")
            self._pending[domain] = task
            task.add_done_callback(lambda _: self._pending.pop(domain, None))
        return task

    async def _resolve(self, domain: str) -> str:
        try:
            hosts = await asyncio.wait_for(self._lookup(domain, self.timeout), self.timeout)
        except Exception as exc:  # DNS away, slow or broken: the domain's name alone
            log.debug("MX lookup failed (%s); counted by its name", type(exc).__name__)
            self._remember(domain, OTHER, min(self.ttl, RETRY_SECONDS))
            return OTHER
        name = by_mx(hosts, self.named) or OTHER
        self._remember(domain, name, self.ttl)
        return name

    def _remember(self, domain: str, name: str, ttl: float) -> None:
        self._cache[domain] = (self._clock() + ttl, name)
        self._cache.move_to_end(domain)
        while len(self._cache) > self.size:
            self._cache.popitem(last=False)
