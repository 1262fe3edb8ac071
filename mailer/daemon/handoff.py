"""The mail worker: hands claimed mail jobs to the SQS FIFO queue.

``MessageGroupId`` is the tenant (its notification mail: ``<tenant>:notification``,
fairpost.mailer.sdk.streams.group_id), so SQS serves each tenant's mail in order
and a paused tenant pauses alone; ``MessageDeduplicationId`` is the job id,
so a job handed off twice (a lease that ran out mid-call) is stored once
(a replayed dead letter gets ``<job id>-r<replays>``: a new life, a new id).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence

from fairpost.dispatcher.jobs import Job
from fairpost.dispatcher.worker import Dead, HandedOff, Later, Outcome, Requeue
from fairpost.mailer.daemon.aws import SqsClient
from fairpost.mailer.daemon.metrics import Metrics
from fairpost.mailer.daemon.provider_holds import ProviderHolds
from fairpost.mailer.daemon.tracing import Tracing
from fairpost.mailer.errors import NewerFormat, PoisonMessage
from fairpost.mailer.sdk import envelope
from fairpost.mailer.sdk.client import MAIL_KIND
from fairpost.mailer.sdk.streams import group_id, payload_stream

log = logging.getLogger("fairpost.handoff")

SQS_MAX_BATCH = 10
SQS_MAX_BATCH_BYTES = 1024 * 1024
_PARTIAL_RETRIES = 3


class MailWorker:
    kind = MAIL_KIND
    max_batch = SQS_MAX_BATCH

    def __init__(
        self,
        sqs: SqsClient,
        queue_url: str,
        *,
        metrics: Metrics | None = None,
        tracing: Tracing | None = None,
        provider_holds: ProviderHolds | None = None,
    ) -> None:
        """``provider_holds``: the per-provider guard's holds; a held mail is not handed
        off but scheduled again (fairpost.mailer.daemon.provider_holds)."""
        self.provider_holds = provider_holds
        self.sqs = sqs
        self.queue_url = queue_url
        self.metrics = metrics or Metrics()
        self.tracing = tracing
        """A span for each SendMessageBatch (mailer/daemon/tracing.py); None: untraced."""

    async def handle(self, jobs: Sequence[Job]) -> Sequence[Outcome]:
        later = await self._held(jobs)
        if not later:
            return await self.hand_off(jobs)
        handed = iter(await self.hand_off([j for j in jobs if j.id not in later]))
        return [later[j.id] if j.id in later else next(handed) for j in jobs]

    async def _held(self, jobs: Sequence[Job]) -> dict[str, Outcome]:
        """The jobs held for their recipients' provider, each as it waits (not handed off)."""
        holds = self.provider_holds
        if holds is None or not holds.enabled:
            return {}
        later: dict[str, Outcome] = {}
        for job in jobs:
            held = await holds.tenant_holds(job.tenant)
            if not held:
                continue
            try:
                mail = envelope.decode(envelope.encode(job.id, job.tenant, job.created_ms, job.payload)).mail
            except (PoisonMessage, NewerFormat):
                continue  # handed off: the sender ends it as it ends any such message
            hold = await holds.blocking(held, mail.to + mail.cc + mail.bcc)
            if hold is not None:
                later[job.id] = Later(holds.recheck_seconds, hold.waiting_for, holds.event(hold))
                self.metrics.throttled(job.tenant, hold.waiting_for, 1)
        return later

    async def hand_off(self, jobs: Sequence[Job], *, again: Mapping[str, int] | None = None) -> list[Outcome]:
        """Send the jobs to SQS; ``again``: job id → how many times the reconciler has
        handed it over again (mailer/daemon/reconcile.py), for a dedup id of its own."""
        outcomes: dict[str, Outcome] = {}
        entries: dict[str, dict[str, str]] = {}
        for job in jobs:
            body = envelope.encode(job.id, job.tenant, job.created_ms, job.payload)
            if len(body.encode()) > SQS_MAX_BATCH_BYTES:
                outcomes[job.id] = Dead(
                    f"mail of {len(body.encode())} bytes is over SQS's 1 MiB message limit"
                )
                continue
            entries[job.id] = {
                "Id": job.id,
                "MessageBody": body,
                # The tenant's notification mail has a group of its own: a FIFO group
                # is served in order, and transactional mail must not wait behind it.
                "MessageGroupId": group_id(job.tenant, payload_stream(job.payload)),
                # A replayed job is a new hand-off: SQS must not drop it as a
                # duplicate of its first life's message (5-minute dedup window).
                "MessageDeduplicationId": _dedup_id(job, (again or {}).get(job.id, 0)),
            }
        failure: str | None = None
        for batch in _batches(list(entries.values())):
            if failure is not None:
                # SQS is failing: the rest waits in Redis for the dispatcher's retry.
                outcomes.update({entry["Id"]: Requeue(failure) for entry in batch})
                continue
            if self.tracing is None:
                sent, failure = await self._send_batch(batch)
            else:
                sent, failure = await self._traced_batch(self.tracing, batch, jobs)
            outcomes.update(sent)
        # Counted a tenant at a time: a hand-off is mostly one tenant's ten (#41).
        handed: dict[str, int] = {}
        for job in jobs:
            outcome = outcomes[job.id]
            if isinstance(outcome, HandedOff):
                handed[job.tenant] = handed.get(job.tenant, 0) + 1
            elif isinstance(outcome, Dead):
                self.metrics.dead(job.tenant, "sqs_rejected" if job.id in entries else "too_large")
        for tenant, count in handed.items():
            self.metrics.dispatched(tenant, count)
        return [outcomes[job.id] for job in jobs]

    async def _traced_batch(
        self, tracing: Tracing, batch: list[dict[str, str]], jobs: Sequence[Job]
    ) -> tuple[dict[str, Outcome], str | None]:
        ids = {entry["Id"] for entry in batch}
        span = tracing.handoff(
            self.queue_url.rsplit("/", 1)[-1], [(j.id, j.tenant, j.payload) for j in jobs if j.id in ids]
        )
        try:
            sent, failure = await self._send_batch(batch)
        except BaseException as exc:
            span.end(0, 0, type(exc).__name__)
            raise
        handed = sum(isinstance(outcome, HandedOff) for outcome in sent.values())
        # SQS's own words about a failure are logged; the span keeps that it failed.
        span.end(handed, len(batch) - handed, None if failure is None else "SendMessageBatch failed")
        return sent, failure

    async def _send_batch(self, batch: list[dict[str, str]]) -> tuple[dict[str, Outcome], str | None]:
        """Send, retrying only the entries that failed, a few times.

        A call that raises (SQS unreachable, a timeout) ends the batch: what an
        earlier call of it placed stays handed off, the rest is retried later;
        the error is returned so that the caller sends no further batch now.
        Raising instead would send every job of the hand-off back to Redis,
        those already in SQS too, to be handed off and sent a second time.
        """
        outcomes: dict[str, Outcome] = {}
        pending = batch
        for attempt in range(_PARTIAL_RETRIES):
            try:
                response = await self.sqs.send_message_batch(QueueUrl=self.queue_url, Entries=pending)
            except Exception as exc:
                failure = f"SQS SendMessageBatch failed: {type(exc).__name__}: {exc}"
                log.warning("%s; %d of %d entries go back to Redis", failure, len(pending), len(batch))
                outcomes.update({entry["Id"]: Requeue(failure) for entry in pending})
                return outcomes, failure
            for ok in response.get("Successful", []):
                outcomes[ok["Id"]] = HandedOff()
            failed = response.get("Failed", [])
            retry_ids = set()
            for fail in failed:
                reason = f"SQS {fail.get('Code')}: {fail.get('Message', '')}"
                if fail.get("SenderFault"):
                    # The entry itself is wrong (too big, bad characters): it can never go.
                    outcomes[fail["Id"]] = Dead(reason)
                else:
                    outcomes[fail["Id"]] = Requeue(reason)
                    retry_ids.add(fail["Id"])
            pending = [entry for entry in pending if entry["Id"] in retry_ids]
            if not pending:
                break
            log.warning("SQS refused %d of %d entries; retrying them", len(pending), len(batch))
            await asyncio.sleep(0.1 * 2**attempt)
        return outcomes, None


def _dedup_id(job: Job, again: int) -> str:
    dedup = f"{job.id}-r{job.replays}" if job.replays else job.id
    # Handed over again because SQS lost the first message: a new message too.
    return f"{dedup}-a{again}" if again else dedup


def _batches(entries: list[dict[str, str]]) -> list[list[dict[str, str]]]:
    """At most 10 entries and 1 MiB per SendMessageBatch."""
    batches: list[list[dict[str, str]]] = []
    current: list[dict[str, str]] = []
    size = 0
    for entry in entries:
        entry_size = len(entry["MessageBody"].encode())
        if current and (len(current) == SQS_MAX_BATCH or size + entry_size > SQS_MAX_BATCH_BYTES):
            batches.append(current)
            current, size = [], 0
        current.append(entry)
        size += entry_size
    if current:
        batches.append(current)
    return batches
