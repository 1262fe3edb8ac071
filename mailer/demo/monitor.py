"""What the demo reads back: every job it enqueued, and each tenant's live numbers from Redis.

The live numbers come from the keys the daemon itself uses
(:class:`dispatcher.keys.Keys`): the tenant's queues (backlog), its in-flight
set, and its quota windows. The quota count and the moment a full window
frees are read from the window's bucket hash with the bucket arithmetic of
``mailer/quota/quota.lua``; they are for display only, nothing is decided on them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import redis.asyncio

from config import Window
from dispatcher.keys import PRIORITIES, Keys
from mailer.quota.engine import BUCKETS_PER_WINDOW

__all__ = ["JobBook", "JobInfo", "Snapshot", "TenantSnapshot", "snapshot"]

QUOTA_BUCKETS = BUCKETS_PER_WINDOW
"""Buckets per quota window: the daemon's :class:`mailer.quota.QuotaEngine` default."""

_FINAL = frozenset({"sent", "dead"})


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

    async def refresh(self, client: redis.asyncio.Redis, keys: Keys, *, everything: bool = False) -> None:
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
                info.state = _text(state) or "missing"
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

    @property
    def open_count(self) -> int:
        return len(self._open)


@dataclass(frozen=True)
class TenantSnapshot:
    tenant: str
    backlog: int
    """Jobs waiting in the tenant's Redis queues."""
    inflight: int
    """Jobs claimed or handed to SQS and not yet finished."""
    usage: tuple[tuple[Window, int], ...]
    """Recipients counted now in each quota window."""
    paused_for: float
    """Seconds until one more recipient fits in the windows; 0 if it fits now."""


@dataclass(frozen=True)
class Snapshot:
    now_ms: int
    tenants: dict[str, TenantSnapshot]
    global_usage: tuple[tuple[Window, int], ...]
    global_paused_for: float


async def snapshot(
    client: redis.asyncio.Redis,
    keys: Keys,
    tenants: Sequence[str],
    tenant_windows: dict[str, tuple[Window, ...]],
    global_windows: tuple[Window, ...],
) -> Snapshot:
    async with client.pipeline(transaction=False) as pipe:
        pipe.time()
        for tenant in tenants:
            for priority in PRIORITIES:
                pipe.llen(keys.queue(tenant, priority))
            pipe.zrange(keys.inflight(tenant), 0, -1, withscores=True)
            for window in tenant_windows[tenant]:
                pipe.hgetall(keys.quota(f"t:{tenant}", window.seconds))
        for window in global_windows:
            pipe.hgetall(keys.quota("global", window.seconds))
        replies = list(await pipe.execute())
    seconds, micros = replies.pop(0)
    now_ms = int(seconds) * 1000 + int(micros) // 1000
    result: dict[str, TenantSnapshot] = {}
    for tenant in tenants:
        backlog = sum(int(replies.pop(0)) for _ in PRIORITIES)
        inflight = sum(1 for _, expiry in replies.pop(0) if expiry > now_ms)
        windows = tenant_windows[tenant]
        buckets = [_buckets(replies.pop(0)) for _ in windows]
        usage, paused = _quota_state(windows, buckets, now_ms)
        result[tenant] = TenantSnapshot(tenant, backlog, inflight, usage, paused)
    global_buckets = [_buckets(replies.pop(0)) for _ in global_windows]
    global_usage, global_paused = _quota_state(global_windows, global_buckets, now_ms)
    return Snapshot(now_ms, result, global_usage, global_paused)


def _quota_state(
    windows: Sequence[Window], buckets: Sequence[dict[int, int]], now_ms: int
) -> tuple[tuple[tuple[Window, int], ...], float]:
    usage = []
    free_at = now_ms
    for window, held in zip(windows, buckets, strict=True):
        count, at = window_state(window, held, now_ms)
        usage.append((window, count))
        free_at = max(free_at, at)
    return tuple(usage), (free_at - now_ms) / 1000


def window_state(window: Window, buckets: dict[int, int], now_ms: int, cost: int = 1) -> tuple[int, int]:
    """(units counted at ``now_ms``, the ms at which ``cost`` more fit), as quota.lua counts."""
    window_ms = window.seconds * 1000
    width = max(1, window_ms // QUOTA_BUCKETS)
    lo = math.floor((now_ms - window_ms + 1) / width)
    live = sorted((index, units) for index, units in buckets.items() if index >= lo)
    total = sum(units for _, units in live)
    if total + cost <= window.limit:
        return total, now_ms
    remaining = total
    for index, units in live:
        remaining -= units
        if remaining + cost <= window.limit:
            return total, (index + 1) * width + window_ms - 1
    return total, now_ms


def _buckets(raw: dict[bytes, bytes]) -> dict[int, int]:
    return {int(k): int(v) for k, v in raw.items()}


def _text(value: bytes | str | None) -> str | None:
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else value


def _int(value: bytes | str | None) -> int | None:
    text = _text(value)
    return int(text) if text else None
