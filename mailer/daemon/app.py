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
``redis-memory`` (Redis's memory and eviction policy, :mod:`fairpost.mailer.daemon.redis_watch`),
``heartbeat`` (:mod:`fairpost.mailer.daemon.health`) and ``http`` (``/metrics``,
``/healthz``, ``/readyz`` on ``FAIRPOST_HTTP_PORT``, :mod:`fairpost.mailer.daemon.http`).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
from dataclasses import replace

import redis.asyncio

from fairpost.config import Settings
from fairpost.config.pools import pool_key_prefix, pool_settings, served_pools
from fairpost.dispatcher.connect import async_redis_client
from fairpost.dispatcher.durable import replica_shortfall
from fairpost.dispatcher.layout import LAYOUT, MIGRATE_COMMAND, read_layout
from fairpost.mailer.daemon.failover import PoolHealth, WatchedSes
from fairpost.mailer.daemon.fallback_checks import FallbackChecks
from fairpost.mailer.daemon.health import Heartbeat, Liveness, replica_name
from fairpost.mailer.daemon.http import Check, HttpServer
from fairpost.mailer.daemon.metric_labels import TenantLabels
from fairpost.mailer.daemon.metrics import Metrics
from fairpost.mailer.daemon.parts import Parts, Role, build_parts
from fairpost.mailer.daemon.pool_counts import PoolCounts
from fairpost.mailer.daemon.pools import PoolClients, pool_clients, task_name
from fairpost.mailer.daemon.ready import readiness
from fairpost.mailer.daemon.redis_watch import RedisWatch
from fairpost.mailer.daemon.tracing import Tracing
from fairpost.mailer.daemon.tracing import from_env as tracing_from_env
from fairpost.mailer.daemon.webhooks.loop import WebhookDeliveries
from fairpost.mailer.ops.stats import Stats, collect_stats
from fairpost.mailer.sdk.directory import AsyncPoolDirectory
from fairpost.mailer.sdk.keys import MailKeys
from fairpost.mailer.sdk.pool_redis import AsyncPoolRedis

log = logging.getLogger("fairpost.daemon")

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


async def _run(
    settings: Settings, role: Role, client: redis.asyncio.Redis, stop: asyncio.Event, tracing: Tracing | None
) -> int:
    """The daemon's life in three phases: start, serve until a signal or the first
    failure, shut down."""
    metrics = await _preflight(settings, client)
    # An allkeys-* Redis would lose queued mail: refuse it before anything starts.
    memory = RedisWatch(client, settings, metrics.redis_memory, on_error=metrics.task_failed)
    await memory.start()
    liveness = Liveness()
    pools = served_pools(settings)
    # Each pool's keys through a client of their own slot on a Redis Cluster; else this one.
    pool_redis = AsyncPoolRedis(settings, client)
    # One heartbeat per pool served, in the pool's keys: a pool's reconciler acts only
    # while a sender of that pool lives (mailer/daemon/health.py, sender_alive).
    heartbeats = [
        Heartbeat(
            pool_redis(pool), MailKeys(pool_key_prefix(settings, pool)), replica_name(settings), liveness,
            role=role, max_outage_seconds=settings.max_outage_seconds, on_error=metrics.task_failed,
        )
        for pool in pools
    ]  # fmt: skip
    async with contextlib.AsyncExitStack() as aws:
        aws.push_async_callback(pool_redis.aclose)
        served, clients, tasks = await _start_pools(
            aws, settings, role, client, pool_redis, stop, metrics, tracing
        )
        if settings.http_port is not None:
            http = _http_server(settings, client, pool_redis, served, clients[0], metrics, liveness)
            await http.start()
            tasks["http"] = asyncio.create_task(http.run(stop), name="http")
        tasks["redis-memory"] = asyncio.create_task(memory.run(stop), name="redis-memory")
        for pool, heartbeat in zip(pools, heartbeats, strict=True):
            name = task_name(pool, "heartbeat")
            tasks[name] = asyncio.create_task(heartbeat.run(stop), name=name)
        liveness.watch(tasks)
        _freeze_start_up()
        log.info("fairpost running (role %s, pools %s)", role, ", ".join(pools))

        exit_code = await _until_stop_or_failure(tasks, stop)
        stopped_at = asyncio.get_running_loop().time()
        liveness.stopping = True
        exit_code = max(exit_code, await _shut_down(settings, tasks, served, heartbeats, stopped_at))
        log.info("fairpost stopped (exit code %d)", exit_code)
        return exit_code


async def _preflight(settings: Settings, client: redis.asyncio.Redis) -> Metrics:
    """What is checked before anything starts (replicas, the key layout); the metrics."""
    shortfall = await replica_shortfall(client, settings.redis_min_replicas)
    if shortfall is not None:
        log.warning("%s", shortfall)
    # Before anything reads or writes a key: a layout this release cannot read
    # stops the start, naming what fixes it (dispatcher/layout.py).
    layout = await read_layout(client, MailKeys(settings.key_prefix))
    if layout != LAYOUT:
        log.warning(
            "the Redis key layout is version %d (written before versions); this fairpost reads it, "
            "and `%s` stamps it %d (the next release may not read it)", layout, MIGRATE_COMMAND, LAYOUT,
        )  # fmt: skip
    return Metrics(
        TenantLabels(settings.tenants, settings.metrics_tenant_labels),
        process_metrics=True,
        high_water=settings.redis_high_water,
    )


async def _start_pools(
    aws: contextlib.AsyncExitStack,
    settings: Settings,
    role: Role,
    client: redis.asyncio.Redis,
    pool_redis: AsyncPoolRedis,
    stop: asyncio.Event,
    metrics: Metrics,
    tracing: Tracing | None,
) -> tuple[list[Parts], list[PoolClients], dict[str, asyncio.Task[None]]]:
    """Each served pool built as the single-pool fairpost (its own keys, queue, SES and
    quota) and its tasks started; then each pool's webhook deliveries."""
    served: list[Parts] = []
    tasks: dict[str, asyncio.Task[None]] = {}
    clients: list[PoolClients] = []
    pools = served_pools(settings)
    for pool in pools:
        own = await aws.enter_async_context(pool_clients(settings, pool))
        ses_client = own.ses
        if settings.pools:  # with a pool to fall back to: each pool's SES watched
            health = PoolHealth(settings, pool, client, own.ses, metrics)
            ses_client = WatchedSes(own.ses, health)
            name = task_name(pool, "failover")
            tasks[name] = asyncio.create_task(health.run(stop), name=name)
            checks = FallbackChecks(settings, pool, AsyncPoolDirectory(settings, client), own.ses, metrics)
            name = task_name(pool, "fallback-checks")
            tasks[name] = asyncio.create_task(checks.run(stop), name=name)
        parts = await build_parts(
            pool_settings(settings, pool), pool_redis(pool), sqs=own.sqs, ses_client=ses_client,
            queue_url=own.queue_url, role=role, tracing=tracing,
            metrics=PoolCounts(metrics, pool) if settings.pools else metrics,
        )  # fmt: skip
        clients.append(own)
        served.append(parts)
        tasks.update({task_name(pool, name): task for name, task in parts.tasks(stop).items()})
    for pool in pools if settings.webhook.enabled and role in ("all", "webhooks") else ():
        # Each pool's feed to the endpoints kept in its keys (mailer/sdk/outcomes/endpoints.py).
        webhooks = WebhookDeliveries(
            pool_redis(pool), MailKeys(pool_key_prefix(settings, pool)), pool_settings(settings, pool),
            metrics.webhooks, on_error=metrics.task_failed, on_newer=metrics.newer_format,
        )  # fmt: skip
        tasks.update({task_name(pool, name): task for name, task in webhooks.tasks(stop).items()})
    return served, clients, tasks


def _http_server(
    settings: Settings,
    client: redis.asyncio.Redis,
    pool_redis: AsyncPoolRedis,
    served: list[Parts],
    first: PoolClients,
    metrics: Metrics,
    liveness: Liveness,
) -> HttpServer:
    """``/metrics``, ``/healthz`` and ``/readyz``; the figures read at each scrape."""
    assert settings.http_port is not None
    pools = served_pools(settings)
    directory = AsyncPoolDirectory(settings, client)

    def alive() -> Check:
        health = liveness.check()
        return Check(health.ok, health.detail)

    async def ready() -> Check:
        return await readiness(client, first.sqs, first.queue_url)

    async def refresh() -> None:
        # Bounded per scrape and pool: the tenants with labels, and as many more of
        # the largest backlogs as there are labels left to give.
        labels = metrics.labels
        for index, (pool, parts) in enumerate(zip(pools, served, strict=True)):
            own = pool_settings(settings, pool)
            stats = await collect_stats(
                pool_redis(pool), MailKeys(own.key_prefix), own, quota=parts.quota,
                detail=labels.labelled, sample=max(1, labels.limit), also=labels.known(),
            )  # fmt: skip
            if settings.pools:
                stats = await _on_pool(stats, pool, directory)
                metrics.pools.update(pool, stats)
            metrics.update(stats, pool, global_=index == 0)
            if index == 0:
                metrics.webhooks.update(stats.webhooks, stats.at_ms)

    return HttpServer(metrics, port=settings.http_port, alive=alive, ready=ready, refresh=refresh)


async def _on_pool(stats: Stats, pool: str, directory: AsyncPoolDirectory) -> Stats:
    """The pool's stats of the tenants it holds: those the directory puts on it, and
    any whose mail still waits in it (moved away, draining); not every labelled tenant
    read as idle in every pool."""
    held = [t for t in stats.tenants if t.backlog or t.inflight or await directory.pool_of(t.scope) == pool]
    return replace(stats, tenants=held)


async def _until_stop_or_failure(tasks: dict[str, asyncio.Task[None]], stop: asyncio.Event) -> int:
    """Serve until the signal or the first task to end; sets ``stop``. The exit code so
    far: 1 if a task ended on its own (a task that saw the signal and returned in the
    same turn is a clean stop)."""
    stopping = asyncio.create_task(stop.wait(), name="stop-signal")
    done, _ = await asyncio.wait({stopping, *tasks.values()}, return_when=asyncio.FIRST_COMPLETED)
    exit_code = 0
    for name, task in tasks.items():
        if task in done:
            exc = None if task.cancelled() else task.exception()
            if exc is None and not task.cancelled() and stop.is_set():
                continue
            log.error("task %s stopped unexpectedly: %r", name, exc, exc_info=exc)
            exit_code = 1
    stop.set()
    stopping.cancel()
    return exit_code


async def _shut_down(
    settings: Settings,
    tasks: dict[str, asyncio.Task[None]],
    served: list[Parts],
    heartbeats: list[Heartbeat],
    stopped_at: float,
) -> int:
    """Phase two: in-flight work finishes within the grace period, then is cancelled;
    each pool hands back what it holds; the heartbeats go. 1 if a task failed meanwhile."""
    exit_code = 0
    loop = asyncio.get_running_loop()
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
    await asyncio.gather(*(_hand_back(parts, settings, deadline, stopped_at) for parts in served))
    for heartbeat in heartbeats:
        try:
            await asyncio.wait_for(heartbeat.clear(), timeout=1.0)
        except Exception as exc:
            log.warning("heartbeat not cleared (it expires by itself): %s", exc)
    return exit_code


async def _hand_back(parts: Parts, settings: Settings, deadline: float, stopped_at: float) -> None:
    """One pool's hand-back after the grace period: claims to their queues, received
    messages to SQS."""
    loop = asyncio.get_running_loop()
    if parts.dispatcher is not None:
        try:
            await asyncio.wait_for(
                parts.dispatcher.drain(grace=max(0.0, deadline - loop.time())),
                timeout=max(0.0, deadline - loop.time()) + HAND_BACK_SECONDS,
            )
        except Exception:
            log.exception("could not return claimed jobs; they return when their leases expire")
    if parts.sender is not None:
        # The long polls in flight at the stop end within their wait, on SQS's side.
        polls_land = max(0.0, stopped_at + settings.sender.wait_seconds - loop.time())
        try:
            released = await asyncio.wait_for(
                parts.sender.release_held(), timeout=polls_land + HAND_BACK_SECONDS
            )
        except Exception:
            log.exception("could not hand received messages back; they return after their visibility timeout")
        else:
            if released:
                log.info("handed %d received messages back to SQS", released)


YOUNG_COLLECTION_THRESHOLD = 7_000
"""Allocations (net of frees) between two collections of the youngest generation:
ten times Python's 700. A mail's objects (its envelope, its futures, its request)
live for milliseconds, across the collections that 700 brings every ten mails or
so, and each collection walks every young object still alive: 400 of them cost a
replica 17 µs a mail of a 4,000-mail drain, 5 of them at this threshold 2 µs (#41).
What waits longer for a collection is only garbage in reference cycles: a few
hundred kilobytes at most."""


def _freeze_start_up() -> None:
    """What start-up built (modules, clients, settings: most of the heap) lives as long
    as the process: out of the garbage collector's sight, a full collection does not
    walk it all again, which would cost the daemon CPU per mail (BENCHMARKS.md, "CPU
    per mail"). Start-up's own garbage goes first, so none is kept for good. From then
    on the young generation is collected less often (:data:`YOUNG_COLLECTION_THRESHOLD`)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_COLLECTION_THRESHOLD, *gc.get_threshold()[1:])
