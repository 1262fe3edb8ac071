"""Opt-in failover between sending pools (#43): a pool's SES judged from its own calls.

Each served pool's SES client is watched (:class:`WatchedSes`): a SendEmail that
fails for SES's side (5xx, unreachable, a timeout: the ``transient`` class of
:mod:`fairpost.mailer.daemon.ses`; never throttling, never a refusal of the
tenant's own) starts an outage, any SendEmail SES accepts ends it. Once an outage
has lasted the pool's ``failover_after``, :class:`PoolHealth` records the pool as
failing in the directory (:meth:`~fairpost.mailer.sdk.keys.MailKeys.pool_failing`):
the SDKs then send the new mail of the tenants that name a fallback pool through
it (mailer/sdk/directory.py), once their identities were found in its SES
(mailer/daemon/fallback_checks.py), and nobody else's. While it fails, SES is probed
with ``GetAccount`` (the pool may get no other mail to try); an accepted SendEmail
switches back, and so does an answer once no SendEmail has failed for
``failover_after``: SES's control plane may answer while its sending still fails,
and the pool's waiting mail, tried again, says so. Each switch is logged, counted
(``fairpost_pool_failovers_total{pool,to}``) and stays visible in ``fairpost pools``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import redis.asyncio

from fairpost.config import Settings
from fairpost.config.pools import pool_settings
from fairpost.dispatcher.backoff import OutageBackoff
from fairpost.dispatcher.loop import forever
from fairpost.dispatcher.replies import time_ms
from fairpost.mailer.daemon.aws import SesClient
from fairpost.mailer.daemon.metrics import Metrics
from fairpost.mailer.daemon.ses import Verdict, classify
from fairpost.mailer.sdk.keys import MailKeys

__all__ = ["PoolHealth", "WatchedSes"]

log = logging.getLogger("fairpost.failover")

PROBE_SECONDS = 5.0
"""While a pool counts as failing, how often its SES is asked whether it answers again."""
CHECK_SECONDS = 1.0


def is_outage(exc: Exception) -> bool:
    """An error of SES's side: what fails over. Throttling and refusals do not."""
    try:
        return classify(exc).verdict is Verdict.TRANSIENT
    except Exception:  # classify re-raises what is no AWS or network error
        return False


class PoolHealth:
    """One pool's SES: whether it fails now, and the switch recorded in the directory."""

    def __init__(
        self,
        settings: Settings,
        pool: str,
        client: redis.asyncio.Redis,
        ses: SesClient,
        metrics: Metrics,
        *,
        clock: Callable[[], float] = time.monotonic,
        probe_seconds: float = PROBE_SECONDS,
    ) -> None:
        self.pool = pool
        self.after = pool_settings(settings, pool).failover_after
        self._redis = client
        self._key = MailKeys(settings.key_prefix).pool_failing()
        self._ses = ses
        self._metrics = metrics
        self._clock = clock
        self._probe_seconds = probe_seconds
        self.failing_since: float | None = None
        self.failed_at: float | None = None
        """When a SendEmail last failed for SES's side."""
        self.switched = False
        self._probed_at = 0.0
        self._max_outage_seconds = settings.max_outage_seconds

    def failed(self) -> None:
        self.failed_at = self._clock()
        if self.failing_since is None:
            self.failing_since = self.failed_at

    def succeeded(self) -> None:
        self.failing_since = None

    async def step(self) -> None:
        """Switch to the fallbacks once the outage lasted ``failover_after``; back once it ended."""
        if self.switched and self.failing_since is not None:
            await self._probe()
        outage = self.failing_since is not None and self._clock() - self.failing_since >= self.after
        if outage and not self.switched:
            since = time_ms(await self._redis.time())
            await self._redis.hsetnx(self._key, self.pool, str(since))
            self.switched = True
            self._metrics.pools.failovers_total.labels(self.pool, "fallback").inc()
            log.warning("pool %s: SES failing for %ss: tenants with a fallback pool now send through it",
                        self.pool, self.after)  # fmt: skip
        elif self.switched and self.failing_since is None:
            await self._redis.hdel(self._key, self.pool)
            self.switched = False
            self._metrics.pools.failovers_total.labels(self.pool, "own").inc()
            log.warning("pool %s: SES answers again: its tenants send through it again", self.pool)

    async def _probe(self) -> None:
        if self._clock() - self._probed_at < self._probe_seconds:
            return
        self._probed_at = self._clock()
        try:
            await self._ses.get_account()
        except Exception as exc:
            if is_outage(exc):
                return
        # SES answers (an error of ours is no outage of SES's), but GetAccount is not
        # SendEmail: back only once no mail's SendEmail has failed for failover_after.
        if self.failed_at is None or self._clock() - self.failed_at >= self.after:
            self.succeeded()

    async def run(self, stop: asyncio.Event) -> None:
        async def look() -> float:
            await self.step()
            return CHECK_SECONDS

        backoff = OutageBackoff(self._max_outage_seconds, most=CHECK_SECONDS * 5)
        await forever(
            f"{self.pool}/failover", look, stop, backoff=backoff, on_error=self._metrics.task_failed
        )


class WatchedSes:
    """A pool's SES client whose SendEmail answers tell its :class:`PoolHealth`."""

    def __init__(self, ses: SesClient, health: PoolHealth) -> None:
        self._ses = ses
        self._health = health

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ses, name)

    async def send_email(self, **request: Any) -> Any:
        try:
            response = await self._ses.send_email(**request)
        except Exception as exc:
            if is_outage(exc):
                self._health.failed()
            raise
        self._health.succeeded()
        return response
