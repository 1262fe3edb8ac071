"""What only mail keeps of a job: the sender's marker, its SES message id, why it waits.

The dispatcher's :class:`~fairpost.dispatcher.store.JobStore` owns a job's
record and knows nothing of mail. :class:`MailJobs` is the sender's side of
the same record, over the same Redis and keys: the sending marker that keeps
two receivers of one SQS message from both sending it (``send_claim.lua``,
beside this module), a "sent" record with SES's message id, why a mail waits
and until when (read back by ``fairpost status``), and a dead letter for an
SQS message whose job has no record. The final state only mail has,
:data:`MailState.SUPPRESSED`, is here too.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from typing import Any

import redis.asyncio

from fairpost.dispatcher.jobs import JobState
from fairpost.dispatcher.journal import Entry
from fairpost.dispatcher.scripts import lua_source
from fairpost.dispatcher.store import JobStore
from fairpost.mailer.sdk.client import MAIL_KIND
from fairpost.mailer.sdk.keys import mail_keys

__all__ = ["FINAL_STATES", "RAW_BODY_MOST", "MailJobs", "MailState"]


class MailState(enum.StrEnum):
    """The final states only mail has, beside the dispatcher's (:class:`JobState`)."""

    SUPPRESSED = "suppressed"
    """Finished: not sent, every recipient on its tenant's suppression list."""


FINAL_STATES = frozenset({JobState.SENT, JobState.DEAD, MailState.SUPPRESSED})
"""A mail in one of these is done: a message of it received again is deleted unsent."""

RAW_BODY_MOST = 262_144
"""The most of an unreadable SQS body a dead letter keeps: enough to see what was wrong."""


class MailJobs:
    """The sender's reads and writes of its jobs' records."""

    def __init__(self, store: JobStore) -> None:
        self.store = store
        self.redis = store.redis
        self.keys = mail_keys(store.keys)
        self._send_claim = store.redis.register_script(lua_source("fairpost.mailer.daemon", "send_claim"))

    async def claim_sending(
        self, job_ids: Sequence[str], lifetime_ms: int, *, claimants: Sequence[str] = ()
    ) -> list[int]:
        """Take each job's sending marker (send_claim.lua): 1 taken, 0 another sender
        holds it, 2 the job is final already, 3 it has no record. ``claimants``: who
        claims each job; a marker its claimant holds already is taken again."""
        if not job_ids:
            return []
        k = self.keys
        keys = [k.job(i) for i in job_ids] + [k.sending(i) for i in job_ids]
        codes: list[Any] = await self._send_claim(keys=keys, args=[lifetime_ms, *claimants])
        return [int(c) for c in codes]

    async def hold_sending(self, job_ids: Sequence[str], lifetime_ms: int) -> None:
        """The sends go on: each marker still held lasts ``lifetime_ms`` from now."""
        async with self.store.pipeline() as pipe:
            for job_id in job_ids:
                pipe.pexpire(self.keys.sending(job_id), lifetime_ms)
            await pipe.execute()

    async def release_sending(self, job_id: str) -> None:
        await self.redis.delete(self.keys.sending(job_id))

    async def count_throttled(self, job_ids: Sequence[str], reason: str, until_ms: int) -> None:
        """The jobs wait for a quota once more (not an attempt): until ``until_ms``
        (Redis time), because of ``reason`` (``tenant_quota``, ``paused``, ...)."""
        await self.mark_waiting(job_ids, reason, until_ms, count=True)

    async def mark_waiting(
        self, job_ids: Sequence[str], reason: str, until_ms: int, *, count: bool = False
    ) -> None:
        """Why the jobs wait, and until when (Redis time), for their status."""
        async with self.store.pipeline() as pipe:
            for job_id in job_ids:
                if count:
                    pipe.hincrby(self.keys.job(job_id), "throttled", 1)
                pipe.hset(
                    self.keys.job(job_id), mapping={"waiting_for": reason, "waiting_until_ms": until_ms}
                )
            await pipe.execute()

    async def record_sent(
        self,
        sent: Sequence[tuple[str, str]],
        *,
        keep_seconds: int,
        pipeline: redis.asyncio.client.Pipeline,
        entries: Mapping[str, Entry] | None = None,
    ) -> None:
        """Queue on ``pipeline``: each (job id, SES message id) ends sent and its
        sending marker is released, in one call for them all; ``entries``: job id →
        what its journal entry adds."""
        jobs = [(job_id, {"ses_message_id": message_id}) for job_id, message_id in sent]
        await self.store.finish_all(
            jobs, JobState.SENT, keep_seconds=keep_seconds, pipeline=pipeline, entries=entries
        )

    async def record_dead(
        self, job_id: str, tenant: str, reason: str, raw_body: str, *, keep_seconds: int
    ) -> None:
        """A dead letter for a job without a record (expired, lost, or an unreadable
        message that names none), with the SQS body it came in, so it can be listed
        and read."""
        await self.store.dead_letter(
            job_id,
            tenant,
            kind=MAIL_KIND,
            reason=reason,
            keep_seconds=keep_seconds,
            fields={"raw_body": raw_body[:RAW_BODY_MOST]},
        )
