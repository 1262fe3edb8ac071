"""Redis memory per sent mail, kept for its retention: ``python -m bench.finished_memory``.

bench/budget.py's workload (:data:`bench.budget.MAILS` mails of 20 tenants,
through one replica, every part ``fairpost run`` builds, SES events on, every
retention its default) on a redis-server of its own, twice under two key
prefixes (the first loads the scripts and grows Redis's tables). Of the second:

- ``used_memory_per_mail_at_once``: ``INFO memory``'s ``used_memory`` before
  its first enqueue and after its last mail is finished, a mail, as
  bench/job_memory.py measures a waiting job: what a mail leaves at once;
- ``kept_for_retention_per_mail``: each key it left (``MEMORY USAGE``, and
  what Redis's tables keep for it beyond that: bench/key_tables.py) times how
  long it stays, over the retention (FAIRPOST_JOB_TTL), a mail
  (:func:`kept_for_retention`): what each mail sent adds to a steady load's
  Redis, in the memory model of docs/operations.md. Keys of an hour or less
  (grants, claims) count nothing.

tests/ops/test_finished_memory.py holds the second to a budget.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from dataclasses import dataclass
from typing import Any
from unittest import mock

import boto3
import redis

from bench import key_tables
from bench.budget import MAILS, budget_settings, drain, replica, use_services
from bench.cluster import Backend, services
from bench.figures import Figure
from bench.load import Load
from fairpost.config import Settings
from fairpost.mailer.ops.queue_setup import init_events_queue
from fairpost.mailer.testing.ses_server import SesServer

SHORT_LIVED_SECONDS = 3600
"""A key whose TTL is at most this is gone soon after its mail (grants, claims,
sending markers): the bytes it holds are no history."""


@dataclass
class Left:
    """What the keys of one kind hold after the workload: their count, their bytes
    (``MEMORY USAGE``), and their byte-seconds: bytes, with what Redis's tables keep
    for each key (bench/key_tables.py), times the seconds they stay."""

    keys: int = 0
    bytes: int = 0
    byte_seconds: float = 0.0


def kind_of(key: str) -> str:
    """A key's kind: its name's first part after its hash tag (``job``, ``hist``,
    ``outcomes``, ...), what tells keys of one kind apart."""
    return key.split("}", 1)[-1].lstrip(":").split(":", 1)[0] or key


def left_behind(client: redis.Redis, settings: Settings) -> dict[str, Left]:
    """``MEMORY USAGE`` of every key the workload left that stays longer than
    :data:`SHORT_LIVED_SECONDS` (the server is the workload's alone), by kind, with
    how long each stays: its TTL; the outcome feed (no TTL, trimmed by age) its
    FAIRPOST_OUTCOMES__MAX_AGE; a history bucket the retention and half a day; any
    other key without a TTL the retention."""
    kinds: dict[str, Left] = {}
    for raw in client.scan_iter(count=1000):
        ttl = int(client.ttl(raw))
        if 0 <= ttl <= SHORT_LIVED_SECONDS:
            continue
        kind = kind_of(raw.decode())
        stays = float(ttl) if ttl > 0 else settings.job_ttl
        if kind == "outcomes":
            stays = settings.outcomes.max_age
        elif kind == "hist":
            # A day's bucket lives the retention past the day's end: a line, sent at
            # any hour, half a day more on average (its TTL now is this hour's).
            stays = settings.job_ttl + 43_200
        size = int(client.memory_usage(raw, samples=0) or 0)
        left = kinds.setdefault(kind, Left())
        left.keys += 1
        left.bytes += size
        left.byte_seconds += (size + key_tables.per_key(with_ttl=ttl > 0)) * stays
    return kinds


def kept_for_retention(kinds: dict[str, Left], settings: Settings, mails: int) -> dict[str, float]:
    """Bytes a mail, by kind, as if each stayed the retention (FAIRPOST_JOB_TTL):
    a record kept a day of a week's retention counts a seventh; each key's bytes
    are its ``MEMORY USAGE`` and its share of Redis's tables. Their sum times
    the mails sent in a retention is what a steady load holds (docs/operations.md,
    "Redis memory per sent mail")."""
    per = {k: v.byte_seconds / settings.job_ttl / mails for k, v in kinds.items()}
    return {k: round(b, 1) for k, b in sorted(per.items(), key=lambda kv: -kv[1])}


def with_events(redis_url: str) -> Settings:
    """The budget's settings with SES events on, as in production: a sent mail's SES
    message id is then kept too. Every retention is its default."""
    return budget_settings(redis_url).model_copy(update={"events_queue_name": "fairpost-events"})


async def workload(settings: Settings) -> None:
    """bench/budget.py's workload on ``settings``."""
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
    kinds = left_behind(client, settings)
    kept = kept_for_retention(kinds, settings, MAILS)
    return {
        "mails": MAILS,
        "used_memory_per_mail_at_once": round((after - before) / MAILS),
        "memory_usage_per_mail_at_once": round(sum(v.bytes for v in kinds.values()) / MAILS, 1),
        "kept_for_retention_per_mail": round(sum(kept.values()), 1),
        "kept_for_retention_by_kind": kept,
        "retention_days": settings.job_ttl / 86400,
        "redis_version": client.info("server")["redis_version"],
    }


def measured() -> dict[str, Any]:
    """:func:`run` on services of its own (a redis-server, fairpost's SQS, the recording
    SES server); the AWS variables it sets are restored after."""
    with (
        services("fairpost-finished-memory-") as backend,
        SesServer() as ses,
        mock.patch.dict(os.environ),
    ):
        use_services(backend, ses)
        client = redis.Redis.from_url(backend.redis_url())
        try:
            return asyncio.run(run(backend.redis_url(), client))
        finally:
            client.close()


async def scenario(backend: Backend, quick: bool) -> list[Figure]:
    """``python -m bench``'s figure (on services of its own: it reads every key and
    ``used_memory`` of its server; the same workload, quick or not)."""
    result = await asyncio.to_thread(measured)
    kinds = ", ".join(f"{k} {b}" for k, b in result["kept_for_retention_by_kind"].items())
    return [
        Figure(
            "finished_mail_memory",
            "Redis memory a sent mail keeps for its retention (bytes, with its keys' tables, x time kept)",
            result["kept_for_retention_per_mail"],
            "B",
            "<=",
            250,
            detail=f"{kinds}; used_memory at once {result['used_memory_per_mail_at_once']} B a mail",
            data=result,
        )
    ]


def main() -> None:
    argparse.ArgumentParser(prog="python -m bench.finished_memory", description=__doc__.split("\n\n")[0])
    print(json.dumps(measured(), indent=1))


if __name__ == "__main__":
    main()
