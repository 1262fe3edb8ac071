"""The dispatcher's errors (the root is :class:`fairpost.config.errors.FairpostError`)::

FairpostError
├── ConfigError (fairpost.config.errors)
│   └── RedisAccessDenied (Redis refused the credentials or a command)
└── DispatchError
    ├── UnknownJob
    ├── TooLateToCancel
    ├── NotReplayable
    ├── NotReplicated (also a redis RedisError)
    ├── EvictingRedis
    ├── RedisNearlyFull
    ├── NewerFormat
    ├── LayoutNotReadable
    └── MigrationBusy
"""

from __future__ import annotations

from redis.exceptions import RedisError

from fairpost.config.errors import ConfigError, FairpostError

__all__ = [
    "DispatchError",
    "EvictingRedis",
    "LayoutNotReadable",
    "MigrationBusy",
    "NewerFormat",
    "NotReplayable",
    "NotReplicated",
    "RedisAccessDenied",
    "RedisNearlyFull",
    "TooLateToCancel",
    "UnknownJob",
]


class DispatchError(FairpostError):
    """The dispatcher failed."""


class UnknownJob(DispatchError):
    """No job has this id (it never existed, or its record expired)."""

    def __init__(self, job_id: str) -> None:
        self.job_id = job_id
        super().__init__(f"no job with id {job_id!r}")


class TooLateToCancel(DispatchError):
    """The job was handed to its downstream (or finished) already: it can no longer be cancelled."""

    def __init__(self, job_id: str, state: str) -> None:
        self.job_id = job_id
        self.state = state
        super().__init__(f"job {job_id!r} is {state}: too late to cancel")


class NotReplayable(DispatchError):
    """The job cannot be replayed: it is not a dead letter, or nothing of it is left to send."""

    def __init__(self, job_id: str, why: str) -> None:
        self.job_id = job_id
        self.why = why
        super().__init__(f"job {job_id!r} cannot be replayed: {why}")


class NotReplicated(DispatchError, RedisError):
    """A write reached the Redis master but not enough replicas in time: a failover
    now could lose it.

    A :class:`RedisError` too, on purpose: to every caller it is Redis being
    unavailable (the daemon's loops back off and retry, the CLI says Redis
    failed), never a fact about the input.
    """

    def __init__(self, acked: int, wanted: int, seconds: float) -> None:
        self.acked = acked
        self.wanted = wanted
        super().__init__(
            f"the write reached the Redis master but {acked} of the {wanted} replicas "
            f"FAIRPOST_REDIS_MIN_REPLICAS asks for within {seconds:g}s"
        )


class RedisAccessDenied(ConfigError):
    """Redis refused fairpost's credentials (``WRONGPASS``, ``NOAUTH``) or a command
    (``NOPERM``): the settings or the Redis user's ACL are wrong, so trying again
    cannot help. ``code`` is Redis's error code, ``setting`` the variable to fix.

    A :class:`ConfigError`, on purpose: nothing was written, and it is not Redis
    being away (fairpost.dispatcher.access builds it).
    """

    def __init__(self, code: str, setting: str, rule: str) -> None:
        self.code = code
        self.setting = setting
        super().__init__([(setting, rule)])


class EvictingRedis(DispatchError):
    """Redis's ``maxmemory-policy`` lets it evict keys fairpost cannot lose: fairpost
    refuses to write jobs there (dispatcher/redis_memory.py). A configuration error,
    not retriable: ``policy`` names the setting's value, ``fix`` what to change."""

    retriable = False

    def __init__(self, policy: str, reason: str, fix: str) -> None:
        self.policy = policy
        self.fix = fix
        super().__init__(f"{reason}. Fix: {fix}")


class RedisNearlyFull(DispatchError):
    """Redis holds more than the high-water mark of its ``maxmemory``: new jobs are
    refused, and nothing was written, so that the daemon keeps room to drain what is
    queued and Redis never evicts. Retriable: try again once the queues drain."""

    retriable = True

    def __init__(self, used_memory: int, maxmemory: int, high_water: float) -> None:
        self.used_memory = used_memory
        self.maxmemory = maxmemory
        self.high_water = high_water
        fill = used_memory / maxmemory if maxmemory else 1.0
        super().__init__(
            f"Redis is {fill:.0%} full ({used_memory} of its maxmemory {maxmemory} bytes), over "
            f"the high-water mark FAIRPOST_REDIS_HIGH_WATER={high_water:g}: new jobs are refused "
            "until the daemon drains the queues; nothing was written; try again later"
        )


class NewerFormat(DispatchError):
    """Written in a format newer than this fairpost reads (a newer release wrote it):
    left as it is, for a newer reader, never deleted, acknowledged or dead-lettered."""

    def __init__(self, what: str, found: int, reads: int) -> None:
        self.what = what
        """Which format (``sqs_body``, ``outcome_event``): a metric label."""
        self.found = found
        self.reads = reads
        super().__init__(
            f"{what} in format version {found}; this fairpost reads up to version {reads}: "
            "left for a newer fairpost"
        )


class LayoutNotReadable(DispatchError):
    """The key layout in Redis is one this fairpost cannot read; the message says
    the version found, the versions read, and what fixes it."""

    def __init__(self, found: str, reads: tuple[int, ...], fix: str) -> None:
        self.found = found
        self.reads = reads
        self.fix = fix
        shown = ", ".join(str(v) for v in reads)
        super().__init__(f"the Redis key layout is version {found}; this fairpost reads {shown}: {fix}")


class MigrationBusy(DispatchError):
    """Another ``fairpost migrate`` held the lock longer than this one would wait."""
