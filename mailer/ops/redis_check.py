"""What ``fairpost check-config`` says of the Redis the settings name: how full it
is, and whether its eviction policy can lose mail (dispatcher/redis_memory.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

import redis

from fairpost.config import Settings
from fairpost.dispatcher.redis_memory import judge_policy, read_masters

__all__ = ["RedisFindings", "redis_findings"]

_QUICK = {"socket_connect_timeout": 2.0, "socket_timeout": 5.0}
"""check-config must answer at once, even where Redis is not at hand."""


@dataclass
class RedisFindings:
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def redis_findings(settings: Settings) -> RedisFindings:
    """Every master read (a cluster's all); a Redis out of reach is a warning, no error:
    check-config checks the settings, and may run where Redis is not reachable."""
    found = RedisFindings()
    try:
        masters = read_masters(settings, **_QUICK)
    except (redis.RedisError, OSError) as exc:
        found.warnings.append(f"Redis's memory and eviction policy not checked ({type(exc).__name__})")
        return found
    for memory in masters:
        where = f"{memory.node}: " if memory.node else ""
        found.notes.append(where + memory.describe())
        verdict = judge_policy(memory, settings.redis_high_water)
        if verdict.refused:
            found.errors.append(f"{where}{verdict.reason}. Fix: {verdict.fix}")
        elif verdict.level == "guarded":
            found.warnings.append(where + verdict.reason)
        if memory.evicted_keys:
            found.warnings.append(f"{where}Redis evicted {memory.evicted_keys} keys since it started")
    return found
