"""Redis memory per finished mail, measured: ``python -m bench.finished_memory``.

bench/budget.py's workload (:data:`bench.budget.MAILS` mails of 20 tenants,
through one replica, every part ``fairpost run`` builds) on a redis-server of
its own; ``INFO memory``'s ``used_memory`` read before the first enqueue and
after the last mail is finished, as bench/job_memory.py reads it for waiting
jobs. The difference, a mail, is what a sent mail leaves in Redis; what it
leaves is then summed, key by key (``MEMORY USAGE``), by kind and by how long
it stays (:func:`left_behind`): a key with a TTL of an hour or less is gone
soon after the mail (grants, claims, sending markers), one with a longer TTL or
none is kept for its retention. tests/ops/test_finished_memory.py holds the
kept part to a budget.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
from dataclasses import dataclass
from typing import Any

import boto3
import redis

from bench.budget import MAILS, budget_settings, drain, replica, use_services
from bench.cluster import services
from bench.load import Load
from fairpost.config import Settings
from fairpost.mailer.ops.queue_setup import init_events_queue
from fairpost.mailer.testing.ses_server import SesServer

SHORT_LIVED_SECONDS = 3600
"""A key whose TTL is at most this is gone soon after its mail: not history."""


@dataclass(frozen=True)
class Left:
    """What the keys of one kind hold after the workload: their count and bytes."""

    keys: int
    bytes: int


def kind_of(key: str) -> str:
    """A key's kind: its name's first part after its hash tag (``job``, ``ses``,
    ``outcomes``, ...), what tells keys of one kind apart."""
    return key.split("}", 1)[-1].lstrip(":").split(":", 1)[0] or key


def left_behind(client: redis.Redis) -> dict[str, dict[str, Left]]:
    """``MEMORY USAGE`` of every key (the server is the workload's alone), summed by kind, apart for those
    kept (``kept``: no TTL or one over :data:`SHORT_LIVED_SECONDS`) and the rest."""
    sums: dict[str, dict[str, list[int]]] = {"kept": {}, "short_lived": {}}
    for raw in client.scan_iter(count=1000):
        key = raw.decode()
        ttl = int(client.ttl(raw))
        group = "short_lived" if 0 <= ttl <= SHORT_LIVED_SECONDS else "kept"
        tally = sums[group].setdefault(kind_of(key), [0, 0])
        tally[0] += 1
        tally[1] += int(client.memory_usage(raw, samples=0) or 0)
    return {group: {k: Left(n, b) for k, (n, b) in kinds.items()} for group, kinds in sums.items()}


def with_events(redis_url: str) -> Settings:
    """The budget's settings with SES events on, as in production: a sent mail's SES
    message id is then kept too."""
    return budget_settings(redis_url).model_copy(update={"events_queue_name": "fairpost-events"})


async def workload(settings: Settings) -> None:
    init_events_queue(boto3.client("sqs"), settings)
    async with replica(settings) as parts, Load(settings) as load:
        await drain(parts, load)


async def run(redis_url: str, client: redis.Redis) -> dict[str, Any]:
    """The workload twice, each under a key prefix of its own: the first loads the
    scripts and grows Redis's tables, the second is measured (its mails alone)."""
    await workload(with_events(redis_url).model_copy(update={"key_prefix": "warmup"}))
    client.delete(*client.keys("{warmup}*"))
    settings = with_events(redis_url)
    before = int(client.info("memory")["used_memory"])
    await workload(settings)
    # Read once the replica's connections are closed: their buffers are no mail's.
    after = int(client.info("memory")["used_memory"])
    left = left_behind(client)
    kept = collections.Counter({k: v.bytes for k, v in left["kept"].items()})
    return {
        "mails": MAILS,
        "used_memory_per_mail": round((after - before) / MAILS),
        "kept_bytes_per_mail": round(sum(kept.values()) / MAILS, 1),
        "kept_by_kind": {k: round(b / MAILS, 1) for k, b in kept.most_common()},
        "short_lived_by_kind": {k: round(v.bytes / MAILS, 1) for k, v in left["short_lived"].items()},
        "redis_version": client.info("server")["redis_version"],
    }


def main() -> None:
    argparse.ArgumentParser(prog="python -m bench.finished_memory", description=__doc__.split("\n\n")[0])
    with services("fairpost-finished-memory-") as backend, SesServer() as ses:
        use_services(backend, ses)
        client = redis.Redis.from_url(backend.redis_url())
        try:
            print(json.dumps(asyncio.run(run(backend.redis_url(), client)), indent=1))
        finally:
            client.close()


if __name__ == "__main__":
    main()
