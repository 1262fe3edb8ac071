"""A job's life beyond enqueue and claim: scheduled jobs coming due, cancel,
and the dead letters (replay, purge).

Each state change is one Lua script (``promote``, ``cancel``, ``replay``,
``purge``), so it is atomic against the claim and against other replicas:
a due job enters its queue once however many dispatchers promote at the
same moment, and a job is either cancelled or handed off, never both.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis
import redis.asyncio

from dispatcher.errors import NotReplayable, TooLateToCancel, UnknownJob
from dispatcher.keys import Keys
from dispatcher.scripts import lua_source
from dispatcher.store import ScriptCalls, StoreLimits

CANCELLED = "cancelled"
"""The dead reason of a cancelled job."""

PROMOTE_BATCH = 500
"""Most jobs one promote call moves; more due ones are moved by the next call at once."""


def _source(name: str) -> str:
    return lua_source("dispatcher", "ring") + "\n" + lua_source("dispatcher", name)


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class LifecycleCalls:
    """Builds the KEYS and ARGV of each script; shared by the sync and async sides."""

    def __init__(self, keys: Keys, limits: StoreLimits) -> None:
        self.keys = keys
        self._ring = ScriptCalls(keys, limits)

    def promote(self, max_jobs: int) -> tuple[list[str], list[str | int]]:
        keys = [*self._ring.ring_keys(), self.keys.scheduled()]
        return keys, [*self._ring.ring_args(), self.keys.job_prefix(), max_jobs]

    def cancel(self, job_id: str, keep_seconds: int) -> tuple[list[str], list[str | int]]:
        k = self.keys
        keys = [
            *self._ring.ring_keys(),
            k.job(job_id),
            k.scheduled(),
            k.leases(),
            k.dead(),
            k.content(job_id),
            k.sending(job_id),
        ]
        return keys, [*self._ring.ring_args(), job_id, keep_seconds, CANCELLED]

    def replay(self, job_id: str) -> tuple[list[str], list[str | int]]:
        k = self.keys
        keys = [*self._ring.ring_keys(), k.job(job_id), k.dead(), k.content(job_id)]
        return keys, [*self._ring.ring_args(), job_id]

    def purge(self, job_ids: Sequence[str], tenant: str | None) -> tuple[list[str], list[str | int]]:
        k = self.keys
        return [k.dead()], [k.job_prefix(), k.content_prefix(), tenant or "", *job_ids]


def promoted(result: Any) -> tuple[int, float | None]:
    """(jobs moved, seconds until the next scheduled job is due or None)."""
    moved, wait_ms = int(result[0]), int(result[1])
    return moved, (None if wait_ms < 0 else wait_ms / 1000)


def cancelled(job_id: str, result: Any) -> str:
    """The state the job had; raises if it was not cancelled now.

    Cancelling a job cancelled already is not an error: the call is idempotent.
    """
    code = int(result[0])
    if code == -1:
        raise UnknownJob(job_id)
    if code == 0:
        state, reason = _s(result[1]), _s(result[2])
        if state == "dead" and reason == CANCELLED:
            return state
        raise TooLateToCancel(job_id, state)
    return _s(result[1])


def replayed(job_id: str, result: Any) -> None:
    code = int(result[0])
    if code == -1:
        raise UnknownJob(job_id)
    if code == 0:
        raise NotReplayable(job_id, f"it is {_s(result[1])}, not a dead letter")
    if code == -2:
        raise NotReplayable(job_id, "it has no content to send (an unreadable SQS message, kept as raw_body)")


class Lifecycle:
    """The asyncio side: what the dispatcher loop and :class:`AsyncMailClient` use."""

    def __init__(self, client: redis.asyncio.Redis, keys: Keys, limits: StoreLimits) -> None:
        self.redis = client
        self.keys = keys
        self._calls = LifecycleCalls(keys, limits)
        self._promote = client.register_script(_source("promote"))
        self._cancel = client.register_script(_source("cancel"))

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
        self._calls = LifecycleCalls(keys, limits)
        self._promote = client.register_script(_source("promote"))
        self._cancel = client.register_script(_source("cancel"))
        self._replay = client.register_script(_source("replay"))
        self._purge = client.register_script(lua_source("dispatcher", "purge"))

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
        return [_s(job_id) for job_id in raw]

    def records(self, job_ids: Sequence[str]) -> list[tuple[str, dict[str, str], int | None]]:
        """(id, record, died ms) for each id whose record still exists, in order."""
        out: list[tuple[str, dict[str, str], int | None]] = []
        gone: list[str] = []
        for start in range(0, len(job_ids), 500):
            chunk = job_ids[start : start + 500]
            with self.redis.pipeline(transaction=False) as pipe:
                for job_id in chunk:
                    pipe.hgetall(self.keys.job(job_id))
                    pipe.zscore(self.keys.dead(), job_id)
                values = pipe.execute()
            for i, job_id in enumerate(chunk):
                raw, score = values[2 * i], values[2 * i + 1]
                if not raw:
                    gone.append(job_id)
                    continue
                record = {_s(k): _s(v) for k, v in raw.items()}
                out.append((job_id, record, None if score is None else int(score)))
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
        seconds, micros = self.redis.time()
        return int(seconds) * 1000 + int(micros) // 1000
