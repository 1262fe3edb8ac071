"""What the demo reads back: every job it enqueued, refreshed from the job records.

Each tenant's live numbers (backlog, in flight, quota use, how long until it
may send again) are not read here: the demo asks :func:`fairpost.mailer.ops.stats.collect_stats`,
as ``fairpost stats`` does, which asks the quota engine itself.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import redis.asyncio

from fairpost.dispatcher.replies import text
from fairpost.mailer.sdk.keys import MailKeys

__all__ = ["JobBook", "JobInfo"]

_FINAL = frozenset({"sent", "dead", "suppressed"})


@dataclass
class JobInfo:
    tenant: str
    recipients: int
    state: str = "queued"
    created_ms: int | None = None
    """When the SDK enqueued it (Redis server time)."""
    sent_ms: int | None = None
    """When SES accepted it (the sending replica's clock)."""


@dataclass
class JobBook:
    """Every job the demo enqueued, refreshed from the job records in Redis."""

    jobs: dict[str, JobInfo] = field(default_factory=dict)
    _open: set[str] = field(default_factory=set)

    def add(self, tenant: str, job_ids: Iterable[str], recipients: int) -> None:
        for job_id in job_ids:
            self.jobs[job_id] = JobInfo(tenant=tenant, recipients=recipients)
            self._open.add(job_id)

    async def refresh(self, client: redis.asyncio.Redis, keys: MailKeys, *, everything: bool = False) -> None:
        """Read the records of jobs not yet finished (``everything``: of all jobs)."""
        ids = list(self.jobs) if everything else list(self._open)
        for start in range(0, len(ids), 2000):
            chunk = ids[start : start + 2000]
            async with client.pipeline(transaction=False) as pipe:
                for job_id in chunk:
                    pipe.hmget(keys.job(job_id), ["state", "created_ms", "sent_ms"])
                rows = await pipe.execute()
            for job_id, (state, created, sent) in zip(chunk, rows, strict=True):
                info = self.jobs[job_id]
                info.state = text(state) if state else "missing"
                info.created_ms = _int(created)
                info.sent_ms = _int(sent)
                if info.state in _FINAL:
                    self._open.discard(job_id)

    def of(self, tenant: str) -> list[JobInfo]:
        return [info for info in self.jobs.values() if info.tenant == tenant]

    def sent(self, tenant: str | None = None) -> list[JobInfo]:
        return [
            info
            for info in self.jobs.values()
            if info.state == "sent" and info.sent_ms is not None and tenant in (None, info.tenant)
        ]

    def sent_ids(self, tenant: str) -> set[str]:
        return {
            job_id for job_id, info in self.jobs.items() if info.tenant == tenant and info.state == "sent"
        }

    @property
    def open_count(self) -> int:
        return len(self._open)


def _int(value: bytes | str | None) -> int | None:
    return int(text(value)) if value else None
