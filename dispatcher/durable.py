"""Writes the product relies on, kept until replicas hold them (``FAIRPOST_REDIS_MIN_REPLICAS``).

Redis replication is asynchronous: a master acknowledges a write before any
replica has it, and a failover promotes a replica that may lack its last
writes. The writes fairpost acts on once they are acknowledged -- an enqueue
whose job id the caller gets back, and whatever a job kind's worker must not
lose (a grant a job goes out under, the record that its downstream took it) --
end with ``WAIT replicas timeout`` as the last command of their own pipeline
(``WAIT`` counts the writes of its connection), and count as failed,
:class:`NotReplicated`, unless enough replicas confirm.
Sentinel and Redis Cluster promote the replica that has the most of the
master's writes, so a confirmed write outlives the failover of its master.

With ``replicas == 0`` (a lone server, the default) nothing waits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis.asyncio.client
import redis.client

from fairpost.config import Settings
from fairpost.dispatcher.errors import NotReplicated

__all__ = ["Durability", "NotReplicated", "durability", "replica_shortfall"]


AnyPipeline = redis.client.Pipeline | redis.asyncio.client.Pipeline


@dataclass(frozen=True)
class Durability:
    replicas: int = 0
    timeout_ms: int = 1000

    def queue_wait(self, pipe: AnyPipeline) -> None:
        """Queue ``WAIT`` as the pipeline's last command (nothing without replicas to wait for)."""
        if self.replicas:
            pipe.execute_command("WAIT", self.replicas, self.timeout_ms)

    def check(self, results: Sequence[Any]) -> list[Any]:
        """The pipeline's results without the ``WAIT``'s; raise :class:`NotReplicated`
        if too few replicas confirmed."""
        if not self.replicas:
            return list(results)
        acked = int(results[-1])
        if acked < self.replicas:
            raise NotReplicated(acked, self.replicas, self.timeout_ms / 1000)
        return list(results[:-1])


def durability(settings: Settings) -> Durability:
    return Durability(settings.redis_min_replicas, int(settings.redis_wait_seconds * 1000))


async def replica_shortfall(client: redis.asyncio.Redis, replicas: int) -> str | None:
    """What to warn of at start-up when the master has fewer replicas connected than
    writes wait for (None if enough): every such write would fail, NotReplicated, until
    they connect. ``client`` reaches the master in every topology (fairpost.dispatcher.connect)."""
    if not replicas:
        return None
    info: dict[str, Any] = await client.info("replication")
    connected = int(info.get("connected_slaves", 0))
    if connected >= replicas:
        return None
    noun = "replica" if connected == 1 else "replicas"
    return (
        f"FAIRPOST_REDIS_MIN_REPLICAS={replicas} but the Redis master has {connected} {noun} "
        "connected: enqueues, quota grants and sent records fail (NotReplicated) until enough connect"
    )
