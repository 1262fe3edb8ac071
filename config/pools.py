"""Sending pools (#43): several SES accounts or regions, each with its own queue and quota.

A pool is one SES account in one region, its SQS FIFO queue, its global limits
and its Redis key space (its own hash tag, so that on a Redis Cluster each pool
may sit on a shard of its own). Today's single set-up is the pool named
:data:`DEFAULT_POOL`: the top-level settings (``FAIRPOST_QUEUE_NAME``,
``FAIRPOST_GLOBAL_LIMITS``, ``FAIRPOST_KEY_PREFIX``, the ``AWS_*`` variables),
unchanged for an installation that declares no other.

Every other pool is declared under ``pools`` (``FAIRPOST_POOLS__EU__REGION``,
``[fairpost.pools.eu]``: config/pool_model.py holds its settings and the rules
across pools); :func:`pool_settings` turns one into the whole
:class:`~fairpost.config.settings.Settings` its dispatcher, sender and SDK
routing use, so that each pool runs exactly as the single-pool fairpost does.
"""

from __future__ import annotations

from typing import Any

from fairpost.config.pool_model import (
    DEFAULT_POOL,
    POOL_NAME_RULE,
    PoolSettings,
    is_valid_pool_name,
    pool_key_prefix,
    pool_names,
)
from fairpost.config.settings import Settings

__all__ = [
    "DEFAULT_POOL",
    "POOL_NAME_RULE",
    "PoolSettings",
    "is_valid_pool_name",
    "pool_key_prefix",
    "pool_names",
    "pool_settings",
    "served_pools",
]


def served_pools(settings: Settings) -> tuple[str, ...]:
    """The pools this replica runs (``FAIRPOST_SERVE_POOLS``; default: all)."""
    return settings.serve_pools or pool_names(settings)


def pool_settings(settings: Settings, name: str) -> Settings:
    """The settings a pool runs under: the top-level ones with the pool's key prefix,
    queue and global limits; the default pool's are the top-level ones themselves.

    Raises ``KeyError`` for a pool the settings do not declare.
    """
    if name == DEFAULT_POOL:
        return settings
    pool = settings.pools[name]
    update: dict[str, Any] = {
        "key_prefix": pool_key_prefix(settings, name),
        "queue_name": pool.queue_name or settings.queue_name,
        "pools": {},
        "serve_pools": None,
        "events_queue_name": pool.events_queue_name,
        "failover_after": pool.failover_after,
    }
    if pool.global_limits is not None:
        update["global_limits"] = pool.global_limits
    if pool.configuration_set is not None:
        update["configuration_set"] = pool.configuration_set
    return settings.model_copy(update=update)
