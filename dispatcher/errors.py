"""The dispatcher's errors (the root is :class:`fairpost.config.errors.FairpostError`)::

FairpostError
└── DispatchError
    ├── UnknownJob
    ├── TooLateToCancel
    ├── NotReplayable
    ├── NotReplicated (also a redis RedisError)
    ├── NewerFormat
    ├── LayoutNotReadable
    └── MigrationBusy
"""

from __future__ import annotations

from redis.exceptions import RedisError

from fairpost.config.errors import FairpostError

__all__ = [
    "DispatchError",
    "LayoutNotReadable",
    "MigrationBusy",
    "NewerFormat",
    "NotReplayable",
    "NotReplicated",
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
