"""Fixtures of the outcome tests: a verifying webhook receiver, and the daemon's
webhook tasks running in the test's event loop."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from fairpost.config import Settings, load_settings
from fairpost.dispatcher.connect import async_redis_client
from fairpost.mailer.daemon.webhooks.loop import WebhookDeliveries
from fairpost.mailer.daemon.webhooks.metrics import WebhookMetrics
from fairpost.mailer.sdk.keys import MailKeys
from tests.outcomes.receiver import Receiver


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with Receiver().running() as running:
        yield running


def hook_settings(redis_url: str, **webhook: Any) -> Settings:
    """Deliveries to the local receiver (plain http on 127.0.0.1), retried within moments."""
    options: dict[str, Any] = {"allow_private": True, "retry_schedule": "50ms,100ms", "timeout_seconds": 3}
    options.update(webhook)
    return load_settings(redis_url=redis_url, webhook=options)


@asynccontextmanager
async def delivering(settings: Settings, replicas: int = 1) -> AsyncIterator[list[WebhookDeliveries]]:
    """The daemon's webhook tasks, ``replicas`` times over (each its own Redis client),
    until the block ends; a task that died fails the test."""
    clients = [async_redis_client(settings) for _ in range(replicas)]
    stop = asyncio.Event()
    parts = [
        WebhookDeliveries(c, MailKeys(settings.key_prefix), settings, WebhookMetrics(CollectorRegistry()))
        for c in clients
    ]
    tasks = [t for p in parts for t in p.tasks(stop).values()]
    try:
        yield parts
    finally:
        died = [t.exception() for t in tasks if t.done() and not t.cancelled() and t.exception() is not None]
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), timeout=30)
        for client in clients:
            await client.aclose()
        if died:
            raise died[0]  # type: ignore[misc]
