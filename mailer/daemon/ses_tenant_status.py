"""SES's verdict on each SES tenant, obeyed: a tenant SES disabled is parked alone.

SES keeps a reputation entity per SES tenant with two sending statuses, one
AWS manages (SES's own review) and one the customer manages
(``fairpost tenant pause --ses``), and their aggregate. While the aggregate
is ``DISABLED``, every SendEmail naming the tenant fails; fairpost parks that
tenant's mail instead (reason ``ses_tenant_disabled``): nothing is
dead-lettered, no attempt is counted, no other tenant waits.

The status is read (``GetTenant`` once for the tenant's ARN, then
``GetReputationEntity``) for tenants with mail waiting, at most once per
``FAIRPOST_REPUTATION__SES_STATUS_REFRESH`` seconds each, and at once (at
most once a second) after a send error naming the tenant; never more than
five reads a second in all (SES's control-plane calls have low rate limits). A disabled tenant
is re-read on the same schedule and resumes by itself once SES enables it.
Verdicts are shared through Redis (:meth:`fairpost.mailer.sdk.keys.MailKeys.ses_tenant_status`),
so every replica parks the tenant and ``stats`` shows it. A verdict lasts only
while something holds the tenant: once it names an SES tenant the settings no
longer map the tenant to (its mapping removed or changed), or an operator ran
``fairpost tenant resume``, it is gone and every replica unparks the tenant
(through the one event of fairpost.mailer.daemon.holds, ``on_enabled``).

The task outlives any failed step: the step is logged, counted
(``fairpost_task_errors_total{task="ses-tenants"}``) and retried after the
outage back-off; an unpark that failed is tried again on the next step.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import Awaitable, Callable
from typing import Any

import redis.asyncio
from botocore.exceptions import ClientError

from fairpost.config import Settings
from fairpost.dispatcher.backoff import OutageBackoff
from fairpost.dispatcher.loop import forever
from fairpost.dispatcher.replies import time_ms
from fairpost.mailer.daemon.aws import SesClient
from fairpost.mailer.daemon.metrics import Metrics
from fairpost.mailer.daemon.ses import redact
from fairpost.mailer.quota.holds import SES_TENANT_DISABLED
from fairpost.mailer.quota.reputation import TenantVerdict, read_verdicts
from fairpost.mailer.sdk.keys import MailKeys

__all__ = ["REASON", "SesTenantStatus"]

log = logging.getLogger("fairpost.ses_tenants")

REASON = SES_TENANT_DISABLED
"""The hold's reason, in stats, metrics and the jobs' ``waiting_for``."""

_TICK = 1.0
_MAX_READS_PER_TICK = 5
"""At most this many tenants' statuses are read a tick (a second)."""

_SOON = 1.0
"""After a send error, the tenant is re-read at once, but at most once per this many seconds."""

_NEVER = -math.inf
"""The monotonic time of a read that never was. Not 0.0: the monotonic clock counts
from the host's boot, and on a host up for less than the refresh interval a tenant
never read would wait for the host's uptime to reach it."""


class SesTenantStatus:
    """What the sender asks (``is_disabled``) and tells (``waiting``, ``send_failed``)."""

    def __init__(
        self,
        ses: SesClient,
        client: redis.asyncio.Redis,
        keys: MailKeys,
        settings: Settings,
        *,
        on_enabled: Callable[[str], Awaitable[Any]] | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self._ses = ses
        self._redis = client
        self._keys = keys
        self._settings = settings
        self._on_enabled = on_enabled
        self._metrics = metrics or Metrics()
        self._disabled: dict[str, TenantVerdict] = {}
        self._unpark: set[str] = set()
        """Tenants no verdict holds any more whose parked mail is still to be brought back."""
        self._arns: dict[str, str] = {}
        self._waiting: dict[str, float] = {}
        """Tenant → monotonic time the sender last had its mail in hand."""
        self._checked: dict[str, float] = {}
        self._soon: set[str] = set()
        self._wake = asyncio.Event()

    # -- what the sender calls (no I/O) -----------------------------------------------
    def is_disabled(self, tenant: str) -> bool:
        return tenant in self._disabled

    def verdict(self, tenant: str) -> TenantVerdict | None:
        return self._disabled.get(tenant)

    def waiting(self, tenant: str) -> None:
        if self._settings.ses_tenant_for(tenant):
            self._waiting[tenant] = time.monotonic()

    def send_failed(self, tenant: str) -> None:
        """A send naming the tenant failed: read its status now (its SES tenant may be disabled)."""
        if self._settings.ses_tenant_for(tenant):
            self._soon.add(tenant)
            self._wake.set()

    # -- reading SES ----------------------------------------------------------------------
    async def check(self, tenant: str) -> TenantVerdict | None:
        """Read the tenant's status from SES and act on it; None if it has no SES tenant
        or SES could not be asked (the last verdict stays)."""
        name = self._settings.ses_tenant_for(tenant)
        if not name:
            return None
        self._checked[tenant] = time.monotonic()
        try:
            verdict = await self._read(name)
        except Exception as exc:
            # SES could not be asked, or answered what cannot be read: the last verdict
            # stays. The tenant may have been made anew (a new ARN): look it up again next time.
            self._arns.pop(name, None)
            log.warning(
                "could not read the SES tenant's sending status: %s", _error(exc), extra={"tenant": tenant}
            )
            return None
        await self._apply(tenant, verdict)
        return verdict

    async def _read(self, name: str) -> TenantVerdict:
        arn = self._arns.get(name)
        if arn is None:
            tenant = (await self._ses.get_tenant(TenantName=name))["Tenant"]
            arn = self._arns[name] = str(tenant["TenantArn"])
        entity = (
            await self._ses.get_reputation_entity(
                ReputationEntityType="RESOURCE", ReputationEntityReference=arn
            )
        )["ReputationEntity"]
        aws = entity.get("AwsSesManagedStatus") or {}
        customer = entity.get("CustomerManagedStatus") or {}
        statuses = [s for s in (aws.get("Status"), customer.get("Status")) if s]
        aggregate = entity.get("SendingStatusAggregate") or (
            "DISABLED" if "DISABLED" in statuses else "ENABLED"
        )
        cause = aws.get("Cause") if aws.get("Status") == "DISABLED" else customer.get("Cause")
        return TenantVerdict(
            ses_tenant=name,
            aggregate=str(aggregate),
            aws_managed=aws.get("Status"),
            customer_managed=customer.get("Status"),
            cause=redact(str(cause)) if cause else None,
            checked_ms=await self._now_ms(),
        )

    async def _now_ms(self) -> int:
        return time_ms(await self._redis.time())

    async def _apply(self, tenant: str, verdict: TenantVerdict) -> None:
        was = tenant in self._disabled
        if verdict.disabled:
            self._disabled[tenant] = verdict
            await self._redis.hset(self._keys.ses_tenant_status(), tenant, json.dumps(verdict.to_json()))
            if not was:
                log.error(
                    "SES disabled the tenant's SES tenant %s (AWS-managed %s, customer-managed %s%s): "
                    "its mail waits",
                    verdict.ses_tenant,
                    verdict.aws_managed,
                    verdict.customer_managed,
                    f", {verdict.cause}" if verdict.cause else "",
                    extra={"tenant": tenant},
                )
            return
        self._disabled.pop(tenant, None)
        removed = await self._redis.hdel(self._keys.ses_tenant_status(), tenant)
        if was or removed:
            log.info(
                "SES enabled the tenant's SES tenant %s again: sending resumes",
                verdict.ses_tenant,
                extra={"tenant": tenant},
            )
            self._lifted(tenant)

    def _lifted(self, tenant: str) -> None:
        """Nothing holds the tenant any more: its parked mail is brought back by the loop,
        which tries again after a failure (an SQS outage must not leave it parked)."""
        self._unpark.add(tenant)
        self._wake.set()

    # -- the loop ---------------------------------------------------------------------------
    async def run(self, stop: asyncio.Event) -> None:
        """Read the statuses that are due until ``stop`` is set. A step that fails, whatever
        it raises, is logged, counted and retried after the outage back-off; only an
        outage longer than ``FAIRPOST_MAX_OUTAGE_SECONDS`` ends the task (loudly)."""

        async def tick() -> float:
            self._wake.clear()
            await self._tick()
            return _TICK

        backoff = OutageBackoff(self._settings.max_outage_seconds)
        await forever(
            "ses-tenants",
            tick,
            stop,
            backoff=backoff,
            on_error=self._metrics.task_failed,
            wake=[self._wake],
            described=_error,
        )

    async def _tick(self) -> None:
        # Other replicas' verdicts: a tenant one replica saw disabled is parked by all.
        shared = read_verdicts(await self._redis.hgetall(self._keys.ses_tenant_status()))
        stale = sorted(t for t, v in shared.items() if self._settings.ses_tenant_for(t) != v.ses_tenant)
        if stale:
            # The settings no longer send the tenant's mail under that SES tenant: its
            # verdict holds nothing, and re-read every tick it would park the tenant for ever.
            await self._redis.hdel(self._keys.ses_tenant_status(), *stale)
            for tenant in stale:
                del shared[tenant]
                self._lifted(tenant)
                log.info(
                    "dropped SES's verdict on an SES tenant the tenant no longer maps to",
                    extra={"tenant": tenant},
                )
        for tenant in set(self._disabled) - set(shared):
            self._disabled.pop(tenant, None)
            self._lifted(tenant)
        self._disabled.update(shared)
        now = time.monotonic()
        refresh = self._settings.reputation.ses_status_refresh
        for tenant, seen in list(self._waiting.items()):
            if now - seen > 2 * refresh:
                del self._waiting[tenant]
        # A tenant nothing waits on any more is read afresh when it comes back: its
        # last read is forgotten, or the map would keep every tenant ever seen.
        for tenant, at in list(self._checked.items()):
            if now - at > 2 * refresh and tenant not in self._waiting and tenant not in self._disabled:
                del self._checked[tenant]
        urgent = sorted(t for t in self._soon if now - self._checked.get(t, _NEVER) >= _SOON)
        routine = sorted(
            (
                t
                for t in set(self._waiting) | set(self._disabled)
                if t not in self._soon and now - self._checked.get(t, _NEVER) >= refresh
            ),
            key=lambda t: self._checked.get(t, _NEVER),
        )
        # Bounded: SES's control-plane calls have low rate limits of their own, so a
        # few reads a tick, a send error's first, then the longest unread.
        for tenant in (urgent + routine)[:_MAX_READS_PER_TICK]:
            self._soon.discard(tenant)
            await self.check(tenant)
        await self._unpark_lifted()

    async def _unpark_lifted(self) -> None:
        for tenant in sorted(self._unpark):
            if tenant in self._disabled:  # disabled again meanwhile: it stays parked
                self._unpark.discard(tenant)
                continue
            if self._on_enabled is not None:
                await self._on_enabled(tenant)  # may raise: the tenant stays due, for the next step
            self._unpark.discard(tenant)


def _error(exc: BaseException) -> str:
    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        return f"{error.get('Code', '')}: {redact(str(error.get('Message', '')))}"
    return redact(f"{type(exc).__name__}: {exc}")
