"""The daemon's eye on Redis's memory: the eviction policy judged at start and again
while it runs, the gauges kept fresh, and every eviction said aloud.

At start, :meth:`RedisWatch.start` refuses an ``allkeys-*`` Redis: ``fairpost run``
exits non-zero, naming the setting and the fix (:class:`EvictingRedis`). The task
``redis-memory`` then reads ``INFO`` every ``FAIRPOST_REDIS_MEMORY_CHECK_SECONDS``:
a policy changed to ``allkeys-*`` under a running daemon ends the task, and so the
daemon, loudly; keys evicted since the last reading are logged as an error (the
alert FairpostRedisEvicting fires on the gauge). The decision itself is
:func:`fairpost.dispatcher.redis_memory.judge_policy`'s.
"""

from __future__ import annotations

import asyncio
import logging

import redis.asyncio

from fairpost.config import Settings
from fairpost.dispatcher.backoff import OutageBackoff
from fairpost.dispatcher.errors import EvictingRedis
from fairpost.dispatcher.loop import OnError, forever
from fairpost.dispatcher.redis_memory import PolicyVerdict, RedisMemory, aread_memory, judge_policy
from fairpost.mailer.daemon.redis_metrics import RedisMemoryMetrics

__all__ = ["RedisWatch"]

log = logging.getLogger("fairpost.redis_memory")


class RedisWatch:
    def __init__(
        self,
        client: redis.asyncio.Redis,
        settings: Settings,
        gauges: RedisMemoryMetrics,
        *,
        on_error: OnError | None = None,
    ) -> None:
        self._redis = client
        self._high_water = settings.redis_high_water
        self._interval = settings.redis_memory_check_seconds
        self._max_outage = settings.max_outage_seconds
        self._gauges = gauges
        self._on_error = on_error
        self._seen: RedisMemory | None = None
        self.refusal: EvictingRedis | None = None

    async def start(self) -> PolicyVerdict:
        """The first reading; raises :class:`EvictingRedis` under an ``allkeys-*`` policy."""
        verdict = await self.check()
        if self.refusal is not None:
            raise self.refusal
        if verdict.level == "guarded":
            log.warning("%s", verdict.reason)
        return verdict

    async def check(self) -> PolicyVerdict:
        """Read Redis's memory once: the gauges, evictions, the policy's verdict."""
        memory = await aread_memory(self._redis)
        self._gauges.update(memory)
        seen, self._seen = self._seen, memory
        if seen is not None and memory.evicted_keys > seen.evicted_keys:
            log.error(
                "Redis evicted %d keys since the last reading (policy %s): %s",
                memory.evicted_keys - seen.evicted_keys, memory.policy, memory.describe(),
            )  # fmt: skip
        if seen is not None and seen.policy != memory.policy:
            log.warning("Redis's maxmemory-policy changed from %s to %s", seen.policy, memory.policy)
        verdict = judge_policy(memory, self._high_water)
        if verdict.refused:
            self.refusal = EvictingRedis(memory.policy, verdict.reason, verdict.fix)
            log.critical("%s", self.refusal)
        return verdict

    async def run(self, stop: asyncio.Event) -> None:
        """Check every interval until ``stop``; raise :class:`EvictingRedis` (the daemon
        stops, non-zero) once the policy turns to one that evicts any key."""
        halt = asyncio.Event()

        async def step() -> float | None:
            if stop.is_set() or (await self.check()).refused:
                halt.set()
                return None
            return self._interval

        backoff = OutageBackoff(self._max_outage, most=min(10.0, self._interval))
        await forever("redis-memory", step, halt, backoff=backoff, on_error=self._on_error, wake=(stop,))
        if self.refusal is not None:
            raise self.refusal
