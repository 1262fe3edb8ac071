"""The journal: a Redis stream to which the scripts that end jobs append one
entry per job, in the same atomic step as the change.

The dispatcher knows nothing of what the entries mean: a script that ends a
job (``finish``, ``cancel``, ``dead_letter``) appends ``job`` (its id),
``state`` (the state it gave it), the record fields the journal copies
(:attr:`Journal.copy`, when the record has them) and whatever its caller
gave for that job. A caller appends entries of its own about a job with
:class:`JournalWriter` (``append.lua``). So a change and its entry are one
atomic step: a replica that dies between two calls leaves neither a state
change without its entry nor an entry without its change, and a script run
again that changes nothing appends nothing.

The stream is trimmed as it grows: to about :attr:`Journal.max_length`
entries (``MAXLEN ~``) and entries younger than :attr:`Journal.max_age_ms`
(``MINID ~``). Each entry's id is its identity and its time (Redis time).
A job kind may read it as a feed of its jobs' outcomes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import redis.asyncio

from fairpost.dispatcher.scripts import lua_source

__all__ = [
    "COPIED_FIELDS",
    "Entry",
    "Journal",
    "JournalWriter",
    "append_source",
    "entry_args",
    "journal_args",
]

Entry = Mapping[str, str]
"""The fields a caller gives for one job's journal entry."""

COPIED_FIELDS = ("tenant", "idempotency_key", "dead_reason")
"""The record fields an entry carries by default: whose the job is, the key it was
enqueued with, and why it died."""


@dataclass(frozen=True)
class Journal:
    key: str
    """The stream (:meth:`Keys.outcomes` for fairpost's own)."""
    max_length: int
    max_age_ms: int
    copy: tuple[str, ...] = COPIED_FIELDS


def journal_args(journal: Journal | None) -> list[str | int]:
    """The journal's part of a script's ARGV (journal.lua); ``[0, 0, 0]``: none."""
    if journal is None:
        return [0, 0, 0]
    return [journal.max_length, journal.max_age_ms, len(journal.copy), *journal.copy]


def journal_keys(journal: Journal | None) -> list[str]:
    """The journal's part of a script's KEYS: its stream, last, only with a journal."""
    return [] if journal is None else [journal.key]


def entry_args(entry: Entry | None) -> list[str | int]:
    """One job's given entry in a script's ARGV: its count, then its pairs."""
    pairs: list[str | int] = []
    for name, value in (entry or {}).items():
        pairs += [name, value]
    return [len(pairs) // 2, *pairs]


def append_source() -> str:
    """``append.lua`` as it is loaded: after the journal's shared part."""
    return lua_source("fairpost.dispatcher", "journal") + "\n" + lua_source("fairpost.dispatcher", "append")


class JournalWriter:
    """Appends entries about jobs outside the scripts that end them (``append.lua``)."""

    def __init__(self, client: redis.asyncio.Redis, journal: Journal | None) -> None:
        self.journal = journal
        self._append = client.register_script(append_source())

    async def append(
        self,
        job_key: str,
        job_id: str,
        entry: Entry,
        *,
        pipeline: redis.asyncio.client.Pipeline | None = None,
    ) -> None:
        """Append ``entry`` about the job (record fields copied as the journal says);
        with ``pipeline`` only queued on it. Nothing without a journal."""
        if self.journal is None:
            return
        keys = [job_key, self.journal.key]
        args = [*journal_args(self.journal), job_id, *entry_args(entry)]
        await self._append(keys=keys, args=args, client=pipeline)
