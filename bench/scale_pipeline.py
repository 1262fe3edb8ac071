"""What one Redis shard carries, and what throttled tenants hold in SQS, with
real daemon replicas (LocalStack's SQS, the recording SES server).

- Redis CPU per delivered mail: ``INFO cpu`` of the bench's redis-server
  around a one-replica drain of mails enqueued by 20 tenants through the
  SDK (enqueue, claim, hand-off, quota, send claim, finish: all of a mail's
  life), end to end on a quiet shard that shares the machine with the
  daemon and the emulators. ``INFO commandstats`` shows where it goes (a
  script's commands are counted in the script and again under their own
  names). What a busy shard carries is :mod:`bench.shard_replay`'s.
- SQS messages in flight per throttled tenant: tenants whose quota allows
  one mail a minute, each with a backlog over its in-flight cap; SQS's
  ``ApproximateNumberOfMessagesNotVisible`` over the tenants, the largest of
  a few samples once they are parked. On moto's SQS, with one receive loop:
  LocalStack re-opens a FIFO group when part of it is handed back, which SQS
  does not (:func:`inflight_per_throttled_tenant`); its count is reported
  beside.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import sys
import time
from typing import Any

import redis

from bench.cluster import Backend, services, world
from bench.figures import Figure
from bench.load import Load, wait_sent
from fairpost.mailer.testing.services import moto_server

UNBOUND = {"global_limits": "100000/second", "tenant_limits": "100000/second"}


def _cpu(client: redis.Redis) -> float:
    info: dict[str, Any] = client.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def _usec(client: redis.Redis) -> dict[str, int]:
    stats: dict[str, Any] = client.info("commandstats")
    return {name[8:]: int(v["usec"]) for name, v in stats.items()}


async def redis_cpu_per_mail(backend: Backend, mails: int) -> list[Figure]:
    tenants = 20
    with world(backend, "scale-cpu", UNBOUND) as w:
        w.start_replicas(1)
        client = redis.Redis.from_url(w.config["redis_url"])
        try:
            async with Load(w.settings) as load:
                for n in range(tenants):
                    await load.burst(f"warm{n}", 5)
                if not await wait_sent(w.ses, 5 * tenants, within=60):
                    raise RuntimeError("the warm-up mails were not sent")
                cpu0, usec0, t0 = _cpu(client), _usec(client), time.monotonic()
                for n in range(tenants):
                    await load.burst(f"d{n}", mails // tenants)
                if not await wait_sent(w.ses, 5 * tenants + mails, within=300):
                    raise RuntimeError(f"{w.ses.sent_count - 5 * tenants} of {mails} mails sent")
                seconds = time.monotonic() - t0
                cpu1, usec1 = _cpu(client), _usec(client)
        finally:
            client.close()
    per_mail = (cpu1 - cpu0) / mails
    spent = {k: v - usec0.get(k, 0) for k, v in usec1.items() if not k.startswith("info")}
    top = sorted(spent.items(), key=lambda kv: -kv[1])[:6]
    breakdown = ", ".join(f"{k} {v / mails:.0f}" for k, v in top)
    return [
        Figure(
            key="scale_redis_cpu_per_mail",
            title="Scale: Redis server CPU per delivered mail",
            value=per_mail * 1e6,
            unit=" µs",
            detail=(
                f"{(cpu1 - cpu0) * 1000:.0f} ms of Redis CPU (INFO cpu) for {mails} mails of {tenants} "
                f"tenants in {seconds:.1f} s, 1 replica, enqueue included; command µs per mail "
                f"(commandstats, script commands counted twice): {breakdown}"
            ),
            data={"cpu_seconds": cpu1 - cpu0, "mails": mails, "commandstats_usec": spent},
        ),
    ]


_PARKED = (4, 40, 20)
"""Throttled tenants, mails each, in-flight cap."""


async def _parked_samples(backend: Backend, quick: bool, **config: Any) -> list[tuple[int, int]]:
    """(in flight, visible) over the whole queue, a few samples once the throttled tenants are parked."""
    tenants, per_tenant, cap = _PARKED
    config.update(global_limits="100000/second", tenant_limits="1/minute", inflight_cap=cap)
    with world(backend, "scale-parked", config) as w:
        w.start_replicas(1)
        sqs = backend.sqs()
        async with Load(w.settings) as load:
            for n in range(tenants):
                await load.burst(f"p{n}", per_tenant)
            if not await wait_sent(w.ses, tenants, within=60):
                raise RuntimeError("the throttled tenants' first mails were not sent")
            await asyncio.sleep(3.0 if quick else 8.0)
            samples: list[tuple[int, int]] = []
            for _ in range(4 if quick else 10):
                attrs = sqs.get_queue_attributes(
                    QueueUrl=w.queue_url,
                    AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
                )["Attributes"]
                samples.append(
                    (
                        int(attrs["ApproximateNumberOfMessagesNotVisible"]),
                        int(attrs["ApproximateNumberOfMessages"]),
                    )
                )
                await asyncio.sleep(0.5)
        sqs.close()
    return samples


async def inflight_per_throttled_tenant(backend: Backend, quick: bool) -> Figure:
    """Taken on moto's SQS with one receive loop, and reported on LocalStack's beside it.

    SQS keeps a group held while a message of it is in flight, so once the sender
    parks a throttled tenant's head and hands the rest back, the rest waits behind
    it. LocalStack 4.12 re-opens the group on the hand-back (tests/contract/
    test_sqs_fifo.py), so the sender receives the tenant's next messages at once
    and parks a new head each time: its count is real, but of an emulator's flaw.
    moto keeps that rule, but its concurrent receives can share a group, hence
    one receive loop there.
    """
    tenants, per_tenant, cap = _PARKED
    werkzeug = logging.getLogger("werkzeug")
    level = werkzeug.level
    werkzeug.setLevel(logging.WARNING)  # moto's server would log every request
    try:
        with moto_server() as moto:
            on_moto = dataclasses.replace(backend, sqs_url=moto.url)
            faithful = await _parked_samples(on_moto, quick, sender={"receivers": 1})
    finally:
        werkzeug.setLevel(level)
    # The comparison is left out of --quick, which has a time budget (tests/ops/test_bench.py).
    localstack = [] if quick else await _parked_samples(backend, quick)
    inflight = max(s[0] for s in faithful) / tenants
    depth = max(s[0] + s[1] for s in faithful) / tenants
    beside = "LocalStack not run (--quick)"
    if localstack:
        beside = (
            "LocalStack, which re-opens a group when the rest is handed back: "
            f"{max(s[0] for s in localstack) / tenants:.1f} in flight, "
            f"{max(s[0] + s[1] for s in localstack) / tenants:.1f} in all"
        )
    return Figure(
        key="scale_sqs_inflight_per_throttled_tenant",
        title="Scale: SQS messages in flight per throttled tenant",
        value=inflight,
        op="<=",
        target=1,
        detail=(
            f"largest of {len(faithful)} samples on moto (one receive loop): {inflight:.1f} messages in "
            f"flight (not visible) and {depth:.1f} in SQS in all per tenant (in-flight cap {cap}); "
            f"{beside}; {tenants} tenants of {per_tenant} mails each, quota 1/minute, 1 replica"
        ),
        data={"samples": faithful, "localstack_samples": localstack, "tenants": tenants},
    )


def _main() -> None:
    """``python -m bench.scale_pipeline [--quick]``: the in-flight figure alone (the
    whole scenario, 100,000 tenants, is ``python -m bench --only scale``)."""
    with services("fairpost-bench-") as backend:
        figure = asyncio.run(inflight_per_throttled_tenant(backend, "--quick" in sys.argv))
    print(f"{figure.title}: {figure.value_text()} ({figure.verdict}) {figure.detail}")


if __name__ == "__main__":
    _main()
