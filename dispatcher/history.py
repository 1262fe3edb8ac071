"""The history of sent mail: what status() and SES events need of a mail once its
record has expired, a short line a mail in a day's bucket (dispatcher/history.lua).

A sent job's record stays whole for ``FAIRPOST_JOB_DETAIL_TTL`` (a day by
default: its SES delivery and most bounces come within it), then goes; from its
send on, finish.lua also keeps its line (state, tenant, priority, recipients,
times, send number, SES's verdict, ...) as the field of one of the day's
buckets, a hash with a TTL of ``FAIRPOST_JOB_TTL`` past the day's end. A
bucket holds many mails in one key, in Redis's compact listpack encoding
while it has at most ``hash-max-listpack-entries`` fields of at most
``hash-max-listpack-value`` bytes: about 80 bytes a mail where a record key
takes 424 (BENCHMARKS.md). The line keeps no SES message id, diagnostic or
error: status() of a mail past its detail TTL shows none.

Every bucket has a TTL, so an evicting Redis (``volatile-*``) may drop one: what
goes is history alone (status() of those mails says :class:`UnknownJob`), never
a waiting mail, which has no TTL (docs/design.md, "Redis memory").
"""

from __future__ import annotations

from typing import Any

import redis
import redis.asyncio

from fairpost.dispatcher.calls import script
from fairpost.dispatcher.keys import Keys
from fairpost.dispatcher.replies import text

__all__ = ["HISTORY_FIELDS", "OUTCOME_RANK", "History", "SyncHistory", "record_of_line"]

HISTORY_FIELDS = (
    "priority",
    "recipients",
    "created_ms",
    "dispatched_ms",
    "finished_ms",
    "attempts",
    "throttled",
    "send_seq",
    "delivery",
    "bounce_type",
    "suppressed",
    "replays",
    "suppressed_reason",
)
"""The record fields a line keeps, in its order after its layout, state and tenant
(history.lua's HISTORY_FIELDS)."""

_AFTER_CREATED = ("dispatched_ms", "finished_ms")
"""Kept as ms after ``created_ms``: shorter."""

OUTCOME_RANK = ("delayed", "delivered", "rejected", "bounced", "complained")
"""SES's outcomes of a mail, least bad first: a line keeps the worst it was told."""


def record_of_line(line: str) -> dict[str, str]:
    """A line of the history as the record fields it keeps (those it has), its
    ``sent_ms`` its ``finished_ms``; empty for a layout this version does not know."""
    version, state, tenant, *values = line.split("|")
    if version != "1" or len(values) != len(HISTORY_FIELDS):
        return {}
    record = {"state": state, "tenant": tenant}
    record.update((name, value) for name, value in zip(HISTORY_FIELDS, values, strict=True) if value)
    created = int(record.get("created_ms", "0"))
    for name in _AFTER_CREATED:
        if name in record:
            record[name] = str(created + int(record[name]))
    if state == "sent" and "finished_ms" in record:
        record["sent_ms"] = record["finished_ms"]
    return record


class History:
    """The history's reads and SES's verdicts on it, on an asyncio client."""

    def __init__(self, client: redis.asyncio.Redis, keys: Keys) -> None:
        self.keys = keys
        self._read = client.register_script(script("history_read"))
        self._outcome = client.register_script(script("history_outcome"))

    async def record(self, job_id: str) -> dict[str, str]:
        """The job's fields as its line keeps them; empty if no bucket has it."""
        args = [self.keys.history_prefix(), job_id]
        line: Any = await self._read(keys=[self.keys.history_days()], args=args)
        return record_of_line(text(line)) if line is not None else {}

    async def outcome(
        self,
        job_id: str,
        outcome: str,
        bounce_type: str | None,
        client: redis.asyncio.client.Pipeline | None = None,
    ) -> Any:
        """Put SES's ``outcome`` on the job's line, unless it holds a worse one: 1
        written, 0 a worse one kept, -1 no line (queued on ``client`` when given)."""
        args = [self.keys.history_prefix(), job_id, outcome, bounce_type or "", *OUTCOME_RANK]
        return await self._outcome(keys=[self.keys.history_days()], args=args, client=client)


class SyncHistory:
    """:class:`History`'s read on a blocking client (the SDK's :class:`MailClient`)."""

    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.keys = keys
        self._read = client.register_script(script("history_read"))

    def record(self, job_id: str) -> dict[str, str]:
        args = [self.keys.history_prefix(), job_id]
        line: Any = self._read(keys=[self.keys.history_days()], args=args)
        return record_of_line(text(line)) if line is not None else {}
