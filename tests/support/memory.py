"""redis-servers started with ``--maxmemory`` and each ``--maxmemory-policy``, as
managed services run them (ElastiCache and Memorystore: ``volatile-lru``; a shared
cache: ``allkeys-lru``; a Redis of fairpost's own: ``noeviction``).

The limit is small (:data:`MAXMEMORY`) so that a test fills it in a fraction of a
second with a few thousand small keys, not with big data.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import redis

from fairpost.mailer.testing.services import RedisServer, redis_server

MAXMEMORY = 4 * 1024 * 1024
"""4 MB: an empty redis-server uses about 1 MB of it."""

POLICIES = ("noeviction", "volatile-lru", "allkeys-lru")


class LimitedRedis:
    """One redis-server per policy, each started on first use and kept for the session."""

    def __init__(self, stack: ExitStack) -> None:
        self._stack = stack
        self._servers: dict[str, RedisServer] = {}

    def url(self, policy: str) -> str:
        """The URL of a flushed server started with ``--maxmemory-policy policy``
        (a test that changed its policy or limit has them put back)."""
        server = self._servers.get(policy)
        if server is None:
            server = self._stack.enter_context(
                redis_server("--maxmemory", str(MAXMEMORY), "--maxmemory-policy", policy)
            )
            self._servers[policy] = server
        with redis.Redis.from_url(server.url()) as client:
            client.config_set("maxmemory-policy", policy)
            client.config_set("maxmemory", MAXMEMORY)
            client.flushall()
            client.config_resetstat()  # evicted_keys back to 0
        return server.url()


@contextmanager
def limited_redis() -> Iterator[LimitedRedis]:
    with ExitStack() as stack:
        yield LimitedRedis(stack)


def fill_to(client: redis.Redis, fill: float, *, ttl: int = 0, prefix: str = "filler") -> int:
    """Write keys that are not fairpost's (a neighbour's, 1 KB each) until Redis holds
    ``fill`` of its maxmemory, or refuses, or has been given twice that much (a Redis
    that evicts never holds more than its limit); returns how many were written. ``ttl``:
    each key's, so that ``volatile-*`` may evict them."""
    limit = int(client.info("memory")["maxmemory"])
    goal = fill * limit
    written = 0
    value = b"x" * 1024
    while int(client.info("memory")["used_memory"]) < goal and written * len(value) < fill * 2 * limit:
        with client.pipeline(transaction=False) as pipe:
            for i in range(64):
                if ttl:
                    pipe.set(f"{prefix}:{written + i}", value, ex=ttl)
                else:
                    pipe.set(f"{prefix}:{written + i}", value)
            try:
                pipe.execute()
            except redis.exceptions.OutOfMemoryError:
                return written
        written += 64
    return written
