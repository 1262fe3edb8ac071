"""The demo's applications: each tenant enqueues its mail through the SDK, on schedule."""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import math
from dataclasses import dataclass

from fairpost.mailer.demo.monitor import JobBook
from fairpost.mailer.demo.scenario import Scenario
from fairpost.mailer.sdk.client import AsyncMailClient
from fairpost.mailer.sdk.mail import Mail

__all__ = ["SENDER_DOMAIN", "generate_load"]

SENDER_DOMAIN = "example.com"
"""The domain every demo mail comes from; the demo verifies it in SES first."""

_BURST_CHUNK = 50
"""A burst is enqueued in pipelined chunks, so the live view keeps moving, and so
the quiet tenants' mail, the SES emulator's thread and the burst take turns in
this process (250 a chunk: one quiet mail enqueued as the burst began waited
0.21 s, and the demo's own check failed, in one idle run of two)."""


@dataclass(order=True, frozen=True)
class _Due:
    at: float
    tenant: str
    count: int


def schedule(scenario: Scenario) -> list[_Due]:
    """Every enqueue of the load phase: bursts whole, trickles evenly spaced."""
    due: list[_Due] = []
    for index, (tenant, load) in enumerate(scenario.tenants.items()):
        if load.burst and load.burst_at <= scenario.duration:
            due.append(_Due(load.burst_at, tenant, load.burst))
        if load.rate > 0:
            # Tenants start out of step, so their mail does not arrive in lockstep.
            phase = (index * 0.37) % 1.0 / load.rate
            count = math.floor(load.rate * scenario.duration + 1e-9)
            due.extend(_Due(min(k / load.rate + phase, scenario.duration), tenant, 1) for k in range(count))
    heapq.heapify(due)
    return due


BOUNCE_DOMAIN = "simulator.amazonses.com"
"""SES's mailbox simulator: mail to ``bounce@`` (``+label`` allowed) bounces for good, to
``success@`` is delivered."""


def _address(tenant: str, n: int, r: int, bounce: float, delivered: bool = False) -> str:
    """Mail ``n``'s ``r``-th recipient; with ``bounce``, one mail in ``1/bounce`` goes to a
    bouncing address, each a different one (suppression cannot help); with ``delivered``,
    the others go to the simulator's ``success`` address, whose delivery SES reports."""
    step = max(1, round(1 / bounce)) if bounce > 0 else 0
    if step and n % step == step - 1:
        return f"bounce+{tenant}-{n}-{r}@{BOUNCE_DOMAIN}"
    if delivered:
        return f"success+{tenant}-{n}-{r}@{BOUNCE_DOMAIN}"
    return f"{tenant}-user{n}-{r}@{SENDER_DOMAIN}"


def _mails(
    tenant: str, start: int, count: int, recipients: int, bounce: float = 0.0, delivered: bool = False
) -> list[Mail]:
    return [
        Mail(
            sender=f"{tenant}@{SENDER_DOMAIN}",
            to=[_address(tenant, n, r, bounce, delivered) for r in range(recipients)],
            subject=f"{tenant} #{n}",
            text=f"Hello from {tenant}: mail number {n} of the fairpost demo.",
        )
        for n in range(start, start + count)
    ]


async def generate_load(
    client: AsyncMailClient, scenario: Scenario, book: JobBook, started: float, stop: asyncio.Event
) -> None:
    """Enqueue the scenario's mail; ``started`` is the loop time the load phase began."""
    loop = asyncio.get_running_loop()
    due = schedule(scenario)
    numbers = dict.fromkeys(scenario.tenants, 0)
    while due and not stop.is_set():
        wait = started + due[0].at - loop.time()
        if wait > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=wait)
            continue
        now = loop.time() - started
        batch: dict[str, int] = {}
        while due and due[0].at <= now:
            item = heapq.heappop(due)
            batch[item.tenant] = batch.get(item.tenant, 0) + item.count
        for tenant, count in batch.items():
            load = scenario.tenants[tenant]
            for offset in range(0, count, _BURST_CHUNK):
                size = min(_BURST_CHUNK, count - offset)
                mails = _mails(tenant, numbers[tenant], size, load.recipients, load.bounce, load.webhook)
                numbers[tenant] += size
                book.add(tenant, await client.send_many(tenant, mails), load.recipients)
                await asyncio.sleep(0)
