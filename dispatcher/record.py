"""The job record's layout in Redis, as the store keeps it.

A job is its record, the hash :meth:`Keys.job` (state, tenant, times: short
values), and its payload (a mail's JSON, a kilobyte or so) in a string of its
own beside it, :meth:`Keys.payload`. In the hash, the payload would pass Redis's
default ``hash-max-listpack-value`` (64 bytes) and Redis would keep the whole
record as a hash table: about 2,000 bytes a waiting 1 KB mail, against 1,700
this way (BENCHMARKS.md). Both keys carry the ``{prefix}`` hash tag, as every key.

Jobs written before this layout keep the payload in the record's ``payload``
field: every reader takes that field when it is there (the scripts, and
:func:`job_record`), and everything that deletes, expires or keeps a record
does the same to the payload key (finish, cancel, purge, replay).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dispatcher.replies import record, text

__all__ = ["PAYLOAD", "job_record"]

PAYLOAD = "payload"
"""The field of :func:`job_record` with the payload (and of a record written
before the payload had a key of its own)."""


def job_record(raw: Mapping[Any, Any], payload: Any = None) -> dict[str, str]:
    """A job's record (``HGETALL`` of :meth:`Keys.job`) as text, with its payload
    (``GET`` of :meth:`Keys.payload`) in ``payload`` if it has one; empty when
    there is no record."""
    fields = record(raw)
    if fields and payload is not None and PAYLOAD not in fields:
        fields[PAYLOAD] = text(payload)
    return fields
