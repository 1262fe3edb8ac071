"""How a received mail ends dead: the reason kept on its job, its message to be deleted.

A mail SES refused, one that failed too often, one whose content is gone, or
an SQS body this fairpost cannot read: each becomes a dead letter an
operator can list and replay (``fairpost dead``), never a silent loss.
"""

from __future__ import annotations

import json
import logging

from fairpost.dispatcher.jobs import JobState
from fairpost.mailer.daemon.context import SenderContext
from fairpost.mailer.daemon.inbox import Received
from fairpost.mailer.daemon.settlement import Backoff, Delete
from fairpost.mailer.errors import NewerFormat, PoisonMessage
from fairpost.mailer.sdk.envelope import decode
from fairpost.mailer.sdk.streams import tenant_of_group

log = logging.getLogger("fairpost.sender")

NEWER_FORMAT_SECONDS = 5.0
"""How long a body in a newer format than this fairpost reads waits in SQS before it
is received again: long enough that replicas of this release do not spin on it,
short enough that a newer replica takes it soon after (a rolling upgrade)."""


class Endings:
    def __init__(self, ctx: SenderContext) -> None:
        self.ctx = ctx

    async def dead(self, msg: Received, reason: str, kind: str) -> Delete:
        """Ends the mail's job dead; its message's settlement is returned for the caller
        to decide. ``kind`` is the metrics label (fairpost.mailer.daemon.metrics.DEAD_REASONS)."""
        assert msg.envelope is not None
        env = msg.envelope
        ctx = self.ctx
        result = await ctx.store.finish(
            env.job_id,
            JobState.DEAD,
            keep_seconds=ctx.finished_ttl,
            fields={"dead_reason": reason, "last_error": reason},
        )
        if result == -1:
            # No record (expired, or the Redis lost it): keep the mail as a dead letter anyway.
            await self._record_dead(env.job_id, env.tenant, reason, msg.body)
        if msg.trace is not None:
            msg.trace.dead(kind)
        ctx.stats.dead += 1
        ctx.metrics.dead(env.tenant, kind)
        log.warning("dead letter: %s", reason, extra={"job_id": env.job_id, "tenant": env.tenant})
        return Delete("dead")

    async def unreadable(self, msg: Received) -> Delete | Backoff:
        """A body this fairpost could not decode: left in SQS if a newer fairpost wrote
        it (:meth:`newer`), else a poison message (:meth:`poison`)."""
        try:
            decode(msg.body)
        except NewerFormat as exc:
            return self.newer(msg, exc)
        except PoisonMessage as exc:
            return await self.poison(msg, str(exc))
        return await self.poison(msg, "unreadable")  # pragma: no cover - only undecodable bodies come here

    def newer(self, msg: Received, exc: NewerFormat) -> Backoff:
        """A body a newer fairpost wrote: never deleted nor dead-lettered here, but left
        in SQS (its visibility a few seconds) for a replica that reads it, counted
        and logged with both versions. Its job keeps its state ("dispatched")."""
        self.ctx.metrics.newer_format(exc.what, exc.found, exc.reads)
        log.warning(
            "SQS message %s: %s in format version %d, this fairpost reads up to %d: "
            "left in SQS for a newer fairpost",
            msg.message_id, exc.what, exc.found, exc.reads, extra={"tenant": tenant_of_group(msg.group)},
        )  # fmt: skip
        return Backoff(NEWER_FORMAT_SECONDS, "newer format")

    async def poison(self, msg: Received, reason: str) -> Delete:
        """An SQS body this fairpost cannot read."""
        ctx = self.ctx
        why = f"unreadable SQS message: {reason}"
        # A body this fairpost cannot read may still name its job (an envelope
        # from a newer fairpost, say): then that job ends dead, not lost in
        # "dispatched", and keeps its slot no longer.
        named = _job_id_in(msg.body)
        job_id = named or f"poison-{msg.message_id}"
        finished = -1
        if named:
            finished = await ctx.store.finish(
                named,
                JobState.DEAD,
                keep_seconds=ctx.finished_ttl,
                fields={"dead_reason": why, "last_error": why, "raw_body": msg.body[:262_144]},
            )
        # The message's FIFO group names its tenant (a notification's: <tenant>:notification).
        tenant = tenant_of_group(msg.group)
        if finished == -1:
            job_id = f"poison-{msg.message_id}"
            await self._record_dead(job_id, tenant, why, msg.body)
        ctx.stats.dead += 1
        ctx.metrics.dead(tenant, "poison")
        log.error("poison message dead-lettered: %s", reason, extra={"job_id": job_id, "tenant": tenant})
        return Delete("poison")

    async def _record_dead(self, job_id: str, tenant: str, reason: str, raw_body: str) -> None:
        await self.ctx.mail.record_dead(job_id, tenant, reason, raw_body, keep_seconds=self.ctx.finished_ttl)


def _job_id_in(body: str) -> str | None:
    """The job id an unreadable envelope still carries, if any."""
    try:
        data = json.loads(body)
    except ValueError:
        return None
    job_id = data.get("job_id") if isinstance(data, dict) else None
    return job_id if isinstance(job_id, str) and job_id and len(job_id) <= 128 else None
