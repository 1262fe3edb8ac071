"""A dispatcher process whose worker never returns: the test SIGKILLs it mid-claim.

Usage: python -m tests.support.hanging_dispatcher REDIS_URL PREFIX LEASE_MS
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence

import redis.asyncio

from fairpost.dispatcher.jobs import Job
from fairpost.dispatcher.runner import Dispatcher
from fairpost.dispatcher.store import JobStore, StoreLimits
from fairpost.dispatcher.worker import Outcome
from fairpost.mailer.sdk.keys import MailKeys


class HangingWorker:
    kind = "test"
    max_batch = 5

    async def handle(self, jobs: Sequence[Job]) -> Sequence[Outcome]:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


async def main(url: str, prefix: str, lease_ms: int) -> None:
    client = redis.asyncio.Redis.from_url(url)
    store = JobStore(client, MailKeys(prefix), StoreLimits(default_cap=1000, lease_ms=lease_ms))
    await Dispatcher(store, [HangingWorker()], concurrency=20).run(asyncio.Event())


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
