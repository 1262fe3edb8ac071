"""Run fairpost's dispatcher and sender in the test's event loop, against real services."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import boto3
import redis.asyncio

from fairpost.config import Settings, load_settings
from fairpost.dispatcher.connect import async_redis_client
from fairpost.dispatcher.runner import Dispatcher
from fairpost.dispatcher.store import JobStore
from fairpost.mailer.daemon.aws import SES_CONFIG, SQS_CONFIG, session
from fairpost.mailer.daemon.feedback import ReputationParts
from fairpost.mailer.daemon.metrics import Metrics
from fairpost.mailer.daemon.mx import Lookup
from fairpost.mailer.daemon.parts import build_parts
from fairpost.mailer.daemon.sender import Sender
from fairpost.mailer.daemon.tracing import Tracing
from fairpost.mailer.ops.queue_setup import init_queue
from fairpost.mailer.quota.engine import QuotaEngine
from fairpost.mailer.quota.overrides import LimitSource


@dataclass
class ReceiveLog:
    """What the sender's SQS receives returned, with when (monotonic)."""

    calls: list[float] = field(default_factory=list)
    bodies: list[tuple[float, str]] = field(default_factory=list)
    asked: list[int] = field(default_factory=list)
    """Each receive's MaxNumberOfMessages."""
    requests: dict[str, int] = field(default_factory=dict)
    """SQS requests the sender made, by operation."""


class RecordingSqs:
    """Passes every call to the real client; records receives (no behaviour changed)."""

    def __init__(self, real: Any, log: ReceiveLog, before_receive: Callable[[], Any] | None = None) -> None:
        self._real = real
        self._log = log
        self._before_receive = before_receive

    def __getattr__(self, name: str) -> Any:
        real = getattr(self._real, name)
        if not callable(real):
            return real

        async def counted(*args: Any, **kwargs: Any) -> Any:
            self._log.requests[name] = self._log.requests.get(name, 0) + 1
            return await real(*args, **kwargs)

        return counted

    async def receive_message(self, **kwargs: Any) -> Any:
        if self._before_receive is not None:
            await self._before_receive()
        self._log.calls.append(time.monotonic())
        self._log.asked.append(int(kwargs.get("MaxNumberOfMessages", 1)))
        self._log.requests["receive_message"] = self._log.requests.get("receive_message", 0) + 1
        response = await self._real.receive_message(**kwargs)
        now = time.monotonic()
        for message in response.get("Messages", []):
            self._log.bodies.append((now, message["Body"]))
        return response


@dataclass
class Running:
    settings: Settings
    store: JobStore
    quota: QuotaEngine
    sender: Sender
    dispatcher: Dispatcher
    receives: ReceiveLog
    queue_url: str
    reputation: ReputationParts | None = None
    metrics: Metrics | None = None


@asynccontextmanager
async def pipeline(
    settings: Settings,
    *,
    before_receive: Callable[[], Any] | None = None,
    reputation: bool = False,
    tracing: Tracing | None = None,
    mx_lookup: Lookup | None = None,
) -> AsyncIterator[Running]:
    """Dispatcher and sender running until the block ends; then a clean shutdown.

    Built by the daemon's own :func:`~fairpost.mailer.daemon.parts.build_parts`.
    ``reputation``: every part ``fairpost run`` has: live overrides (so pauses
    apply), suppression, SES's verdict on SES tenants, the SES event consumer
    (with ``events_queue_name``), the reconciler and the slot keeper; without it,
    the dispatcher and the sender alone. ``tracing``: the daemon's spans (tests/tracing).
    ``mx_lookup``: the recipients' MX look-ups (tests/deliverability's local fake)."""
    url, _ = init_queue(boto3.client("sqs"), settings)
    client = async_redis_client(settings)
    try:
        async with _pipeline(
            settings, client, url, before_receive, reputation, tracing, mx_lookup
        ) as running:
            yield running
    finally:
        await client.aclose()


@asynccontextmanager
async def _pipeline(
    settings: Settings,
    client: redis.asyncio.Redis,
    url: str,
    before_receive: Callable[[], Any] | None,
    reputation: bool,
    tracing: Tracing | None = None,
    mx_lookup: Lookup | None = None,
) -> AsyncIterator[Running]:
    log = ReceiveLog()
    aws = session()
    async with aws.client("sqs", config=SQS_CONFIG) as sqs, aws.client("sesv2", config=SES_CONFIG) as ses:
        parts = await build_parts(
            settings, client, sqs=sqs, ses_client=ses, queue_url=url, tracing=tracing, full=reputation,
            sender_sqs=RecordingSqs(sqs, log, before_receive), reap_interval=0.2, refresh_seconds=0.2,
            mx_lookup=mx_lookup,
        )  # fmt: skip
        assert parts.sender is not None and parts.dispatcher is not None
        sender, dispatcher = parts.sender, parts.dispatcher
        stop = asyncio.Event()
        tasks = list(parts.tasks(stop).values())
        try:
            store, quota, metrics = parts.store, parts.quota, parts.metrics
            yield Running(settings, store, quota, sender, dispatcher, log, url, parts.reputation, metrics)
        finally:
            # A task that died while the test ran fails it, after the same shutdown as
            # any other: no task is left running on the client once it is closed.
            died = [e for t in tasks if t.done() and not t.cancelled() and (e := t.exception()) is not None]
            stop.set()
            _, pending = await asyncio.wait(tasks, timeout=30)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            await dispatcher.drain(1)
            await sender.release_held()
            if died:
                raise died[0]


@asynccontextmanager
async def sender_only(
    settings: Settings, queue_url: str, *, limits: LimitSource | None = None
) -> AsyncIterator[Sender]:
    """A sender whose loop does not run: the test hands it received messages itself."""
    client = async_redis_client(settings)
    aws = session()
    try:
        async with aws.client("sqs", config=SQS_CONFIG) as sqs, aws.client("sesv2", config=SES_CONFIG) as ses:
            parts = await build_parts(
                settings, client, sqs=sqs, ses_client=ses, queue_url=queue_url, role="sender", full=False,
                limits=limits,
            )  # fmt: skip
            assert parts.sender is not None
            yield parts.sender
    finally:
        await client.aclose()


def quick_settings(redis_url: str, **overrides: Any) -> Settings:
    """Settings for pipeline tests: quotas that do not bind unless a test says so,
    short polls and backoffs, so that every outcome shows within seconds."""
    base: dict[str, Any] = {
        "redis_url": redis_url,
        "global_limits": "1000/second",
        "tenant_limits": "1000/second",
        "sender": {
            "wait_seconds": 1,
            "receivers": 1,
            "backoff_base_seconds": 1,
            "pause_seconds": 1,
            "max_jitter_seconds": 0.2,
        },
    }
    base.update(overrides)
    return load_settings(**base)
