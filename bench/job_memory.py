"""Redis memory per waiting job, measured: enqueue N jobs with the SDK and read
``INFO memory`` before and after (and ``MEMORY USAGE`` of one job's record, of
its payload key if it has one, and of its tenant's queue per job: a queued job's
payload rides in its queue entry, a scheduled one's has a key; dispatcher/record.py).

    python -m bench.job_memory --redis-url redis://127.0.0.1:6379/0 --jobs 10000

It writes under a key prefix of its own and deletes it afterwards; the
figures in docs/operations.md ("Redis memory per waiting job") come from this script.
"""

from __future__ import annotations

import argparse
import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import redis

from fairpost.config import load_settings
from fairpost.dispatcher.record import ENTRY_SEP
from fairpost.dispatcher.replies import text
from fairpost.mailer.sdk.client import MailClient
from fairpost.mailer.sdk.keys import MailKeys
from fairpost.mailer.sdk.mail import Mail

VARIANTS = ("plain", "idempotency_key", "scheduled")


def typical_mail(i: int, variant: str) -> Mail:
    """One recipient, a short subject and a 200-character text: a typical notification."""
    return Mail(
        sender="Acme <no-reply@acme.example>",
        to=[f"user{i}@example.org"],
        subject=f"Your order #{100000 + i} has shipped",
        text=("Hello, your order is on its way. " * 7)[:200],
        idempotency_key=f"order-{i}-shipped" if variant == "idempotency_key" else None,
        send_at=datetime.now(UTC) + timedelta(hours=1) if variant == "scheduled" else None,
    )


def _used(r: redis.Redis) -> int:
    info: dict[str, Any] = r.info("memory")
    return int(info["used_memory"])


def _delete_prefix(r: redis.Redis, keys: MailKeys) -> None:
    batch = []
    for key in r.scan_iter(match=keys.root + "*", count=1000):
        batch.append(key)
        if len(batch) >= 1000:
            r.delete(*batch)
            batch.clear()
    if batch:
        r.delete(*batch)


def measure(redis_url: str, jobs: int = 10_000, variant: str = "plain") -> dict[str, Any]:
    """Enqueue ``jobs`` waiting jobs of one tenant; the memory they take, per job."""
    keys = MailKeys(f"memtest-{uuid.uuid4().hex[:8]}")
    settings = load_settings(redis_url=redis_url, key_prefix=keys.prefix)
    r = redis.Redis.from_url(redis_url)
    try:
        before = _used(r)
        with MailClient(settings, redis_client=r) as client:
            ids: list[str] = []
            for start in range(0, jobs, 500):
                mails = [typical_mail(i, variant) for i in range(start, min(jobs, start + 500))]
                ids += client.send_many("acme", mails)
        after = _used(r)
        record = int(r.memory_usage(keys.job(ids[0]), samples=0) or 0)
        payload_key = int(r.memory_usage(keys.payload(ids[0]), samples=0) or 0)
        queue = int(r.memory_usage(keys.queue("acme", "normal"), samples=0) or 0)
        entry = text(r.lindex(keys.queue("acme", "normal"), 0) or b"")
        payload = len(r.get(keys.payload(ids[0])) or entry.partition(ENTRY_SEP)[2].encode())
        return {
            "variant": variant,
            "jobs": jobs,
            "bytes_per_job": round((after - before) / jobs),
            "record_bytes": record,
            "record_encoding": text(r.object("encoding", keys.job(ids[0]))),
            "payload_key_bytes": payload_key,
            "queue_bytes_per_job": round(queue / jobs),
            "payload_bytes": payload,
            "redis_version": r.info("server")["redis_version"],
        }
    finally:
        _delete_prefix(r, keys)
        r.close()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--jobs", type=int, default=10_000)
    args = parser.parse_args()
    for variant in VARIANTS:
        print(json.dumps(measure(args.redis_url, args.jobs, variant)))


if __name__ == "__main__":
    main()
