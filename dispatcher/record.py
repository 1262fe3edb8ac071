"""The job record's layout in Redis, as the store keeps it.

A job is its record, the hash :meth:`Keys.job` (state, tenant, times: short
values), and its payload (a kilobyte or so, say). In the hash, the
payload would pass Redis's default ``hash-max-listpack-value`` (64 bytes) and
Redis would keep the whole record as a hash table (about 2,000 bytes a waiting
1 KB job). Where the payload lives depends on where the job is:

- Waiting in its tenant's queue (enqueue.lua): in its queue entry,
  ``<id>`` :data:`ENTRY_SEP` ``<payload>``, with no key of its own. A Redis
  list packs its entries into 8 KB listpack nodes, so about seven payloads
  share one allocation: about 1,400 bytes a waiting 1 KB job in all, against
  1,700 with a key of its own (BENCHMARKS.md). The record says so in its
  :data:`INLINE` field (``1``).
- Claimed, dispatched, finished dead, or scheduled: in the string
  :meth:`Keys.payload` beside the record. The claim writes it as it takes the
  entry (and sets :data:`INLINE` to ``0``): lease expiry, requeue, replay and
  promote put the job back in its queue as its id alone, and the payload is
  read from the key again.
- A job cancelled while queued keeps its entry in the queue (taking it out
  would scan the backlog), and the entry holds its only copy of the payload
  until the claim comes to it and saves it to the key with the record's TTL
  (:data:`INLINE` ``0``). Replayed before that, the job goes back to the tail
  of its queue as its id alone, as every replayed job, and :data:`INLINE`
  becomes ``2``: the entry is no longer its place, and the claim, which comes
  to it first, only saves the payload.

Both keys carry the ``{prefix}`` hash tag, as every key. So a waiting job's
payload is not readable by its id: a status does not need it, and a dead
letter still in its queue is replayable (:func:`has_payload`).

Everything that deletes, expires or keeps a record does the same to the
payload key (finish, cancel, purge, replay). No record holds its payload in a
field of its own: a pre-release layout did, and ``fairpost migrate`` moves
any such field to its key (dispatcher/migrate.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fairpost.dispatcher.replies import record, text

__all__ = ["ENTRY_SEP", "INLINE", "PAYLOAD", "has_payload", "job_record"]

PAYLOAD = "payload"
"""The field of :func:`job_record` with the payload (never one of the record's own)."""

INLINE = "inline"
"""The record field that says a queue entry carries the job's payload: ``1``
from enqueue until the claim takes the entry (then ``0``); ``2`` when the job
was replayed meanwhile and the entry is no longer its place in the queue."""

ENTRY_SEP = "\n"
"""What separates a queue entry's id from its payload: no job id holds it
(:class:`fairpost.dispatcher.jobs.NewJob` refuses one that does); an entry without it
is a job id alone."""


def job_record(raw: Mapping[Any, Any], payload: Any = None) -> dict[str, str]:
    """A job's record (``HGETALL`` of :meth:`Keys.job`) as text, with its payload
    (``GET`` of :meth:`Keys.payload`) in ``payload`` if it has one; empty when
    there is no record. A job waiting in its queue has none readable by id."""
    fields = record(raw)
    if fields and payload is not None:
        fields[PAYLOAD] = text(payload)
    return fields


def has_payload(fields: Mapping[str, str]) -> bool:
    """Whether a record of :func:`job_record` has something to send: its payload,
    or an entry in its queue that carries it."""
    return PAYLOAD in fields or fields.get(INLINE) in ("1", "2")
