"""``fairpost run``: the dispatcher and the sender in one asyncio process.

Shutdown takes two phases (SIGTERM or SIGINT): stop receiving and claiming,
let in-flight sends finish within ``FAIRPOST_SHUTDOWN_GRACE``, then cancel
and hand back everything still held (received messages get visibility 0,
claims go back to their queues). A second signal exits at once. If any
background task dies, the daemon says why and exits non-zero rather than
run half-alive.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from typing import Literal

import redis.asyncio

from config import Settings
from dispatcher.keys import Keys
from dispatcher.runner import Dispatcher
from dispatcher.store import JobStore
from mailer.aws import SES_CONFIG, SQS_CONFIG, session
from mailer.client import store_limits
from mailer.handoff import MailWorker
from mailer.quota import QuotaEngine
from mailer.sender import Sender

log = logging.getLogger("fairpost.daemon")

Role = Literal["all", "dispatcher", "sender"]


async def run_daemon(settings: Settings, role: Role = "all") -> int:
    """Run until a signal; return the process exit code."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    signals = (signal.SIGTERM, signal.SIGINT)

    def on_signal() -> None:
        if stop.is_set():
            log.warning("second signal: exiting at once")
            os._exit(1)
        log.info("signal received: shutting down")
        stop.set()

    for sig in signals:
        loop.add_signal_handler(sig, on_signal)
    client = redis.asyncio.Redis.from_url(settings.redis_url)
    try:
        return await _run(settings, role, client, stop)
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)
        await client.aclose()


async def _run(settings: Settings, role: Role, client: redis.asyncio.Redis, stop: asyncio.Event) -> int:
    keys = Keys(settings.key_prefix)
    store = JobStore(client, keys, store_limits(settings))
    await store.sync_tenant_settings(
        {t: o.weight for t, o in settings.tenants.items() if o.weight},
        {t: o.inflight_cap for t, o in settings.tenants.items() if o.inflight_cap},
    )
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
            dispatcher = Dispatcher(
                store,
                [MailWorker(sqs, queue_url)],
                concurrency=settings.dispatcher.concurrency,
                batch_size=settings.dispatcher.batch_size,
                finished_ttl_seconds=settings.job_ttl,
            )
            tasks["dispatcher"] = asyncio.create_task(dispatcher.run(stop), name="dispatcher")
        if role in ("all", "sender"):
            sender = Sender(
                sqs=sqs,
                ses_client=ses_client,
                queue_url=queue_url,
                store=store,
                quota=QuotaEngine(client, keys),
                settings=settings,
            )
            tasks["sender"] = asyncio.create_task(sender.run(stop), name="sender")
        log.info("fairpost running (role %s, queue %s)", role, settings.queue_name)

        stopping = asyncio.create_task(stop.wait(), name="stop-signal")
        done, _ = await asyncio.wait({stopping, *tasks.values()}, return_when=asyncio.FIRST_COMPLETED)
        exit_code = 0
        for name, task in tasks.items():
            if task in done:
                exc = None if task.cancelled() else task.exception()
                log.error("task %s stopped unexpectedly: %r", name, exc, exc_info=exc)
                exit_code = 1
        stop.set()
        stopping.cancel()

        # Phase two: in-flight work finishes within the grace period, then is cancelled.
        deadline = loop.time() + settings.shutdown_grace
        running = [t for t in tasks.values() if not t.done()]
        if running:
            _, pending = await asyncio.wait(running, timeout=settings.shutdown_grace)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        if dispatcher is not None:
            await dispatcher.drain(grace=max(0.0, deadline - loop.time()))
        if sender is not None:
            try:
                released = await sender.release_held()
            except Exception:
                log.exception(
                    "could not hand received messages back; they return after their visibility timeout"
                )
            else:
                if released:
                    log.info("handed %d received messages back to SQS", released)
        log.info("fairpost stopped")
        return exit_code
