"""What the sender asks and tells about reputation, in one place.

- :meth:`Feedback.screen`: drop the recipients on the tenant's suppression
  list before anything is counted or sent; a mail left with none ends
  ``suppressed`` (counted, never sent, never counted against its quota).
- :meth:`Feedback.index_sent` / :meth:`Feedback.queue_count_sent`: SES accepted
  mail: remember its SES message id (events find their job by it) and count
  its recipients in the tenant's reputation windows.
- :meth:`Feedback.sent_counts` / :meth:`Feedback.queue_sent`: the sends in the
  tenant's deliverability rollup and the send history (:mod:`.deliverability`).
- :meth:`Feedback.send_failed` / :meth:`Feedback.disabled_now`: a send naming
  the tenant failed: was it SES disabling the tenant's SES tenant?

Whether a tenant is held (its SES tenant disabled among other reasons) is
asked of fairpost.mailer.daemon.holds.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import redis.asyncio
from redis.exceptions import RedisError

from fairpost.config import Settings
from fairpost.dispatcher.calls import journal_of
from fairpost.dispatcher.journal import JournalWriter
from fairpost.dispatcher.loop import OnError
from fairpost.dispatcher.replies import Queued
from fairpost.dispatcher.scripts import lua_source
from fairpost.dispatcher.store import JobStore
from fairpost.mailer.daemon.aws import SesClient, SqsClient
from fairpost.mailer.daemon.deliverability import Counts, DeliverabilityCounter
from fairpost.mailer.daemon.events import EventConsumer
from fairpost.mailer.daemon.mail_jobs import MailState
from fairpost.mailer.daemon.metrics import Metrics
from fairpost.mailer.daemon.mx import Lookup
from fairpost.mailer.daemon.ses_tenant_status import SesTenantStatus
from fairpost.mailer.quota.provider_guard import ProviderGuard, ProviderHold
from fairpost.mailer.quota.reputation import ReputationBook
from fairpost.mailer.sdk.envelope import Envelope
from fairpost.mailer.sdk.keys import MailKeys, mail_keys
from fairpost.mailer.sdk.outcomes import feed
from fairpost.mailer.sdk.suppression import ask_suppressed_among, suppressed_among

__all__ = ["Feedback", "ReputationParts", "build", "uses_ses_tenants"]

log = logging.getLogger("fairpost.sender")


class _Message(Protocol):
    envelope: Envelope | None


M = TypeVar("M", bound=_Message)


class Feedback:
    def __init__(
        self,
        *,
        store: JobStore,
        settings: Settings,
        book: ReputationBook,
        status: SesTenantStatus | None = None,
        metrics: Metrics | None = None,
        deliverability: DeliverabilityCounter | None = None,
    ) -> None:
        self.store = store
        self.redis: redis.asyncio.Redis = store.redis
        self.keys: MailKeys = mail_keys(store.keys)
        self.settings = settings
        self.book = book
        self.status = status
        self.metrics = metrics or Metrics()
        self.deliverability = deliverability or DeliverabilityCounter(
            store.redis, self.keys, settings, self.metrics.deliverability
        )
        self._send_seq = store.redis.register_script(lua_source("fairpost.mailer.quota", "send_seq"))
        self.journal = JournalWriter(store.redis, journal_of(store.keys, store.limits))

    def ask_suppressed(
        self, pipe: redis.asyncio.client.Pipeline, tenant: str, envelopes: Sequence[Envelope]
    ) -> Queued[set[str]]:
        """Queue on ``pipe`` the read :meth:`screen` makes (which of these mails'
        recipients are on the tenant's list), to be read with other things in one
        round trip. The recipients' MX lookups start here, while the mail is on its way."""
        self.deliverability.warm(a for env in envelopes for a in _recipients(env))
        return ask_suppressed_among(
            pipe, self.keys, tenant, (a for env in envelopes for a in _recipients(env))
        )

    async def screen(self, tenant: str, messages: list[M], suppressed: set[str] | None = None) -> list[M]:
        """The messages still to send, their suppressed recipients dropped; a mail
        with none left is finished ``suppressed`` and left out (its message is the caller's to delete).
        ``suppressed``: the addresses on the tenant's list among theirs, when read already
        (:meth:`ask_suppressed`)."""
        if suppressed is None:
            addresses = [a for m in messages if m.envelope for a in _recipients(m.envelope)]
            suppressed = await suppressed_among(self.redis, self.keys, tenant, addresses)
        if not suppressed:
            return messages
        kept: list[M] = []
        dropped_all: list[str] = []
        for msg in messages:
            env = msg.envelope
            assert env is not None
            mail = env.mail
            to, cc, bcc = (
                tuple(a for a in part if a not in suppressed) for part in (mail.to, mail.cc, mail.bcc)
            )
            gone = [a for a in _recipients(env) if a in suppressed]
            dropped = len(gone)
            if dropped == 0:
                kept.append(msg)
                continue
            dropped_all += gone
            self.metrics.suppressed(tenant, dropped)
            extra = {"job_id": env.job_id, "tenant": tenant}
            partial = bool(to or cc or bcc)
            event = feed.entry(feed.SUPPRESSED, {"recipients": gone, "partial": partial})
            if partial:
                msg.envelope = dataclasses.replace(env, mail=dataclasses.replace(mail, to=to, cc=cc, bcc=bcc))
                # The count on the record and its event in the feed: one step.
                async with self.redis.pipeline(transaction=True) as pipe:
                    pipe.hset(self.keys.job(env.job_id), "suppressed", dropped)
                    await self.journal.append(self.keys.job(env.job_id), env.job_id, event, pipeline=pipe)
                    await pipe.execute()
                log.info("%d suppressed recipients dropped", dropped, extra=extra)
                kept.append(msg)
                continue
            await self.store.finish(
                env.job_id,
                MailState.SUPPRESSED,
                keep_seconds=self.settings.job_ttl,
                fields={"suppressed": dropped},
                entry=event,
            )
            log.info("mail not sent: every recipient is suppressed for the tenant", extra=extra)
        await self._count(tenant, "suppressed", dropped_all)
        return kept

    async def _count(self, tenant: str, counter: str, addresses: list[str]) -> None:
        """Count recipients in the tenant's rollup, one call; a Redis error is logged,
        not raised (the mails' own records are written already)."""
        counts = await self.deliverability.counts(counter, addresses)
        if not counts:
            return
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                await self.deliverability.queue(pipe, tenant, counts)
                await pipe.execute()
        except RedisError as exc:
            log.warning("%s not counted for deliverability: %s", counter, exc, extra={"tenant": tenant})
            return
        self.deliverability.counted(tenant, counts)

    async def sent_counts(self, envelopes: Sequence[Envelope]) -> Counts:
        """The sent mails' recipients by provider, for :meth:`queue_sent` (looked up
        before the pipeline that records them, so a retry of it looks up nothing)."""
        return await self.deliverability.counts("sent", (a for e in envelopes for a in _recipients(e)))

    async def queue_sent(
        self, pipe: redis.asyncio.client.Pipeline, tenant: str, counts: Counts, recipients: int
    ) -> None:
        """Queue on the sender's pipeline the sends in the rollup and the send history:
        one script call per group; :meth:`counted` once the pipeline ran."""
        await self.deliverability.queue(pipe, tenant, counts, sent_now=recipients)

    def counted(self, tenant: str, counts: Counts) -> None:
        self.deliverability.counted(tenant, counts)

    async def index_sent(
        self, pipe: redis.asyncio.client.Pipeline, tenant: str, sent: Sequence[tuple[str, str | None, int]]
    ) -> None:
        """Queue, on the sender's pipeline, what lets SES events find each sent job (its
        SES message id) and place it among the tenant's sends (its send number): a
        group's ``(job id, SES message id, recipients)``, in send order, in one call."""
        if not self.settings.events_queue_name:
            return
        keys = [self.keys.send_seq(tenant)]
        ttl = self.settings.job_ttl
        args: list[str | int] = [ttl * 1000, min(ttl, self.settings.ses_index_ttl)]
        for job_id, message_id, recipients in sent:
            if message_id:
                keys += [self.keys.job(job_id), self.keys.ses_message(message_id)]
                args += [recipients, job_id]
        if len(keys) > 1:
            await self._send_seq(keys=keys, args=args, client=pipe)

    async def queue_count_sent(
        self, pipe: redis.asyncio.client.Pipeline, tenant: str, recipients: int
    ) -> bool:
        """Queue on the sender's pipeline, after the sent mails' records, the count of
        their recipients in the tenant's reputation windows (one script call a group,
        not a round trip of its own); True if queued (one reply, for :meth:`counted_sent`)."""
        if recipients <= 0:
            return False
        await self.book.queue_sends(pipe, tenant, recipients)
        return True

    async def counted_sent(self, tenant: str, recipients: int, reply: Any) -> None:
        """The guard judges the tenant on :meth:`queue_count_sent`'s ``reply``. A Redis
        error here is logged, not raised: the mail is recorded sent already, and a
        missed count errs on the strict side (rates a little high)."""
        try:
            if isinstance(reply, Exception):
                raise reply
            await self.book.judged(self.book.reputation(tenant, reply), sends=recipients)
        except RedisError as exc:
            log.warning("sends not counted for reputation: %s", exc, extra={"tenant": tenant})

    def send_failed(self, tenant: str) -> None:
        if self.status is not None:
            self.status.send_failed(tenant)

    async def disabled_now(self, tenant: str) -> bool:
        """SES refused a send naming the tenant as paused: is it the tenant's SES tenant
        (then only the tenant waits), rather than the account?"""
        if self.status is None or not self.settings.ses_tenant_for(tenant):
            return False
        verdict = await self.status.check(tenant)
        return verdict is not None and verdict.disabled


def _recipients(env: Envelope) -> tuple[str, ...]:
    return env.mail.to + env.mail.cc + env.mail.bcc


@dataclass
class ReputationParts:
    """Everything reputation adds to a sender process, built once (:func:`build`)."""

    book: ReputationBook
    feedback: Feedback
    status: SesTenantStatus | None
    """With SES tenants in use: SES's verdict on them (task ``ses-tenants``)."""
    events: EventConsumer | None
    """With ``FAIRPOST_EVENTS_QUEUE_NAME``: the SES event consumer (task ``events``)."""
    provider_guard: ProviderGuard | None = None
    """With ``FAIRPOST_REPUTATION__PER_PROVIDER``: the guard per provider (task
    ``provider-guard`` judges its held tenants again on schedule)."""
    on_error: OnError | None = None

    def tasks(self, stop: asyncio.Event) -> dict[str, asyncio.Task[None]]:
        tasks = {}
        if self.provider_guard is not None:
            tasks["provider-guard"] = asyncio.create_task(
                self.provider_guard.run(stop, self.on_error), name="provider-guard"
            )
        if self.status is not None:
            tasks["ses-tenants"] = asyncio.create_task(self.status.run(stop), name="ses-tenants")
        if self.events is not None:
            tasks["events"] = asyncio.create_task(self.events.run(stop), name="events")
        return tasks


def uses_ses_tenants(settings: Settings) -> bool:
    """Whether any tenant's mail names an SES tenant (whose status is then obeyed)."""
    return settings.ses_tenant_names != "configured" or any(
        t.ses_tenant_name for t in settings.tenants.values()
    )


async def build(
    *,
    settings: Settings,
    store: JobStore,
    sqs: SqsClient,
    ses_client: SesClient,
    metrics: Metrics,
    refresh_limits: Callable[[], Awaitable[Any]] | None = None,
    lifted: Callable[[str], Awaitable[Any]] | None = None,
    mx_lookup: Lookup | None = None,
) -> ReputationParts:
    """``refresh_limits``: re-read the live overrides now (the guard just paused or
    throttled a tenant: this replica acts on it at once, not at the next refresh);
    ``lifted``: a tenant's hold was lifted (SES enabled its SES tenant again), the one
    event of fairpost.mailer.daemon.holds.Holds.changed; ``mx_lookup``: how recipients' MX
    records are looked up (DNS by default, :mod:`.mx`)."""

    async def acted(tenant: str, action: str) -> None:
        metrics.guard_action(tenant, action)
        if refresh_limits is not None:
            await refresh_limits()

    keys = mail_keys(store.keys)
    book = ReputationBook(store.redis, keys, settings, on_action=acted)
    provider_guard = None
    if settings.reputation.per_provider:

        async def provider_acted(tenant: str, action: str, hold: ProviderHold) -> None:
            metrics.guard_action(tenant, action)

        provider_guard = ProviderGuard(store.redis, keys, settings, on_action=provider_acted)
    deliverability = DeliverabilityCounter(
        store.redis, keys, settings, metrics.deliverability,
        tenant_label=metrics.labels, lookup=mx_lookup,
    )  # fmt: skip
    status = None
    if uses_ses_tenants(settings):
        status = SesTenantStatus(ses_client, store.redis, keys, settings, on_enabled=lifted, metrics=metrics)
    events = None
    if settings.events_queue_name:
        url = (await sqs.get_queue_url(QueueName=settings.events_queue_name))["QueueUrl"]
        events = EventConsumer(
            sqs=sqs, queue_url=url, client=store.redis, keys=keys, settings=settings, book=book,
            metrics=metrics, deliverability=deliverability, provider_guard=provider_guard,
        )  # fmt: skip
    feedback = Feedback(
        store=store, settings=settings, book=book, status=status, metrics=metrics,
        deliverability=deliverability,
    )  # fmt: skip
    return ReputationParts(book, feedback, status, events, provider_guard, metrics.task_failed)
