"""What a job is, and the states it goes through."""

from __future__ import annotations

import enum
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field

from fairpost.dispatcher.keys import LANES, PRIORITIES
from fairpost.dispatcher.record import ENTRY_SEP


class JobState(enum.StrEnum):
    """The states the dispatcher gives. An application may end a job in a final
    state of its own as well (:meth:`~fairpost.dispatcher.store.JobStore.finish`):
    kept as a sent job is, its record without its content."""

    SCHEDULED = "scheduled"
    """Waiting for its send time; then it enters its tenant's queue."""
    QUEUED = "queued"
    """Waiting in its tenant's queue in Redis."""
    CLAIMED = "claimed"
    """Taken by a dispatcher under a lease; comes back if the lease expires."""
    DISPATCHED = "dispatched"
    """Handed to its worker's downstream (a queue, say)."""
    SENT = "sent"
    """Finished: delivered."""
    DEAD = "dead"
    """Finished: undelivered, kept with the reason."""


def new_job_id() -> str:
    """A random id, safe as an SQS dedup id and a Redis key part."""
    return uuid.uuid4().hex


def check_priority(priority: str) -> str:
    if priority not in PRIORITIES:
        raise ValueError(f"must be one of {', '.join(PRIORITIES)}")
    return priority


def check_lane(value: str) -> str:
    """A priority, or a priority's bulk lane (:data:`~fairpost.dispatcher.keys.LANES`)."""
    if value not in LANES:
        raise ValueError(f"must be one of {', '.join(LANES)}")
    return value


@dataclass(frozen=True)
class Job:
    """A claimed job, as a worker receives it."""

    id: str
    tenant: str
    kind: str
    payload: str
    """The job's own data, opaque to the dispatcher (JSON, say)."""
    attempts: int
    created_ms: int
    replays: int = 0
    """Times an operator replayed it from the dead letters (0: never)."""
    claimed_ms: int = field(default=0, compare=False)
    """When its claim was made (Redis time, ms; 0: not known). Handed off within its
    lease, its in-flight slot keeps the expiry its claim gave it (handoff.lua)."""


@dataclass(frozen=True)
class NewJob:
    """A job to enqueue; ``fields`` are extra record fields (strings)."""

    id: str
    tenant: str
    kind: str
    payload: str
    priority: str = "normal"
    """Its lane: a priority, or its bulk lane (:func:`~fairpost.dispatcher.keys.lane`)."""
    fields: Mapping[str, str] | None = None
    send_at_ms: int = 0
    """When it may be sent (Redis server time, ms); 0 or a past time: now."""
    idempotency_key: str | None = None
    """A second job of the tenant with this key, within ``idempotency_ttl``, is not written."""
    idempotency_ttl: int = 86_400
    content: bytes | None = None
    """Stored beside the record under :meth:`Keys.content` (a claim check)."""

    def __post_init__(self) -> None:
        # A queue entry is the id, this separator and the payload (dispatcher/record.py).
        if ENTRY_SEP in self.id:
            raise ValueError(f"a job id holds no {ENTRY_SEP!r}")
        # A queue of any other lane would never be claimed from (claim.lua).
        try:
            check_lane(self.priority)
        except ValueError as exc:
            raise ValueError(f"priority {exc}") from None
