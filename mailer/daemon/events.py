"""The SES event consumer: what happened to each mail after SES accepted it.

Reads ``FAIRPOST_EVENTS_QUEUE_NAME`` (an SQS standard queue fed by a
configuration set's event destination, through SNS or EventBridge:
:mod:`fairpost.mailer.daemon.ses_events` reads the bodies), finds each event's job
by the SES message id the sender recorded (:meth:`MailKeys.ses_message`; the
``fairpost-job-id`` tag when that has expired), and:

- writes the outcome on the job's record: ``delivery`` = ``delivered``,
  ``bounced`` (with ``bounce_type`` and the redacted ``diagnostic``),
  ``complained``, ``rejected`` or ``delayed``, and, in the same step, the
  event (``mail.delivered``, ``mail.bounced``, ...) in the outcome feed
  (:mod:`fairpost.mailer.sdk.outcomes.feed`), even where the record has expired;
- on a permanent bounce or a complaint, suppresses the address for that
  tenant (:mod:`fairpost.mailer.sdk.suppression`) and counts it in the tenant's
  reputation, which the guard judges (:mod:`fairpost.mailer.quota.reputation`);
- counts the recipients in the tenant's deliverability rollup, by mailbox
  provider (:mod:`fairpost.mailer.daemon.deliverability`), in the same step as the record;
- on mail SES received for an unsubscribe address (``u-<token>@`` the
  ``FAIRPOST_UNSUBSCRIBE__MAILTO_DOMAIN``), unsubscribes its token's address
  (:mod:`fairpost.mailer.daemon.unsubscriber`).

A body that cannot be read, an event for no known mail, a duplicate
delivery: logged (never an address) and counted, then deleted, so nothing
blocks the queue and nothing stops the loop. Each message is handled under one
guard (:meth:`EventConsumer._guarded`): whatever handling it raises, if Redis
still answers the fault is the event's own, and it is dropped as ``poison``
(logged, counted, deleted); a failure of Redis or the network under it leaves
the event in SQS for its next delivery, and the round backs off like any outage.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import redis.asyncio
from botocore.exceptions import BotoCoreError, ClientError
from redis.exceptions import RedisError

from fairpost.config import Settings
from fairpost.dispatcher.backoff import OutageBackoff, done_before_stop
from fairpost.dispatcher.calls import outcome_journal
from fairpost.dispatcher.history import History
from fairpost.dispatcher.journal import JournalWriter
from fairpost.dispatcher.loop import forever
from fairpost.dispatcher.replies import text, time_ms
from fairpost.mailer.daemon.aws import SqsClient
from fairpost.mailer.daemon.deliverability import DeliverabilityCounter
from fairpost.mailer.daemon.metric_labels import EVENT_OUTCOMES
from fairpost.mailer.daemon.metrics import Metrics
from fairpost.mailer.daemon.ses import redact
from fairpost.mailer.daemon.ses_events import SesEvent, parse_event
from fairpost.mailer.daemon.unsubscriber import Unsubscriber
from fairpost.mailer.quota.provider_guard import ProviderGuard
from fairpost.mailer.quota.reputation import ReputationBook
from fairpost.mailer.sdk.keys import MailKeys
from fairpost.mailer.sdk.outcomes import feed
from fairpost.mailer.sdk.rollups import counter_of
from fairpost.mailer.sdk.suppression import suppress

__all__ = ["EVENT_OUTCOMES", "OUTCOME_RANK", "EventConsumer"]

log = logging.getLogger("fairpost.events")

_DEDUP_SECONDS = 86_400
_LAST_POLL_WAIT = 1.5
_OUTAGES = (RedisError, BotoCoreError, ClientError, OSError, TimeoutError)
"""Failures of what an event is acted on with, not of the event: it waits in SQS."""
_MAX_REASON_CHARS = 2000
"""An exception's text is cut to this before redacting (redact's time grows with the text)."""

OUTCOME_RANK = ("delayed", "delivered", "rejected", "bounced", "complained")
"""SES's outcomes of a mail, least bad first: a mail's outcome only moves on, on its
record and on its line in the history. A delay is news only until the mail lands,
so a delivery replaces it, and a delay that SNS or SQS brings after the delivery
changes nothing; otherwise the worse outcome stays (several recipients may each
report one)."""
_RANK = {outcome: i for i, outcome in enumerate(OUTCOME_RANK, 1)}

_EVENT_TYPE = {
    "delayed": feed.DELAYED,
    "delivered": feed.DELIVERED,
    "rejected": feed.REJECTED,
    "bounced": feed.BOUNCED,
    "complained": feed.COMPLAINED,
}


class EventConsumer:
    def __init__(
        self,
        *,
        sqs: SqsClient,
        queue_url: str,
        client: redis.asyncio.Redis,
        keys: MailKeys,
        settings: Settings,
        book: ReputationBook,
        metrics: Metrics | None = None,
        deliverability: DeliverabilityCounter | None = None,
        provider_guard: ProviderGuard | None = None,
    ) -> None:
        """``provider_guard``: judges the tenant per provider after each bounce or complaint."""
        self.provider_guard = provider_guard
        self.sqs = sqs
        self.queue_url = queue_url
        self.redis = client
        self.keys = keys
        self.settings = settings
        self.book = book
        self.metrics = metrics or Metrics()
        self.deliverability = deliverability or DeliverabilityCounter(
            client, keys, settings, self.metrics.deliverability
        )
        self.journal = JournalWriter(client, outcome_journal(settings))
        self.history = History(client, keys)
        self.unsubscriber = Unsubscriber(settings, client)
        self.handled: dict[str, int] = {}
        """Outcome → events this consumer handled (tests wait on it)."""

    async def run(self, stop: asyncio.Event) -> None:
        async def round_() -> None:
            # A receive, a delete or Redis failing (a message's own faults stop at its
            # guard) fails the round: what it held comes back after its visibility timeout.
            await self._round(stop)

        backoff = OutageBackoff(self.settings.max_outage_seconds)
        await forever(
            "events", round_, stop, backoff=backoff, on_error=self.metrics.task_failed, described=_reason
        )

    async def _round(self, stop: asyncio.Event) -> None:
        receive = asyncio.ensure_future(
            self.sqs.receive_message(
                QueueUrl=self.queue_url,
                MaxNumberOfMessages=10,
                WaitTimeSeconds=self.settings.sender.wait_seconds,
            )
        )
        if not await done_before_stop(receive, stop):
            # Shutting down: the poll gets a moment to land (a poll cut off mid-read
            # leaves its connection to the garbage collector); what it brings is
            # left for its visibility timeout.
            await asyncio.wait({receive}, timeout=_LAST_POLL_WAIT)
            receive.cancel()
            with contextlib.suppress(BaseException):
                await receive
            return
        messages = receive.result().get("Messages", [])
        if not messages:
            return
        handled: list[dict[str, Any]] = []
        try:
            for message in messages:
                await self._guarded(message)
                handled.append(message)
        finally:
            # Should Redis fail half-way, what was acted on goes; the rest waits in SQS.
            if handled:
                entries = [{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(handled)]
                await self.sqs.delete_message_batch(QueueUrl=self.queue_url, Entries=entries)

    async def _guarded(self, message: dict[str, Any]) -> None:
        """Handle one message; returns once it may be deleted, raises if Redis is down.

        The one guard over a message: any exception from reading or acting on it
        (a body nested too deep for the JSON decoder, text Redis cannot encode, a
        shape nobody foresaw) is the event's own fault if Redis still answers, and
        the event is dropped as ``poison``. Were it left in SQS instead, it would
        fail the same way on every replica for as long as SQS keeps it."""
        sqs_message_id = str(message.get("MessageId", ""))
        try:
            await self.handle(str(message.get("Body", "")), sqs_message_id)
        except _OUTAGES:
            # Redis or the network failed under it: the event is sound, and is
            # acted on at its next delivery (a bounce must not be lost to a blip).
            raise
        except Exception as exc:
            # Counting it writes to Redis first: that raises while Redis is down or
            # refuses writes, and then the fault is not the event's.
            await self._counted("poison")
            log.error("SES event dropped as poison (SQS message %s): %s", sqs_message_id, _reason(exc))

    async def handle(self, body: str, sqs_message_id: str = "") -> str:
        """Act on one event body; returns its outcome (one of :data:`EVENT_OUTCOMES`)."""
        try:
            event = parse_event(body)
        except ValueError as exc:
            log.warning("unreadable SES event dropped (SQS message %s): %s", sqs_message_id, exc)
            return await self._counted("unparseable")
        if event.kind == "other":
            return await self._counted("ignored")
        seen = self.keys.ses_event(event.event_id)
        if await self.redis.exists(seen):
            return await self._counted("duplicate")
        if event.kind == "received":
            # Mail to an unsubscribe address (receipt rule → SNS → this queue).
            tokens = [t for t in map(self.unsubscriber.mailto_token, event.recipients) if t is not None]
            for token in tokens:
                await self.unsubscriber.apply(token, whole_tenant=False, source="mailto")
            await self.redis.set(seen, "1", ex=_DEDUP_SECONDS)
            return await self._counted("received" if tokens else "ignored")
        job_id, tenant, state, kept = await self._match(event)
        if job_id is None or tenant is None:
            log.warning(
                "SES %s event for no known mail dropped (SES message %s)", event.kind, event.message_id
            )
            return await self._counted("unmatched")
        await self._act(event, job_id, tenant, record_exists=state is not None and not kept, kept=kept)
        # Marked seen only once acted on: a round that failed half-way comes back from
        # SQS and acts again (suppressing is idempotent; a count may go in twice, the
        # strict side), rather than being dropped as a duplicate.
        await self.redis.set(seen, "1", ex=_DEDUP_SECONDS)
        return await self._counted(event.kind)

    async def _match(self, event: SesEvent) -> tuple[str | None, str | None, str | None, dict[str, str]]:
        """The job, its tenant, its state (None: neither its record nor its line in
        the history is left) and, once its record has expired, what its line keeps."""
        raw = await self.redis.get(self.keys.ses_message(event.message_id))
        job_id = text(raw) if raw is not None else event.job_id
        if job_id is None:
            return None, None, None, {}
        tenant, state = await self.redis.hmget(self.keys.job(job_id), ["tenant", "state"])
        kept = await self.history.record(job_id) if state is None else {}
        if kept:
            tenant, state = kept["tenant"], kept["state"]
        return (
            job_id,
            text(tenant) if tenant is not None else event.tenant,
            None if state is None else text(state),
            kept,
        )

    async def _act(
        self, event: SesEvent, job_id: str, tenant: str, *, record_exists: bool, kept: dict[str, str]
    ) -> None:
        at_ms = time_ms(await self.redis.time())  # every stored time is Redis time
        outcome = {
            "bounce": "bounced",
            "complaint": "complained",
            "delivery": "delivered",
            "reject": "rejected",
            "delivery_delay": "delayed",
        }[event.kind]
        extra = {"job_id": job_id, "tenant": tenant}
        counter = counter_of(_EVENT_TYPE[outcome], event.bounce_type)
        rolled = await self.deliverability.counts(counter, event.recipients) if counter else {}
        # The outcome on the record, its event in the feed and its count in the
        # tenant's deliverability rollup: one step.
        async with self.redis.pipeline(transaction=True) as pipe:
            if record_exists:
                await self._record_outcome(pipe, job_id, outcome, event, at_ms)
            # On the mail's line in the history too (if it has one), which answers
            # status() once the record has expired.
            delivery, bounce = ("delivery", outcome), {"bounce_type": event.bounce_type or ""}
            await self.history.outcome(job_id, delivery, OUTCOME_RANK, also=bounce, client=pipe)
            given = feed.entry(
                _EVENT_TYPE[outcome], _event_data(event), tenant=None if record_exists else tenant
            )
            await self.journal.append(self.keys.job(job_id), job_id, given, pipeline=pipe)
            if rolled:
                await self.deliverability.queue(pipe, tenant, rolled)
            await pipe.execute()
        self.deliverability.counted(tenant, rolled)
        if event.kind == "bounce":
            log.info(
                "SES reports a %s bounce (%s): %s",
                event.bounce_type or "",
                event.bounce_subtype or "",
                event.diagnostic or "no diagnostic",
                extra=extra,
            )
            if event.permanent:
                await suppress(self.redis, self.keys, tenant, event.recipients, "bounce", at_ms)
                seq = kept.get("send_seq") or await self.redis.hget(self.keys.job(job_id), "send_seq")
                await self.book.record(
                    tenant,
                    bounces=max(1, len(event.recipients)),
                    bounced=(job_id, int(seq) if seq is not None else 0),
                )
        elif event.kind == "complaint":
            log.info("SES reports a complaint", extra=extra)
            await suppress(self.redis, self.keys, tenant, event.recipients, "complaint", at_ms)
            await self.book.record(tenant, complaints=max(1, len(event.recipients)))
        elif event.kind == "reject":
            log.warning("SES rejected the mail after accepting it: %s", event.diagnostic or "", extra=extra)
        if self.provider_guard is not None and (event.permanent or event.kind == "complaint"):
            # Counted in the rollup above: the guard judges the tenant's providers on it.
            await self.provider_guard.judge(tenant)

    async def _record_outcome(
        self, pipe: redis.asyncio.client.Pipeline, job_id: str, outcome: str, event: SesEvent, at_ms: int
    ) -> None:
        """Queue on ``pipe`` the outcome's fields on the record, unless it has a worse one."""
        key = self.keys.job(job_id)
        current = await self.redis.hget(key, "delivery")
        if current is not None and _RANK.get(text(current), 0) > _RANK[outcome]:
            return
        fields: dict[Any, Any] = {"delivery": outcome, "delivery_ms": at_ms}
        if event.kind == "bounce":
            fields["bounce_type"] = event.bounce_type or ""
            fields["bounce_subtype"] = event.bounce_subtype or ""
        if event.diagnostic:
            fields["diagnostic"] = event.diagnostic
        pipe.hset(key, mapping=fields)

    async def _counted(self, outcome: str) -> str:
        await self.redis.hincrby(self.keys.events_seen(), outcome, 1)
        self.handled[outcome] = self.handled.get(outcome, 0) + 1
        self.metrics.ses_event(outcome)
        return outcome


def _event_data(event: SesEvent) -> dict[str, Any]:
    """The event's own fields in the feed (docs/outcomes.md); addresses go to the
    tenant's consumers only, never into a log."""
    data: dict[str, Any] = {"ses_message_id": event.message_id}
    if event.kind == "bounce":
        data["bounce_type"] = event.bounce_type
        data["bounce_subtype"] = event.bounce_subtype
    if event.kind != "reject":
        data["recipients"] = list(event.recipients)
    if event.kind != "complaint":
        data["diagnostic"] = event.diagnostic
    return data


def _reason(exc: BaseException) -> str:
    """What failed, for a log line: no address, and nothing a log stream cannot encode."""
    reason = redact(f"{type(exc).__name__}: {str(exc)[:_MAX_REASON_CHARS]}")
    return reason.encode("ascii", "backslashreplace").decode("ascii")
