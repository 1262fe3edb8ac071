"""Whether a tenant's identities exist in its fallback pool's SES (#43): the daemon's own check.

Failover is never automatic for a tenant whose identities the fallback pool's SES
lacks: its mail would be refused there. ``fairpost tenant fallback`` asks SES when
the operator names the fallback; a fallback set any other way (the SDK's
``Pools.set_fallback``, ``--skip-identity-check``, or before verdicts were kept) has
no verdict, and the SDKs do not follow it (mailer/sdk/directory.py). So every
replica serving a pool asks that pool's SES (``GetEmailIdentity``, for each of the
tenant's ``ses_identities``, else its ``default_sender``'s domain) about every
tenant that falls back to it without a verdict, or whose verdict is older than
:data:`RECHECK_SECONDS` (an identity removed since, or verified since), and writes
``verified`` or ``refused`` beside the fallback. Bounded: at most
:data:`PER_ROUND` questions a round, none about one tenant more often than
:data:`RETRY_SECONDS` (an SES that does not answer leaves the verdict as it was).
Each verdict is logged (the tenant and its sender identities, never a recipient)
and counted (``fairpost_pool_fallback_checks_total{pool,result}``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from fairpost.config import Settings
from fairpost.dispatcher.backoff import OutageBackoff
from fairpost.dispatcher.loop import forever
from fairpost.mailer.daemon.aws import SesClient
from fairpost.mailer.daemon.metrics import Metrics
from fairpost.mailer.ops.ses_tenants import tenant_identities
from fairpost.mailer.sdk.directory import AsyncPoolDirectory, FallbackCheck

__all__ = ["RECHECK_SECONDS", "FallbackChecks"]

log = logging.getLogger("fairpost.failover")

ROUND_SECONDS = 5.0
"""How often the fallbacks to a pool are looked at."""
RECHECK_SECONDS = 600.0
"""How long a verdict stands before SES is asked again."""
RETRY_SECONDS = 60.0
"""The least time between two questions about one tenant (an SES that did not answer)."""
PER_ROUND = 20
"""The most tenants asked about in a round."""
_NOT_FOUND = {"NotFoundException", "NotFound"}


class FallbackChecks:
    """The verdicts on the fallbacks to one pool, asked of that pool's SES."""

    def __init__(
        self,
        settings: Settings,
        pool: str,
        directory: AsyncPoolDirectory,
        ses: SesClient,
        metrics: Metrics,
        *,
        clock: Callable[[], float] = time.monotonic,
        recheck_seconds: float = RECHECK_SECONDS,
    ) -> None:
        self.pool = pool
        self._settings = settings
        self._directory = directory
        self._ses = ses
        self._metrics = metrics
        self._clock = clock
        self._recheck_ms = int(recheck_seconds * 1000)
        self._asked: dict[str, float] = {}

    async def step(self) -> int:
        """Ask about the fallbacks due; how many were asked about."""
        now_ms = await self._directory.now_ms()
        checks = await self._directory.fallbacks_to(self.pool)
        self._asked = {t: at for t, at in self._asked.items() if t in checks}
        due = sorted(
            (check.at_ms if check is not None else -1, tenant)
            for tenant, check in checks.items()
            if (check is None or now_ms - check.at_ms >= self._recheck_ms)
            and self._clock() - self._asked.get(tenant, -RETRY_SECONDS) >= RETRY_SECONDS
        )[:PER_ROUND]
        for _, tenant in due:
            self._asked[tenant] = self._clock()
            missing = await self._missing(tenant)
            if missing is None:
                continue
            check = FallbackCheck(self.pool, not missing, await self._directory.now_ms())
            if await self._directory.record_check(tenant, check):
                self._told(tenant, check, missing, checks[tenant])
        return len(due)

    async def _missing(self, tenant: str) -> list[str] | None:
        """The tenant's identities the pool's SES lacks; None if SES did not answer."""
        identities = tenant_identities(self._settings, tenant)
        if not identities:
            return ["(none named: set the tenant's ses_identities or default_sender)"]
        missing = []
        for identity in identities:
            try:
                await self._ses.get_email_identity(EmailIdentity=identity)
            except Exception as exc:  # an AWS error, or no answer at all
                code = getattr(exc, "response", {}).get("Error", {}).get("Code", "")
                if code not in _NOT_FOUND:
                    self._metrics.pools.fallback_checks_total.labels(self.pool, "unanswered").inc()
                    log.warning("pool %s: SES did not say whether tenant %s's identity %s exists (%s)",
                                self.pool, tenant, identity, code or type(exc).__name__)  # fmt: skip
                    return None
                missing.append(identity)
        return missing

    def _told(
        self, tenant: str, check: FallbackCheck, missing: list[str], before: FallbackCheck | None
    ) -> None:
        result = "verified" if check.verified else "refused"
        self._metrics.pools.fallback_checks_total.labels(self.pool, result).inc()
        if before is not None and before.verified == check.verified:
            return  # the same verdict again: counted, not logged again
        if check.verified:
            log.info("pool %s: tenant %s's identities exist in its SES: it may fall back to it",
                     self.pool, tenant)  # fmt: skip
        else:
            log.warning("pool %s: tenant %s may not fall back to it: its identities %s do not exist "
                        "in the pool's SES", self.pool, tenant, ", ".join(missing))  # fmt: skip

    async def run(self, stop: asyncio.Event) -> None:
        async def look() -> float:
            await self.step()
            return ROUND_SECONDS

        backoff = OutageBackoff(self._settings.max_outage_seconds, most=ROUND_SECONDS * 5)
        await forever(
            f"{self.pool}/fallback-checks", look, stop, backoff=backoff, on_error=self._metrics.task_failed
        )
