"""The daemon's parts, built and wired in one place.

``fairpost run`` (:mod:`fairpost.mailer.daemon.app`), the tests' pipeline
(``tests/support/pipeline.py``) and the bench (``bench/strategies.py``) all
build the dispatcher and the sender with :func:`build_parts`, so what the
tests and the bench run is what the daemon runs. What they need otherwise is
a parameter of it, never a wiring of their own. What belongs to the process
rather than to the parts stays in ``app.py``: signals, the heartbeat, the
HTTP server, the webhooks and the two-phase shutdown.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

import redis.asyncio

from fairpost.config import Settings
from fairpost.config.limits import Limits
from fairpost.dispatcher.durable import durability
from fairpost.dispatcher.runner import Dispatcher
from fairpost.dispatcher.store import JobStore, store_limits
from fairpost.dispatcher.worker import Worker
from fairpost.mailer.daemon.aws import SesClient, SqsClient
from fairpost.mailer.daemon.feedback import ReputationParts
from fairpost.mailer.daemon.feedback import build as build_reputation
from fairpost.mailer.daemon.handoff import MailWorker
from fairpost.mailer.daemon.health import sender_alive
from fairpost.mailer.daemon.metrics import Metrics
from fairpost.mailer.daemon.mx import Lookup, ProviderMap
from fairpost.mailer.daemon.provider_holds import ProviderHolds
from fairpost.mailer.daemon.reconcile import Reconciler
from fairpost.mailer.daemon.sender import Sender
from fairpost.mailer.daemon.ses_account import SesAccountLimits, limits_rose
from fairpost.mailer.daemon.slots import SlotKeeper
from fairpost.mailer.daemon.tracing import Tracing
from fairpost.mailer.quota.engine import QuotaEngine
from fairpost.mailer.quota.overrides import (
    REFRESH_SECONDS,
    LimitSource,
    OverrideCache,
    Overrides,
    changed_scopes,
)
from fairpost.mailer.sdk.keys import MailKeys, mail_keys

__all__ = ["Parts", "Role", "build_parts", "publish_tenant_settings"]

Role = Literal["all", "dispatcher", "sender", "webhooks"]


@dataclass
class Parts:
    """What :func:`build_parts` built; a part the role or the knobs left out is None."""

    settings: Settings
    store: JobStore
    quota: QuotaEngine
    metrics: Metrics
    dispatcher: Dispatcher | None = None
    worker: MailWorker | None = None
    """The dispatcher's mail worker, which hands jobs to SQS."""
    reconciler: Reconciler | None = None
    sender: Sender | None = None
    account: SesAccountLimits | None = None
    """With ``FAIRPOST_GLOBAL_LIMITS=auto``: SES's account limits."""
    overrides: OverrideCache | None = None
    reputation: ReputationParts | None = None
    keeper: SlotKeeper | None = None

    def tasks(self, stop: asyncio.Event) -> dict[str, asyncio.Task[None]]:
        """Start the background task of every part built, each named as the daemon names it."""
        tasks: dict[str, asyncio.Task[None]] = {}

        def start(name: str, part: _Runs | None) -> None:
            if part is not None:
                tasks[name] = asyncio.create_task(part.run(stop), name=name)

        start("dispatcher", self.dispatcher)
        start("reconciler", self.reconciler)
        start("ses-account", self.account)
        start("overrides", self.overrides)
        if self.reputation is not None:
            tasks.update(self.reputation.tasks(stop))
        start("sender", self.sender)
        start("slots", self.keeper)
        return tasks


class _Runs(Protocol):
    async def run(self, stop: asyncio.Event) -> None: ...


async def publish_tenant_settings(store: JobStore, settings: Settings) -> None:
    """Put the per-tenant weights and in-flight caps where the dispatcher's scripts read them."""
    await store.sync_tenant_settings(
        {t: o.weight for t, o in settings.tenants.items() if o.weight},
        {t: settings.inflight_cap_for(t) for t, o in settings.tenants.items() if o.inflight_cap or o.weight},
    )


async def build_parts(
    settings: Settings,
    client: redis.asyncio.Redis,
    *,
    sqs: SqsClient,
    ses_client: SesClient,
    queue_url: str,
    role: Role = "all",
    metrics: Metrics | None = None,
    tracing: Tracing | None = None,
    full: bool = True,
    sender_sqs: SqsClient | None = None,
    mx_lookup: Lookup | None = None,
    limits: LimitSource | None = None,
    workers: Callable[[MailWorker], Sequence[Worker]] | None = None,
    reap_interval: float = 1.0,
    refresh_seconds: float = REFRESH_SECONDS,
) -> Parts:
    """Build the parts of ``role`` (``webhooks``: none of these) and wire them together.

    Knobs for the tests and the bench (``fairpost run`` leaves each as it is): ``full``
    False builds the dispatcher and the sender alone, which weighs mail against
    ``limits`` (the settings' by default), with no live overrides, reputation,
    reconciler or slot keeper; ``sender_sqs``, the sender's own SQS client (one that
    records the receives); ``workers``, the dispatcher's workers given the mail
    worker; ``reap_interval`` and ``refresh_seconds``, how often the dispatcher reaps
    and the overrides are read; ``mx_lookup``, the MX look-up (DNS by default).
    """
    parts = await _core(settings, client, metrics)
    store, quota, metrics = parts.store, parts.quota, parts.metrics
    keys = mail_keys(store.keys)
    provider_holds = None
    if full and settings.reputation.per_provider:
        # One map of domains to providers for the worker's and the sender's look-ups.
        provider_holds = ProviderHolds(client, keys, settings, ProviderMap(settings, mx_lookup))
    if role in ("all", "dispatcher"):
        worker = MailWorker(sqs, queue_url, metrics=metrics, tracing=tracing, provider_holds=provider_holds)
        _add_dispatcher(parts, client, worker, workers, reap_interval=reap_interval, full=full)
    if role not in ("all", "sender"):
        return parts
    if full:
        limits = await _add_live_limits(
            parts, client, sqs, ses_client, mx_lookup=mx_lookup, refresh_seconds=refresh_seconds
        )
    parts.sender = Sender(
        sqs=sender_sqs if sender_sqs is not None else sqs,
        ses_client=ses_client,
        queue_url=queue_url,
        store=store,
        quota=quota,
        settings=settings,
        limits=limits,
        metrics=metrics,
        feedback=parts.reputation.feedback if parts.reputation is not None else None,
        tracing=tracing,
        provider_holds=provider_holds,
    )
    if full:
        parts.keeper = _slot_keeper(parts)
    return parts


async def _auto_limits(
    parts: Parts,
    client: redis.asyncio.Redis,
    ses_client: SesClient,
    hold_changed: Callable[[str | None], Awaitable[None]],
) -> Callable[[], Limits] | None:
    """With ``FAIRPOST_GLOBAL_LIMITS=auto``, SES's account read and followed; None else."""
    if not isinstance(parts.settings.global_limits, str):
        return None

    async def auto_limits_changed(old: Limits | None, new: Limits) -> None:
        # SES allows more (a raised quota, a day's mail aging out): a gate
        # closed, or mail parked, under the old limits is looked at now.
        if limits_rose(old, new):
            await hold_changed(None)

    account = SesAccountLimits(
        ses_client, parts.settings, client=client, keys=mail_keys(parts.store.keys), quota=parts.quota,
        on_change=auto_limits_changed, on_error=parts.metrics.task_failed,
    )  # fmt: skip
    await account.start()
    parts.account = account
    return account.current


async def _core(settings: Settings, client: redis.asyncio.Redis, metrics: Metrics | None) -> Parts:
    """The store and the quota engine every role shares; the tenants' settings
    published for the scripts to read."""
    keys = MailKeys(settings.key_prefix)
    store = JobStore(client, keys, store_limits(settings))
    await publish_tenant_settings(store, settings)
    quota = QuotaEngine(client, keys, durability=durability(settings))
    return Parts(settings, store, quota, metrics or Metrics())


def _slot_keeper(parts: Parts) -> SlotKeeper:
    """While the sender's gate is closed, mail waiting in SQS keeps its slots."""
    assert parts.overrides is not None and parts.sender is not None
    store = parts.store
    return SlotKeeper(
        store, parts.quota, parts.overrides, ttl_ms=store.limits.inflight_ttl_ms,
        held=parts.sender.gate.holding, max_outage_seconds=parts.settings.max_outage_seconds,
        on_error=parts.metrics.task_failed,
    )  # fmt: skip


def _add_dispatcher(
    parts: Parts,
    client: redis.asyncio.Redis,
    worker: MailWorker,
    workers: Callable[[MailWorker], Sequence[Worker]] | None,
    *,
    reap_interval: float,
    full: bool,
) -> None:
    """The dispatcher, handing jobs to ``worker`` (and ``workers``), and its reconciler."""
    settings, store, metrics = parts.settings, parts.store, parts.metrics
    parts.worker = worker
    parts.dispatcher = Dispatcher(
        store,
        workers(worker) if workers is not None else [worker],
        concurrency=settings.dispatcher.concurrency,
        batch_size=settings.dispatcher.batch_size,
        linger_seconds=settings.dispatcher.linger_seconds,
        reap_interval=reap_interval,
        finished_ttl_seconds=settings.job_ttl,
        max_outage_seconds=settings.max_outage_seconds,
        on_error=metrics.task_failed,
    )
    if full:
        keys = mail_keys(store.keys)
        parts.reconciler = Reconciler(
            store, worker, settings, metrics=metrics, may_act=lambda: sender_alive(client, keys)
        )


async def _add_live_limits(
    parts: Parts,
    client: redis.asyncio.Redis,
    sqs: SqsClient,
    ses_client: SesClient,
    *,
    mx_lookup: Lookup | None,
    refresh_seconds: float,
) -> LimitSource:
    """The limits as they change while the daemon runs (SES's account with ``auto``,
    the live overrides) and the reputation guard; returns the limits the sender weighs.
    Each change reaches the sender's holds (built after: read when a change comes)."""
    settings, store, metrics = parts.settings, parts.store, parts.metrics
    keys = mail_keys(store.keys)

    async def hold_changed(tenant: str | None = None) -> None:
        # The one event (fairpost.mailer.daemon.holds): a hold lifted, or limits
        # a park waited for changed (None: the global ones).
        if parts.sender is not None:
            await parts.sender.holds.changed(tenant)

    auto = await _auto_limits(parts, client, ses_client, hold_changed)

    async def overrides_changed(old: Overrides, new: Overrides) -> None:
        # Mail parked under the old limits (or a pause) is weighed again now.
        global_changed, tenants = changed_scopes(old, new)
        if global_changed:
            await hold_changed(None)
        for tenant in sorted(tenants):
            await hold_changed(tenant)

    async def holds_refresh() -> None:
        # Other replicas' and operators' changes of the tenants' holds, as often.
        if parts.sender is not None:
            await parts.sender.holds.refresh()

    overrides = OverrideCache(
        client, keys, settings, auto=auto, refresh_seconds=refresh_seconds,
        on_change=overrides_changed, on_refresh=holds_refresh, on_error=metrics.task_failed,
    )  # fmt: skip
    await overrides.refresh()
    parts.overrides = overrides
    parts.reputation = await build_reputation(
        settings=settings, store=store, sqs=sqs, ses_client=ses_client, metrics=metrics,
        refresh_limits=overrides.refresh, lifted=hold_changed, mx_lookup=mx_lookup,
    )  # fmt: skip
    return overrides
