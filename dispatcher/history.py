"""The history of finished jobs: what is read of a job once its record has expired,
a short line a job in a day's bucket (dispatcher/history.lua).

A sent job's record stays whole for ``FAIRPOST_JOB_DETAIL_TTL`` (a day by
default), then goes; from its end on, finish.lua also keeps its line (state,
tenant, then the record fields its kind names through
:meth:`~fairpost.dispatcher.keys.Keys.history_fields`) as the field of one of the
day's buckets, a hash with a TTL of ``FAIRPOST_JOB_TTL`` past the day's end. A
bucket holds many jobs in one key, in Redis's compact listpack encoding while it
has at most ``hash-max-listpack-entries`` fields of at most
``hash-max-listpack-value`` bytes: a line costs a fraction of a record key
(BENCHMARKS.md). A field the kind does not name is not kept: status() of a job
past its detail TTL shows none.

A later outcome of a finished job goes on its line too (:meth:`History.outcome`),
unless the line holds a worse one by the kind's ranking.

Every bucket has a TTL, so an evicting Redis (``volatile-*``) may drop one: what
goes is history alone (status() of those jobs says :class:`UnknownJob`), never
a waiting job, which has no TTL (docs/design.md, "Redis memory").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import redis
import redis.asyncio

from fairpost.dispatcher.calls import script
from fairpost.dispatcher.keys import HistoryField, Keys, pack_history
from fairpost.dispatcher.replies import text

__all__ = ["History", "SyncHistory", "record_of_line"]


def record_of_line(line: str, fields: Sequence[HistoryField]) -> dict[str, str]:
    """A line of the history as the record fields it keeps (those it has), given the
    ``fields`` it was written with (:meth:`Keys.history_fields`); a sent job's
    ``sent_ms`` is its ``finished_ms``. Empty for a layout this version does not know."""
    version, state, tenant, *values = line.split("|")
    if version != "1" or len(values) != len(fields):
        return {}
    record = {"state": state, "tenant": tenant}
    record.update((field.name, value) for field, value in zip(fields, values, strict=True) if value)
    created = int(record.get("created_ms", "0"))
    for field in fields:
        if field.after_created and field.name in record:
            record[field.name] = str(created + int(record[field.name]))
    if state == "sent" and "finished_ms" in record:
        record["sent_ms"] = record["finished_ms"]
    return record


class History:
    """The history's reads and a job's later outcomes on it, on an asyncio client."""

    def __init__(self, client: redis.asyncio.Redis, keys: Keys) -> None:
        self.keys = keys
        self._read = client.register_script(script("history_read"))
        self._outcome = client.register_script(script("history_outcome"))

    async def record(self, job_id: str) -> dict[str, str]:
        """The job's fields as its line keeps them; empty if no bucket has it."""
        args = [self.keys.history_prefix(), job_id]
        line: Any = await self._read(keys=[self.keys.history_days()], args=args)
        return record_of_line(text(line), self.keys.history_fields()) if line is not None else {}

    async def outcome(
        self,
        job_id: str,
        ranked: tuple[str, str],
        rank: Sequence[str],
        also: Mapping[str, str] | None = None,
        client: redis.asyncio.client.Pipeline | None = None,
    ) -> Any:
        """Put ``ranked`` (a field, its value) and ``also``'s fields on the job's line,
        unless the line holds a worse value of that field by ``rank`` (least bad
        first; a value not in it is less bad than any): 1 written, 0 a worse one
        kept, -1 no line (history_outcome.lua; queued on ``client`` when given)."""
        fields = self.keys.history_fields()
        names = {f.name for f in fields}
        pairs = [ranked, *(also or {}).items()]
        for name, _ in pairs:
            if name not in names:
                raise ValueError(f"history outcome field {name!r}: not one the line keeps ({sorted(names)})")
        args: list[str | int] = [self.keys.history_prefix(), job_id, pack_history(fields), len(rank), *rank]
        args += [part for pair in pairs for part in pair]
        return await self._outcome(keys=[self.keys.history_days()], args=args, client=client)


class SyncHistory:
    """:class:`History`'s read on a blocking client (the SDK's client)."""

    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.keys = keys
        self._read = client.register_script(script("history_read"))

    def record(self, job_id: str) -> dict[str, str]:
        args = [self.keys.history_prefix(), job_id]
        line: Any = self._read(keys=[self.keys.history_days()], args=args)
        return record_of_line(text(line), self.keys.history_fields()) if line is not None else {}
