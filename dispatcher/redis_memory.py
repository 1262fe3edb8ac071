"""How full Redis is, and whether its eviction policy can lose fairpost's keys.

Read from ``INFO memory`` and ``INFO stats``, never ``CONFIG GET``: managed
services (ElastiCache, MemoryDB, Memorystore) refuse ``CONFIG``, and ``INFO``
says the same (``maxmemory``, ``maxmemory_policy``). One core,
:func:`memory_from_info`, turns the two sections into a :class:`RedisMemory`;
:func:`read_memory` and :func:`aread_memory` are its blocking and asyncio faces,
on whichever node a client talks to (one server, the master Sentinel names, or
the cluster master of fairpost's slot: :mod:`fairpost.dispatcher.connect`).
:func:`read_masters` reads every master of a cluster, for an operator's checks.

:func:`judge_policy` is the one decision (docs/design.md, "Redis memory"):

- ``noeviction`` (or no ``maxmemory``): nothing is ever evicted: fine.
- ``volatile-*``: Redis evicts keys with a TTL once ``used_memory`` reaches
  ``maxmemory``, and fairpost keeps claimed payloads, idempotency keys, busy
  markers and its job kinds' own keys under TTLs. Safe only because the
  enqueue refuses new jobs above the high-water mark
  (``FAIRPOST_REDIS_HIGH_WATER``), so that memory never gets there: guarded.
- ``allkeys-*``: any key can go, queued jobs with it: refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import redis
import redis.asyncio
import redis.cluster

from fairpost.config import Settings
from fairpost.dispatcher.connect import SOCKET_DEFAULTS, node_options, redis_client
from fairpost.dispatcher.errors import EvictingRedis

__all__ = [
    "PolicyOnce",
    "PolicyVerdict",
    "RedisMemory",
    "aread_memory",
    "check_policy",
    "judge_policy",
    "memory_from_info",
    "read_masters",
    "read_memory",
]

SAFE_POLICY = "noeviction"

Level = Literal["ok", "guarded", "refused"]


@dataclass(frozen=True)
class RedisMemory:
    """One Redis master's memory, as its ``INFO`` says."""

    used_memory: int
    """Bytes in use (``used_memory``)."""
    maxmemory: int
    """The limit in bytes; 0: none (Redis grows until the host runs out)."""
    policy: str
    """``maxmemory-policy``: what Redis does at the limit (``noeviction``, ``volatile-lru``...)."""
    evicted_keys: int
    """Keys evicted since the server started (``INFO stats``): any is a key fairpost may have lost."""
    node: str = ""
    """Which server (``host:port``), where more than one was read."""

    @property
    def limited(self) -> bool:
        return self.maxmemory > 0

    @property
    def fill(self) -> float:
        """``used_memory / maxmemory`` (1.0 is full); 0.0 without a limit."""
        return self.used_memory / self.maxmemory if self.maxmemory else 0.0

    def above(self, high_water: float) -> bool:
        """At or over ``high_water`` (a fraction of ``maxmemory``); never without a limit."""
        return self.limited and self.fill >= high_water

    def describe(self) -> str:
        """One line for an operator: how full, under which policy, and any eviction."""
        used = _megabytes(self.used_memory)
        if not self.limited:
            told = f"Redis memory: {used} used, no maxmemory (policy {self.policy})"
        else:
            limit = _megabytes(self.maxmemory)
            told = f"Redis memory: {used} of {limit} ({self.fill:.0%}), policy {self.policy}"
        if self.evicted_keys:
            told += f"; {self.evicted_keys} keys evicted since Redis started"
        return told

    def to_json(self) -> dict[str, Any]:
        return {
            "used_memory": self.used_memory,
            "maxmemory": self.maxmemory,
            "policy": self.policy,
            "evicted_keys": self.evicted_keys,
            "fill": round(self.fill, 4),
            **({"node": self.node} if self.node else {}),
        }


def _megabytes(size: int) -> str:
    return f"{size / 1_048_576:.1f} MB"


@dataclass(frozen=True)
class PolicyVerdict:
    """What fairpost makes of a Redis's eviction policy: ``ok``, ``guarded`` (safe while
    the high-water mark holds) or ``refused``; ``reason`` says why, ``fix`` what to do."""

    level: Level
    reason: str
    fix: str = ""

    @property
    def refused(self) -> bool:
        return self.level == "refused"


def memory_from_info(memory: dict[str, Any], stats: dict[str, Any], node: str = "") -> RedisMemory:
    """The core: ``INFO memory`` and ``INFO stats`` (as redis-py parses them) to a reading."""
    return RedisMemory(
        used_memory=int(memory.get("used_memory", 0)),
        maxmemory=int(memory.get("maxmemory", 0)),
        policy=str(memory.get("maxmemory_policy", SAFE_POLICY)),
        evicted_keys=int(stats.get("evicted_keys", 0)),
        node=node,
    )


def read_memory(client: redis.Redis) -> RedisMemory:
    """The memory of the node ``client`` talks to: both sections in one round trip."""
    with client.pipeline(transaction=False) as pipe:
        pipe.info("memory")
        pipe.info("stats")
        memory, stats = pipe.execute()
    return memory_from_info(memory, stats)


async def aread_memory(client: redis.asyncio.Redis) -> RedisMemory:
    """:func:`read_memory` for asyncio."""
    async with client.pipeline(transaction=False) as pipe:
        pipe.info("memory")
        pipe.info("stats")
        memory, stats = await pipe.execute()
    return memory_from_info(memory, stats)


def read_masters(settings: Settings, **options: Any) -> list[RedisMemory]:
    """Every master's memory: each of a cluster's (fairpost's data sits on one, but a
    full neighbour still fails the cluster), else the one server or Sentinel's master."""
    options = {**SOCKET_DEFAULTS, **options}
    if not settings.redis_cluster:
        client = redis_client(settings, **options)
        try:
            return [read_memory(client)]
        finally:
            client.close()
    # The CA file and the IAM token provider, as every client (dispatcher/connect.py).
    cluster = redis.cluster.RedisCluster.from_url(settings.redis_url, **node_options(settings), **options)
    try:
        primaries = cluster.get_primaries()  # type: ignore[no-untyped-call]
        memory = cluster.info("memory", target_nodes=primaries)
        stats = cluster.info("stats", target_nodes=primaries)
        return [memory_from_info(memory[name], stats[name], name) for name in sorted(memory)]
    finally:
        cluster.close()


def judge_policy(memory: RedisMemory, high_water: float) -> PolicyVerdict:
    """The one decision on a Redis's eviction policy (the module's docstring says why)."""
    policy = memory.policy
    if policy.startswith("allkeys-"):
        return PolicyVerdict(
            "refused",
            f"Redis's maxmemory-policy is {policy}: at maxmemory it evicts any key, "
            "queued jobs among them, and an accepted job would be lost without a word",
            "set maxmemory-policy to noeviction (ElastiCache/MemoryDB: the parameter group; "
            "Memorystore: the instance's configuration), or give fairpost a Redis of its own",
        )
    if policy == SAFE_POLICY or not memory.limited:
        return PolicyVerdict("ok", f"maxmemory-policy {policy}: Redis never evicts fairpost's keys")
    return PolicyVerdict(
        "guarded",
        f"maxmemory-policy {policy} evicts keys with a TTL at maxmemory; new mail is refused "
        f"above {high_water:.0%} of maxmemory (FAIRPOST_REDIS_HIGH_WATER) so that it never gets there",
        "noeviction is safer still; never share this Redis with a cache that fills it",
    )


def check_policy(memory: RedisMemory, high_water: float) -> PolicyVerdict:
    """:func:`judge_policy`; raises :class:`EvictingRedis` when the verdict is ``refused``."""
    verdict = judge_policy(memory, high_water)
    if verdict.refused:
        raise EvictingRedis(memory.policy, verdict.reason, verdict.fix)
    return verdict


class PolicyOnce:
    """The policy read and judged on a client's first write, then kept, so that a send
    costs no more than before; a refusal is not kept (the operator may fix the setting)."""

    def __init__(self, high_water: float) -> None:
        self.high_water = high_water
        self.verdict: PolicyVerdict | None = None

    def check(self, client: redis.Redis) -> PolicyVerdict:
        """:func:`check_policy` on the first call; raises :class:`EvictingRedis`."""
        if self.verdict is None:
            self.verdict = check_policy(read_memory(client), self.high_water)
        return self.verdict

    async def acheck(self, client: redis.asyncio.Redis) -> PolicyVerdict:
        """:meth:`check` for asyncio."""
        if self.verdict is None:
            self.verdict = check_policy(await aread_memory(client), self.high_water)
        return self.verdict
