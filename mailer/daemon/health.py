"""Is this replica alive? A heartbeat in Redis, and the check ``fairpost health`` makes.

While every watched task of the daemon runs, its ``heartbeat`` task writes
``MailKeys.heartbeat(replica)`` (a JSON note with a TTL of ``HEARTBEAT_TTL``
seconds) every ``HEARTBEAT_INTERVAL`` seconds, and the replica's id in
``MailKeys.replicas()`` (scored by expiry). A replica whose loops died, whose
event loop is stuck or which stopped, stops writing, and the key expires
(a clean stop deletes it at once).

``fairpost health`` (Docker's ``HEALTHCHECK``) exits 0 when the replica is
alive, 1 when not: it asks ``/healthz`` on ``FAIRPOST_HTTP_PORT`` when that
is set, else it reads the heartbeat key of ``FAIRPOST_REPLICA_ID`` (default:
the host name, which in a container is the container's). Needs only
``redis`` and the standard library.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import redis
import redis.asyncio

from fairpost.config import Settings
from fairpost.dispatcher.backoff import OutageBackoff
from fairpost.dispatcher.connect import redis_client
from fairpost.dispatcher.loop import OnError, forever
from fairpost.dispatcher.scripts import lua_source
from fairpost.mailer.sdk.keys import MailKeys

__all__ = [
    "HEARTBEAT_INTERVAL",
    "HEARTBEAT_TTL",
    "Health",
    "Heartbeat",
    "Liveness",
    "check_heartbeat",
    "check_http",
    "replica_name",
]

log = logging.getLogger("fairpost.health")

HEARTBEAT_INTERVAL = 5.0
HEARTBEAT_TTL = 20
"""Seconds a heartbeat stays valid: four beats may be missed before a replica counts as dead."""


def replica_name(settings: Settings) -> str:
    return settings.replica_id or socket.gethostname()


@dataclass(frozen=True)
class Health:
    ok: bool
    detail: str
    info: Mapping[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "detail": self.detail, "heartbeat": dict(self.info or {})}


class Liveness:
    """Which of the daemon's watched tasks run; what /healthz and the heartbeat report."""

    def __init__(self) -> None:
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self.stopping = False

    def watch(self, tasks: Mapping[str, asyncio.Task[None]]) -> None:
        self._tasks = dict(tasks)

    @property
    def names(self) -> list[str]:
        return sorted(self._tasks)

    def dead(self) -> list[str]:
        return sorted(name for name, task in self._tasks.items() if task.done())

    def check(self) -> Health:
        if self.stopping:
            return Health(False, "shutting down")
        if not self._tasks:
            return Health(False, "starting")
        dead = self.dead()
        if dead:
            return Health(False, "stopped: " + ", ".join(dead))
        return Health(True, "running: " + ", ".join(self.names))


class Heartbeat:
    """Writes this replica's heartbeat while its tasks live. Run it as a watched task."""

    def __init__(
        self,
        client: redis.asyncio.Redis,
        keys: MailKeys,
        replica: str,
        liveness: Liveness,
        *,
        role: str = "all",
        interval: float = HEARTBEAT_INTERVAL,
        ttl: int = HEARTBEAT_TTL,
        max_outage_seconds: float = 60.0,
        on_error: OnError | None = None,
    ) -> None:
        self._max_outage_seconds = max_outage_seconds
        self._on_error = on_error
        self._redis = client
        self._script = client.register_script(lua_source("fairpost.mailer.daemon", "heartbeat"))
        self._keys = keys
        self.replica = replica
        self._liveness = liveness
        self._role = role
        self.interval = interval
        self.ttl = ttl
        self._started_ms = int(time.time() * 1000)
        self.beats = 0

    async def beat(self) -> bool:
        """Write the heartbeat if every watched task runs; True if written."""
        health = self._liveness.check()
        if not health.ok:
            return False
        now_ms = int(time.time() * 1000)
        note = {
            "replica": self.replica,
            "pid": os.getpid(),
            "role": self._role,
            "started_ms": self._started_ms,
            "beat_ms": now_ms,
            "tasks": self._liveness.names,
        }
        await self._script(
            keys=[self._keys.heartbeat(self.replica), self._keys.replicas()],
            args=[json.dumps(note), self.ttl, self.replica, now_ms],
        )
        self.beats += 1
        return True

    async def run(self, stop: asyncio.Event) -> None:
        """Beat every ``interval`` until ``stop``; a failed beat is tried again on the
        outage back-off, at least once an interval."""

        async def beat() -> float:
            await self.beat()
            return self.interval

        backoff = OutageBackoff(self._max_outage_seconds, most=min(10.0, self.interval))
        await forever("heartbeat", beat, stop, backoff=backoff, on_error=self._on_error)

    async def clear(self) -> None:
        """A clean stop: this replica is gone at once, not after the TTL."""
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.delete(self._keys.heartbeat(self.replica))
            pipe.zrem(self._keys.replicas(), self.replica)
            await pipe.execute()


async def sender_alive(client: redis.asyncio.Redis, keys: MailKeys) -> bool:
    """Whether any replica that receives from SQS (role ``all`` or ``sender``) has a live
    heartbeat: without one nothing in SQS shows progress, so nothing counts as lost."""
    live = await client.zrangebyscore(keys.replicas(), int(time.time() * 1000), "+inf")
    if not live:
        return False
    names = [name.decode() if isinstance(name, bytes) else str(name) for name in live]
    for raw in await client.mget([keys.heartbeat(name) for name in names]):
        try:
            role = json.loads(raw).get("role") if raw else None
        except ValueError:
            continue
        if role in ("all", "sender"):
            return True
    return False


def check_heartbeat(settings: Settings, replica: str | None = None, *, timeout: float = 3.0) -> Health:
    """Alive if the replica's heartbeat key exists (it expires unless renewed)."""
    name = replica or replica_name(settings)
    client = redis_client(settings, socket_timeout=timeout, socket_connect_timeout=timeout)
    try:
        raw = client.get(MailKeys(settings.key_prefix).heartbeat(name))
    except (redis.RedisError, OSError) as exc:
        return Health(False, f"cannot read the heartbeat from Redis: {type(exc).__name__}")
    finally:
        client.close()
    if raw is None:
        return Health(False, f"no heartbeat from replica {name!r} in the last {HEARTBEAT_TTL}s")
    try:
        info: dict[str, Any] = json.loads(raw)
    except ValueError:
        return Health(False, f"unreadable heartbeat from replica {name!r}")
    age = time.time() - int(info.get("beat_ms", 0)) / 1000
    return Health(True, f"replica {name!r} beat {age:.1f}s ago", info)


def check_http(port: int, *, host: str = "127.0.0.1", timeout: float = 3.0) -> Health:
    """Alive if ``/healthz`` answers 200."""
    url = f"http://{host}:{port}/healthz"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            body = response.read().decode("utf-8", "replace").strip()
            return Health(response.status == 200, body)
    except urllib.error.HTTPError as exc:
        return Health(False, exc.read().decode("utf-8", "replace").strip() or f"HTTP {exc.code}")
    except (urllib.error.URLError, OSError) as exc:
        return Health(False, f"no answer from {url}: {exc}")
