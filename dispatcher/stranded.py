"""Dispatched jobs their downstream lost: the index the reconciler scans.

Every dispatched job sits in a sorted set scored by the moment it counts as
stranded unless it shows progress first (``handoff.lua`` puts it there,
``touch.lua`` moves it on while its tenant is parked, ``finish.lua`` takes it
out), beside an anchor that is no job (:data:`~fairpost.dispatcher.keys.ANCHOR`).
A scan reads only the jobs that are due, a bounded batch at a time, so it
costs the same however many jobs are waiting. The decision and the move of
the deadline are one script (``reconcile.lua``), so any number of replicas
may scan at once and each stranded job is picked once per round.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import redis.asyncio

from fairpost.dispatcher.jobs import Job
from fairpost.dispatcher.keys import ANCHOR, Keys
from fairpost.dispatcher.replies import record, text, time_ms
from fairpost.dispatcher.scripts import lua_source
from fairpost.dispatcher.store import StoreLimits

SCAN_BATCH = 200
"""Most stranded jobs one scan returns; more are picked by the next scan at once."""


@dataclass(frozen=True)
class Stranded:
    """A job that made no progress for longer than it legitimately can."""

    job: Job
    outcome: Literal["again", "dead"]
    """``again``: hand it to its downstream again; ``dead``: it was, often enough."""
    handoffs: int
    """Times it has been handed again by the reconciler, this one included."""


class StrandedJobs:
    def __init__(self, client: redis.asyncio.Redis, keys: Keys, limits: StoreLimits) -> None:
        self.redis = client
        self.keys = keys
        self.limits = limits
        self._scan = client.register_script(lua_source("fairpost.dispatcher", "reconcile"))

    async def scan(self, handoffs_allowed: int, batch: int = SCAN_BATCH) -> list[Stranded]:
        """Pick the stranded jobs that are due, at most ``batch``."""
        k = self.keys
        flat: list[Any] = await self._scan(
            keys=[k.dispatched(), k.reconciled()],
            args=[
                k.job_prefix(),
                k.inflight_prefix(),
                self.limits.stranded_after_ms,
                self.limits.inflight_ttl_ms,
                handoffs_allowed,
                batch,
                k.payload_prefix(),
                ANCHOR,
                *(marker.prefix for marker in k.busy_markers()),
            ],
        )
        out = []
        for i in range(0, len(flat), 8):
            outcome: Literal["again", "dead"] = "again" if text(flat[i]) == "again" else "dead"
            job = Job(
                id=text(flat[i + 1]),
                tenant=text(flat[i + 2]),
                kind=text(flat[i + 3]),
                payload=text(flat[i + 4]),
                attempts=0,
                created_ms=int(flat[i + 5]),
                replays=int(flat[i + 6]),
            )
            out.append(Stranded(job=job, outcome=outcome, handoffs=int(flat[i + 7])))
        return out

    async def handoff_failed(self, job_ids: list[str], retry_in_ms: int) -> None:
        """A hand-off again did not reach SQS: it does not count, and is tried again soon."""
        if not job_ids:
            return
        at = time_ms(await self.redis.time()) + retry_in_ms
        async with self.redis.pipeline(transaction=True) as pipe:
            for job_id in job_ids:
                pipe.hincrby(self.keys.job(job_id), "reconciled", -1)
                pipe.zadd(self.keys.dispatched(), {job_id: at}, xx=True)
            pipe.hincrby(self.keys.reconciled(), "handed_again", -len(job_ids))
            await pipe.execute()

    async def counts(self) -> dict[str, int]:
        """What the reconcilers did, all replicas together: outcome → jobs."""
        raw: dict[Any, Any] = await self.redis.hgetall(self.keys.reconciled())
        return {k: int(v) for k, v in record(raw).items()}
