"""A job's life beyond enqueue and claim: scheduled jobs coming due, cancel,
and the dead letters (replay, purge).

Each state change is one Lua script (``promote``, ``cancel``, ``replay``,
``purge``), so it is atomic against the claim and against other replicas:
a due job enters its queue once however many dispatchers promote at the
same moment, and a job is either cancelled or handed off, never both.
"""

from __future__ import annotations

from collections.abc import Sequence

import redis
import redis.asyncio

from fairpost.dispatcher.calls import ScriptCalls, StoreLimits, cancelled, promoted, replayed, script
from fairpost.dispatcher.keys import Keys
from fairpost.dispatcher.record import job_record
from fairpost.dispatcher.replies import text, time_ms

__all__ = ["PROMOTE_BATCH", "Lifecycle", "SyncLifecycle"]

PROMOTE_BATCH = 500
"""Most jobs one promote call moves; more due ones are moved by the next call at once."""


class Lifecycle:
    """The asyncio side: what the dispatcher loop and :class:`AsyncMailClient` use."""

    def __init__(self, client: redis.asyncio.Redis, keys: Keys, limits: StoreLimits) -> None:
        self.redis = client
        self.keys = keys
        self._calls = ScriptCalls(keys, limits)
        self._promote = client.register_script(script("promote"))
        self._cancel = client.register_script(script("cancel"))

    async def promote_due(self, max_jobs: int = PROMOTE_BATCH) -> tuple[int, float | None]:
        """Move due scheduled jobs into their queues: (how many, seconds until the next is due)."""
        keys, args = self._calls.promote(max_jobs)
        return promoted(await self._promote(keys=keys, args=args))

    async def cancel(self, job_id: str, keep_seconds: int) -> str:
        """Cancel a job not yet handed off; returns the state it had. Raises
        :class:`TooLateToCancel` or :class:`UnknownJob`."""
        keys, args = self._calls.cancel(job_id, keep_seconds)
        return cancelled(job_id, await self._cancel(keys=keys, args=args))


class SyncLifecycle:
    """The blocking side, for :class:`MailClient` and the dead-letter admin."""

    def __init__(self, client: redis.Redis, keys: Keys, limits: StoreLimits) -> None:
        self.redis = client
        self.keys = keys
        self._calls = ScriptCalls(keys, limits)
        self._promote = client.register_script(script("promote"))
        self._cancel = client.register_script(script("cancel"))
        self._replay = client.register_script(script("replay"))
        self._purge = client.register_script(script("purge"))

    def promote_due(self, max_jobs: int = PROMOTE_BATCH) -> tuple[int, float | None]:
        keys, args = self._calls.promote(max_jobs)
        return promoted(self._promote(keys=keys, args=args))

    def cancel(self, job_id: str, keep_seconds: int) -> str:
        keys, args = self._calls.cancel(job_id, keep_seconds)
        return cancelled(job_id, self._cancel(keys=keys, args=args))

    def replay(self, job_id: str) -> None:
        """Put a dead letter back in its tenant's queue. Raises :class:`NotReplayable`
        or :class:`UnknownJob`."""
        keys, args = self._calls.replay(job_id)
        replayed(job_id, self._replay(keys=keys, args=args))

    def dead_ids(self, *, died_before_ms: int | None = None, newest_first: bool = True) -> list[str]:
        """Ids in the dead-letter set (records may have expired since)."""
        high: int | str = "+inf" if died_before_ms is None else f"({died_before_ms}"
        if newest_first:
            raw = self.redis.zrevrangebyscore(self.keys.dead(), high, "-inf")
        else:
            raw = self.redis.zrangebyscore(self.keys.dead(), "-inf", high)
        return [text(job_id) for job_id in raw]

    def records(self, job_ids: Sequence[str]) -> list[tuple[str, dict[str, str], int | None]]:
        """(id, record, died ms) for each id whose record still exists, in order."""
        out: list[tuple[str, dict[str, str], int | None]] = []
        gone: list[str] = []
        for start in range(0, len(job_ids), 500):
            chunk = job_ids[start : start + 500]
            with self.redis.pipeline(transaction=False) as pipe:
                for job_id in chunk:
                    pipe.hgetall(self.keys.job(job_id))
                    pipe.get(self.keys.payload(job_id))
                    pipe.zscore(self.keys.dead(), job_id)
                values = pipe.execute()
            for i, job_id in enumerate(chunk):
                raw, payload, score = values[3 * i : 3 * i + 3]
                if not raw:
                    gone.append(job_id)
                    continue
                out.append((job_id, job_record(raw, payload), None if score is None else int(score)))
        if gone:
            # Their records expired (FAIRPOST_JOB_TTL): only the ids were left.
            self.redis.zrem(self.keys.dead(), *gone)
        return out

    def purge(self, job_ids: Sequence[str], tenant: str | None = None) -> int:
        """Delete these dead letters (of ``tenant`` only, if given); returns how many."""
        count = 0
        for start in range(0, len(job_ids), 500):
            keys, args = self._calls.purge(job_ids[start : start + 500], tenant)
            count += int(self._purge(keys=keys, args=args))
        return count

    def server_ms(self) -> int:
        """Redis's clock: dead letters are stamped with it."""
        return time_ms(self.redis.time())
