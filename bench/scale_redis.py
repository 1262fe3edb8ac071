"""What the scale scenario reads from Redis, and the state it builds there.

Costs are read from the server itself: ``INFO commandstats`` (microseconds
spent in commands; a script's own commands are counted in the script's
time and again under their names, the same way in every world, so ratios
between worlds are fair) and ``INFO cpu`` (the server's whole CPU time,
network I/O included).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import redis.asyncio

from fairpost.config import Settings, load_settings
from fairpost.dispatcher.lifecycle import Lifecycle
from fairpost.dispatcher.store import JobStore, NewJob, StoreLimits
from fairpost.mailer.quota.engine import QuotaEngine
from fairpost.mailer.sdk.compose import mail_job
from fairpost.mailer.sdk.keys import MailKeys
from fairpost.mailer.sdk.mail import Mail

PAYLOAD = '{"from":"app@bench.example","to":["u@example.org"],"subject":"scale","text":"' + "x" * 120 + '"}'


async def command_usec(client: redis.asyncio.Redis) -> int:
    """Microseconds the server spent in commands so far (``INFO`` itself left out)."""
    stats: dict[str, Any] = await client.info("commandstats")
    return sum(int(v["usec"]) for name, v in stats.items() if not name.startswith("cmdstat_info"))


async def commands_run(client: redis.asyncio.Redis) -> int:
    """Commands the server ran so far, a script's own commands included (``INFO`` left out)."""
    stats: dict[str, Any] = await client.info("commandstats")
    return sum(int(v["calls"]) for name, v in stats.items() if not name.startswith("cmdstat_info"))


async def command_breakdown(client: redis.asyncio.Redis) -> dict[str, int]:
    stats: dict[str, Any] = await client.info("commandstats")
    return {name[8:]: int(v["usec"]) for name, v in stats.items() if not name.startswith("cmdstat_info")}


async def server_cpu(client: redis.asyncio.Redis) -> float:
    """The server's user + system CPU seconds so far (``INFO cpu``)."""
    info: dict[str, Any] = await client.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


async def used_memory(client: redis.asyncio.Redis) -> int:
    info: dict[str, Any] = await client.info("memory")
    return int(info["used_memory"])


def mail_payload(size: int) -> tuple[str, dict[str, str]]:
    """The job payload and record fields the SDK writes for a mail whose payload is ``size`` bytes."""
    settings = load_settings(redis_url="redis://127.0.0.1:1/0")
    base = Mail(
        sender="Acme <no-reply@acme.example>", to=["user@example.org"], subject="Your order", text="x"
    )
    frame = len(mail_job(settings, MailKeys(), "acme", base, priority="normal", kind="mail").payload) - 1
    text = "Your order is on its way. " * (size // 26 + 1)
    mail = Mail(sender=base.sender, to=base.to, subject=base.subject, text=text[: size - frame])
    job = mail_job(settings, MailKeys(), "acme", mail, priority="normal", kind="mail")
    return job.payload, dict(job.fields or {})


class Side:
    """One world of the comparison: a key prefix of its own and the stores on it."""

    def __init__(
        self,
        client: redis.asyncio.Redis,
        name: str,
        tenants: int,
        *,
        cap: int = 20,
        keys: MailKeys | None = None,
        limits: StoreLimits | None = None,
    ) -> None:
        self.client = client
        self.name = name
        self.keys = keys or MailKeys(f"scale-{name}-{uuid.uuid4().hex[:6]}")
        self.limits = limits or StoreLimits(default_weight=1, default_cap=cap, lease_ms=30_000)
        self.store = JobStore(client, self.keys, self.limits)
        self.lifecycle = Lifecycle(client, self.keys, self.limits)
        self.quota = QuotaEngine(client, self.keys)
        self.tenants = [f"t{i:06}" for i in range(tenants)]
        self.settings: Settings = load_settings(
            redis_url="redis://127.0.0.1:1/0", key_prefix=self.keys.prefix
        )

    async def fill(
        self,
        per_tenant: int,
        *,
        priority: str = "normal",
        payload: str = PAYLOAD,
        fields: dict[str, str] | None = None,
        chunk: int = 1000,
        tenants: Sequence[str] | None = None,
    ) -> None:
        """``per_tenant`` waiting jobs for every tenant (or only these), in pipelined chunks."""
        batch: list[NewJob] = []
        for _ in range(per_tenant):
            for tenant in self.tenants if tenants is None else tenants:
                batch.append(new_job(tenant, priority=priority, payload=payload, fields=fields))
                if len(batch) >= chunk:
                    await self.store.enqueue(batch)
                    batch = []
        if batch:
            await self.store.enqueue(batch)

    async def hold_every_slot(self) -> int:
        """Claim and hand off until no tenant has a free slot; returns the jobs handed off."""
        handed = 0
        while True:
            jobs = await self.store.claim(1000)
            if not jobs:
                return handed
            await self.store.handed_off([job.id for job in jobs])
            handed += len(jobs)


def new_job(
    tenant: str,
    *,
    priority: str = "normal",
    payload: str = PAYLOAD,
    fields: dict[str, str] | None = None,
    send_at_ms: int = 0,
) -> NewJob:
    return NewJob(
        id=uuid.uuid4().hex,
        tenant=tenant,
        kind="mail",
        payload=payload,
        priority=priority,
        fields=fields or {"recipients": "1"},
        send_at_ms=send_at_ms,
    )


def chunks(items: Sequence[str], size: int) -> list[Sequence[str]]:
    return [items[i : i + size] for i in range(0, len(items), size)]
