"""``fairpost run``: the dispatcher and the sender in one asyncio process.

Shutdown takes two phases (SIGTERM or SIGINT): stop receiving and claiming,
let in-flight sends finish within ``FAIRPOST_SHUTDOWN_GRACE``, then cancel
and hand back everything still held (received messages get visibility 0,
claims go back to their queues). Long polls in flight are never cut off
(SQS would hide what it hands them): they land within
``FAIRPOST_SENDER__WAIT_SECONDS`` of the signal, alongside the grace period,
and what they bring is handed back too. A second signal exits at once. If any
background task dies, the daemon says why and exits non-zero rather than
run half-alive.

The background tasks, each named and watched: ``dispatcher``, ``sender``,
``reconciler`` (dispatched jobs SQS lost, :mod:`fairpost.mailer.daemon.reconcile`),
``overrides`` (live quota overrides, :mod:`fairpost.mailer.quota.overrides`),
``ses-account`` (``FAIRPOST_GLOBAL_LIMITS=auto``, :mod:`fairpost.mailer.daemon.ses_account`),
``slots`` (in-flight slots kept while the sender's gate is closed, :mod:`fairpost.mailer.daemon.slots`),
``ses-tenants`` (SES's verdict on SES tenants, :mod:`fairpost.mailer.daemon.ses_tenant_status`),
``events`` (SES events, with ``FAIRPOST_EVENTS_QUEUE_NAME``, :mod:`fairpost.mailer.daemon.events`),
``webhook-fanout`` and ``webhooks`` (the outcome feed's signed webhooks, roles ``all`` and
``webhooks``, :mod:`fairpost.mailer.daemon.webhooks`),
``heartbeat`` (:mod:`fairpost.mailer.daemon.health`) and ``http`` (``/metrics``,
``/healthz``, ``/readyz`` on ``FAIRPOST_HTTP_PORT``, :mod:`fairpost.mailer.daemon.http`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from typing import Literal

import redis.asyncio

from fairpost.config import Settings
from fairpost.config.limits import Limits
from fairpost.dispatcher.connect import async_redis_client
from fairpost.dispatcher.durable import durability, replica_shortfall
from fairpost.dispatcher.keys import Keys
from fairpost.dispatcher.runner import Dispatcher
from fairpost.dispatcher.store import JobStore, store_limits
from fairpost.mailer.daemon.aws import SES_CONFIG, SQS_CONFIG, session
from fairpost.mailer.daemon.feedback import build as build_reputation
from fairpost.mailer.daemon.handoff import MailWorker
from fairpost.mailer.daemon.health import Heartbeat, Liveness, replica_name, sender_alive
from fairpost.mailer.daemon.http import Check, HttpServer
from fairpost.mailer.daemon.metrics import Metrics, TenantLabels
from fairpost.mailer.daemon.ready import readiness
from fairpost.mailer.daemon.reconcile import Reconciler
from fairpost.mailer.daemon.sender import Sender
from fairpost.mailer.daemon.ses_account import SesAccountLimits, limits_rose
from fairpost.mailer.daemon.slots import SlotKeeper
from fairpost.mailer.daemon.tracing import Tracing
from fairpost.mailer.daemon.tracing import from_env as tracing_from_env
from fairpost.mailer.daemon.webhooks.loop import WebhookDeliveries
from fairpost.mailer.ops.stats import collect_stats
from fairpost.mailer.quota.engine import QuotaEngine
from fairpost.mailer.quota.overrides import OverrideCache, Overrides, changed_scopes

log = logging.getLogger("fairpost.daemon")

Role = Literal["all", "dispatcher", "sender", "webhooks"]

HAND_BACK_SECONDS = 2.0
"""After the grace period, the most the hand-back (visibility 0, requeue) may take."""


async def run_daemon(settings: Settings, role: Role = "all") -> int:
    """Run until a signal; return the process exit code."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    signals = (signal.SIGTERM, signal.SIGINT)

    def on_signal() -> None:
        if stop.is_set():
            log.warning("second signal: exiting at once")
            os._exit(1)
        log.info("signal received: shutting down (again to exit at once)")
        stop.set()

    # Spans, when the OTEL_* variables ask for them (docs/operations.md, "Tracing").
    tracing = tracing_from_env(settings)
    for sig in signals:
        loop.add_signal_handler(sig, on_signal)
    client = async_redis_client(settings)
    try:
        return await _run(settings, role, client, stop, tracing)
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)
        await client.aclose()
        if tracing is not None:
            await asyncio.to_thread(tracing.close)


async def publish_tenant_settings(store: JobStore, settings: Settings) -> None:
    """Put the per-tenant weights and in-flight caps where the dispatcher's scripts read them."""
    await store.sync_tenant_settings(
        {t: o.weight for t, o in settings.tenants.items() if o.weight},
        {t: settings.inflight_cap_for(t) for t, o in settings.tenants.items() if o.inflight_cap or o.weight},
    )


async def _run(
    settings: Settings, role: Role, client: redis.asyncio.Redis, stop: asyncio.Event, tracing: Tracing | None
) -> int:
    keys = Keys(settings.key_prefix)
    store = JobStore(client, keys, store_limits(settings))
    await publish_tenant_settings(store, settings)
    shortfall = await replica_shortfall(client, settings.redis_min_replicas)
    if shortfall is not None:
        log.warning("%s", shortfall)
    quota = QuotaEngine(client, keys, durability=durability(settings))
    metrics = Metrics(TenantLabels(settings.tenants, settings.metrics_tenant_labels), process_metrics=True)
    liveness = Liveness()
    heartbeat = Heartbeat(
        client, keys, replica_name(settings), liveness, role=role,
        max_outage_seconds=settings.max_outage_seconds, on_error=metrics.task_failed,
    )  # fmt: skip
    aws = session()
    async with (
        aws.client("sqs", config=SQS_CONFIG) as sqs,
        aws.client("sesv2", config=SES_CONFIG) as ses_client,
    ):
        loop = asyncio.get_running_loop()
        queue_url: str = (await sqs.get_queue_url(QueueName=settings.queue_name))["QueueUrl"]
        dispatcher: Dispatcher | None = None
        sender: Sender | None = None
        tasks: dict[str, asyncio.Task[None]] = {}
        if role in ("all", "dispatcher"):
            worker = MailWorker(sqs, queue_url, metrics=metrics, tracing=tracing)
            dispatcher = Dispatcher(
                store,
                [worker],
                concurrency=settings.dispatcher.concurrency,
                batch_size=settings.dispatcher.batch_size,
                linger_seconds=settings.dispatcher.linger_seconds,
                finished_ttl_seconds=settings.job_ttl,
                max_outage_seconds=settings.max_outage_seconds,
                on_error=metrics.task_failed,
            )
            tasks["dispatcher"] = asyncio.create_task(dispatcher.run(stop), name="dispatcher")
            reconciler = Reconciler(
                store, worker, settings, metrics=metrics, may_act=lambda: sender_alive(client, keys)
            )
            tasks["reconciler"] = asyncio.create_task(reconciler.run(stop), name="reconciler")
        if role in ("all", "sender"):

            async def hold_changed(tenant: str | None = None) -> None:
                # The one event (fairpost.mailer.daemon.holds): a hold lifted, or limits
                # a park waited for changed (None: the global ones).
                if sender is not None:
                    await sender.holds.changed(tenant)

            auto = None
            if isinstance(settings.global_limits, str):

                async def auto_limits_changed(old: Limits | None, new: Limits) -> None:
                    # SES allows more (a raised quota, a day's mail aging out): a gate
                    # closed, or mail parked, under the old limits is looked at now.
                    if limits_rose(old, new):
                        await hold_changed(None)

                account = SesAccountLimits(
                    ses_client, settings, client=client, keys=keys, quota=quota,
                    on_change=auto_limits_changed, on_error=metrics.task_failed,
                )  # fmt: skip
                await account.start()
                auto = account.current
                tasks["ses-account"] = asyncio.create_task(account.run(stop), name="ses-account")

            async def overrides_changed(old: Overrides, new: Overrides) -> None:
                # Mail parked under the old limits (or a pause) is weighed again now.
                global_changed, tenants = changed_scopes(old, new)
                if global_changed:
                    await hold_changed(None)
                for tenant in sorted(tenants):
                    await hold_changed(tenant)

            async def holds_refresh() -> None:
                # Other replicas' and operators' changes of the tenants' holds, as often.
                if sender is not None:
                    await sender.holds.refresh()

            overrides = OverrideCache(
                client, keys, settings, auto=auto, on_change=overrides_changed, on_refresh=holds_refresh,
                on_error=metrics.task_failed,
            )  # fmt: skip
            await overrides.refresh()
            tasks["overrides"] = asyncio.create_task(overrides.run(stop), name="overrides")

            reputation = await build_reputation(
                settings=settings, store=store, sqs=sqs, ses_client=ses_client, metrics=metrics,
                refresh_limits=overrides.refresh, lifted=hold_changed,
            )  # fmt: skip
            tasks.update(reputation.tasks(stop))
            sender = Sender(
                sqs=sqs,
                ses_client=ses_client,
                queue_url=queue_url,
                store=store,
                quota=quota,
                settings=settings,
                limits=overrides,
                metrics=metrics,
                feedback=reputation.feedback,
                tracing=tracing,
            )
            tasks["sender"] = asyncio.create_task(sender.run(stop), name="sender")
            # While the sender's gate is closed, mail waiting in SQS keeps its slots.
            keeper = SlotKeeper(
                store, quota, overrides, ttl_ms=store.limits.inflight_ttl_ms, held=sender.gate.holding,
                max_outage_seconds=settings.max_outage_seconds, on_error=metrics.task_failed,
            )  # fmt: skip
            tasks["slots"] = asyncio.create_task(keeper.run(stop), name="slots")
        if settings.webhook.enabled and role in ("all", "webhooks"):
            webhooks = WebhookDeliveries(
                client, keys, settings, metrics.webhooks, on_error=metrics.task_failed
            )
            tasks.update(webhooks.tasks(stop))
        if settings.http_port is not None:

            def alive() -> Check:
                health = liveness.check()
                return Check(health.ok, health.detail)

            async def ready() -> Check:
                return await readiness(client, sqs, queue_url)

            async def refresh() -> None:
                # Bounded per scrape: the tenants with labels, and as many more of the
                # largest backlogs as there are labels left to give.
                labels = metrics.labels
                stats = await collect_stats(
                    client,
                    keys,
                    settings,
                    quota=quota,
                    detail=labels.labelled,
                    sample=max(1, labels.limit),
                    also=labels.known(),
                )
                metrics.update(stats)
                metrics.webhooks.update(stats.webhooks, stats.at_ms)

            http = HttpServer(metrics, port=settings.http_port, alive=alive, ready=ready, refresh=refresh)
            await http.start()
            tasks["http"] = asyncio.create_task(http.run(stop), name="http")
        tasks["heartbeat"] = asyncio.create_task(heartbeat.run(stop), name="heartbeat")
        liveness.watch(tasks)
        log.info("fairpost running (role %s, queue %s)", role, settings.queue_name)

        stopping = asyncio.create_task(stop.wait(), name="stop-signal")
        done, _ = await asyncio.wait({stopping, *tasks.values()}, return_when=asyncio.FIRST_COMPLETED)
        exit_code = 0
        for name, task in tasks.items():
            if task in done:
                exc = None if task.cancelled() else task.exception()
                if exc is None and not task.cancelled() and stop.is_set():
                    continue  # it saw the signal and returned in the same turn: a clean stop
                log.error("task %s stopped unexpectedly: %r", name, exc, exc_info=exc)
                exit_code = 1
        stop.set()
        stopped_at = loop.time()
        liveness.stopping = True
        stopping.cancel()

        # Phase two: in-flight work finishes within the grace period, then is cancelled.
        deadline = loop.time() + settings.shutdown_grace
        running = [t for t in tasks.values() if not t.done()]
        if running:
            finished, pending = await asyncio.wait(running, timeout=settings.shutdown_grace)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            for name, task in tasks.items():
                if task in finished and not task.cancelled() and task.exception() is not None:
                    log.error("task %s failed while stopping", name, exc_info=task.exception())
                    exit_code = 1
        if dispatcher is not None:
            try:
                await asyncio.wait_for(
                    dispatcher.drain(grace=max(0.0, deadline - loop.time())),
                    timeout=max(0.0, deadline - loop.time()) + HAND_BACK_SECONDS,
                )
            except Exception:
                log.exception("could not return claimed jobs; they return when their leases expire")
        if sender is not None:
            # The long polls in flight at the stop end within their wait, on SQS's side.
            polls_land = max(0.0, stopped_at + settings.sender.wait_seconds - loop.time())
            try:
                released = await asyncio.wait_for(
                    sender.release_held(), timeout=polls_land + HAND_BACK_SECONDS
                )
            except Exception:
                log.exception(
                    "could not hand received messages back; they return after their visibility timeout"
                )
            else:
                if released:
                    log.info("handed %d received messages back to SQS", released)
        try:
            await asyncio.wait_for(heartbeat.clear(), timeout=1.0)
        except Exception as exc:
            log.warning("heartbeat not cleared (it expires by itself): %s", exc)
        log.info("fairpost stopped (exit code %d)", exit_code)
        return exit_code
