"""The SDK: applications enqueue mail with :class:`MailClient` or :class:`AsyncMailClient`.

Both validate every mail before writing anything, and write each job (its
record and its place in the tenant's queue) in one atomic step. While Redis is
away (a restart, a failover) each call is tried again for up to
``FAIRPOST_REDIS_RETRY_SECONDS`` (:mod:`fairpost.mailer.sdk.failures`): the job ids are
made before the first try, so a try whose answer was lost is not written twice.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime

import redis
import redis.asyncio

from fairpost.config import Settings, load_settings
from fairpost.config.limits import budget_exceeded
from fairpost.config.pools import DEFAULT_POOL
from fairpost.dispatcher.jobs import NewJob, check_priority
from fairpost.dispatcher.redis_memory import PolicyOnce
from fairpost.mailer.errors import InvalidMail, UnknownJob
from fairpost.mailer.sdk.attachments import Attachment
from fairpost.mailer.sdk.compose import mail_job
from fairpost.mailer.sdk.connection import AsyncRedisOwner, RedisOwner, timeouts
from fairpost.mailer.sdk.dead import DeadLetters
from fairpost.mailer.sdk.failures import RedisFailures
from fairpost.mailer.sdk.keys import MailKeys
from fairpost.mailer.sdk.mail import Mail, check_tenant_id
from fairpost.mailer.sdk.outcomes.endpoints import Webhooks
from fairpost.mailer.sdk.outcomes.stream import AsyncEventReader, EventReader, Start
from fairpost.mailer.sdk.pool_admin import Pools
from fairpost.mailer.sdk.pools import AsyncRoute, AsyncRoutes, SyncRoute, SyncRoutes
from fairpost.mailer.sdk.status import JobStatus
from fairpost.mailer.sdk.streams import TRANSACTIONAL
from fairpost.mailer.sdk.suppression import Suppressions
from fairpost.mailer.sdk.tracing import Creating
from fairpost.mailer.sdk.unsubscribes import Unsubscribes

__all__ = ["MAIL_KIND", "AsyncMailClient", "MailClient"]

MAIL_KIND = "mail"


class BaseMailClient:
    """What :class:`MailClient` and :class:`AsyncMailClient` share, none of it I/O:
    checking each mail and building its jobs, and reading a status record."""

    settings: Settings

    @property
    def _failures(self) -> RedisFailures:
        """Turns a redis-py error into :class:`RedisFailed` naming the call."""
        return RedisFailures(self.settings)

    def _jobs(
        self,
        settings: Settings,
        tenant_id: str,
        mails: Iterable[Mail | Mapping[str, object]],
        priority: str,
        *,
        many: bool,
        send_at: datetime | None = None,
    ) -> list[NewJob]:
        """Every mail checked (the first broken rule raises :class:`InvalidMail`
        naming it), then its job built for the pool ``settings`` describe; nothing written."""
        tenant = check_tenant_id(tenant_id)
        try:
            check_priority(priority)
        except ValueError as exc:
            raise InvalidMail("priority", str(exc)) from None
        keys = MailKeys(settings.key_prefix)
        jobs = []
        default_sender = settings.tenant(tenant).default_sender
        for index, item in enumerate(mails):
            mail = _mail_from(item, index)
            if not mail.sender and default_sender:
                # The tenant's default_sender (FAIRPOST_TENANTS) fills a mail sent without one.
                mail = dataclasses.replace(mail, sender=default_sender)
            # Validation, send options and where the content goes: fairpost.mailer.sdk.compose.
            prefix = f"mails[{index}]." if many else ""
            job = mail_job(
                settings,
                keys,
                tenant,
                mail,
                priority=priority,
                kind=MAIL_KIND,
                prefix=prefix,
                send_at=send_at,
            )
            _check_fits(settings, tenant, int((job.fields or {})["recipients"]), prefix)
            jobs.append(job)
        return jobs


def _check_fits(settings: Settings, tenant: str, recipients: int, prefix: str) -> None:
    """A mail over a budget window's limit (the settings' limits) could never be sent:
    refuse it now rather than dead-letter it later. Live overrides are the daemon's to apply."""
    scopes = [("tenant", settings.limits_for(tenant))]
    if not isinstance(settings.global_limits, str):  # "auto": known only to the daemon
        scopes.append(("global", settings.global_limits))
    for scope, windows in scopes:
        window = budget_exceeded(recipients, windows)
        if window is not None:
            raise InvalidMail(
                prefix + "to",
                f"{recipients} recipients in to + cc + bcc can never fit the {scope} limit {window} "
                "(a window of a minute or more is a budget)",
            )


def _mail_from(item: Mail | Mapping[str, object], index: int) -> Mail:
    if isinstance(item, Mail):
        return item
    if isinstance(item, Mapping):
        try:
            return Mail(**item)  # type: ignore[arg-type]
        except TypeError as exc:
            raise InvalidMail(f"mails[{index}]", f"not a mail: {exc}") from None
    raise InvalidMail(f"mails[{index}]", "must be a mailer.Mail or a mapping of its fields")


class MailClient(RedisOwner, BaseMailClient):
    """Enqueue mail from blocking code.

    >>> client = MailClient.from_env()
    >>> job_id = client.send("acme", sender="no-reply@acme.example", to=["ada@example.com"],
    ...                      subject="Welcome", text="Hello!")
    """

    def __init__(self, settings: Settings | None = None, *, redis_client: redis.Redis | None = None) -> None:
        super().__init__(settings, redis_client=redis_client)
        self._routes = SyncRoutes(self.settings, self._redis, **timeouts(self.settings))
        self._policy = PolicyOnce(self.settings.redis_high_water)

    def close(self) -> None:
        self._routes.redis.close()  # other pools' clients, on a Redis Cluster
        super().close()

    @classmethod
    def from_env(cls) -> MailClient:
        """Settings from ``FAIRPOST_*`` variables and ``FAIRPOST_CONFIG_FILE``."""
        return cls(load_settings())

    def send(
        self,
        tenant_id: str,
        *,
        sender: str | None = None,
        to: Sequence[str] | str,
        subject: str,
        text: str | None = None,
        html: str | None = None,
        cc: Sequence[str] | str = (),
        bcc: Sequence[str] | str = (),
        reply_to: Sequence[str] | str = (),
        headers: Mapping[str, str] | None = None,
        priority: str = "normal",
        attachments: Sequence[Attachment] = (),
        idempotency_key: str | None = None,
        send_at: datetime | None = None,
        stream: str = TRANSACTIONAL,
        topic: str | None = None,
    ) -> str:
        """Validate and enqueue one mail; return its job id. Raises :class:`InvalidMail`.

        Without ``sender``, the tenant's ``default_sender`` setting is used.
        ``stream``: ``transactional`` (the default) or ``notification``, subscribed mail
        of a ``topic`` its one recipient may stop (fairpost.mailer.sdk.streams).
        """
        mail = Mail(
            sender=sender or "",
            to=to,
            subject=subject,
            text=text,
            html=html,
            cc=cc,
            bcc=bcc,
            reply_to=reply_to,
            headers=headers,
            attachments=attachments,
            idempotency_key=idempotency_key,
            send_at=send_at,
            stream=stream,
            topic=topic,
        )
        route = self._route(tenant_id)
        made = self._jobs(route.settings, tenant_id, [mail], priority, many=False, send_at=send_at)
        with Creating(made) as jobs:
            [(_, job_id)] = self._failures.call("enqueue", lambda: self._submit(route, jobs))
        return job_id

    def send_many(
        self,
        tenant_id: str,
        mails: Iterable[Mail | Mapping[str, object]],
        *,
        priority: str = "normal",
        send_at: datetime | None = None,
    ) -> list[str]:
        """Validate every mail, then enqueue them all in one atomic Redis call: all or nothing.

        If any mail is invalid, nothing is written and the error names it (``mails[3].to``).

        Each mail may carry its own ``idempotency_key`` (a repeat within
        FAIRPOST_IDEMPOTENCY_TTL gets the first job's id and enqueues nothing) and
        ``send_at`` (timezone-aware; ``send_at`` here applies to mails without one).
        """
        route = self._route(tenant_id)
        made = self._jobs(route.settings, tenant_id, mails, priority, many=True, send_at=send_at)
        with Creating(made) as jobs:
            submitted = self._failures.call("enqueue", lambda: self._submit(route, jobs))
        return [job_id for _, job_id in submitted]

    def _route(self, tenant_id: str) -> SyncRoute:
        """The pool the tenant's new mail goes to (mailer/sdk/directory.py)."""
        tenant = check_tenant_id(tenant_id)
        return self._failures.call("enqueue", lambda: self._routes.for_tenant(tenant))

    def _submit(self, route: SyncRoute, jobs: list[NewJob]) -> list[tuple[bool, str]]:
        """Write the jobs, once this client knows Redis will not evict them
        (:class:`EvictingRedis`); above the high-water mark, :class:`RedisNearlyFull`."""
        self._policy.check(self._redis)
        return route.store.submit(jobs)

    def status(self, job_id: str) -> JobStatus:
        """The job's state; raises :class:`UnknownJob` if there is no such job."""

        def find() -> dict[str, str]:
            # Job ids are unique over every pool: the first pool that knows it has it.
            for route in self._routes:
                record = route.store.job(job_id)
                if record:
                    return record
            return {}

        return JobStatus.from_record(job_id, self._failures.call("status", find))

    def cancel(self, job_id: str) -> str:
        """Stop a job not yet handed to SQS (scheduled, queued or claimed): it becomes a
        dead letter with reason "cancelled". Returns the state it had. Raises
        :class:`TooLateToCancel` once it is dispatched or finished, :class:`UnknownJob`
        if there is no such job. Cancelling twice is not an error."""

        # Cancelling twice is not an error: a try whose answer was lost is safe to repeat.
        def cancel() -> str:
            *others, last = list(self._routes)
            for route in others:  # the job is in one pool: the others do not know it
                with contextlib.suppress(UnknownJob):
                    return route.lifecycle.cancel(job_id, self.settings.job_ttl)
            return last.lifecycle.cancel(job_id, self.settings.job_ttl)

        return self._failures.call("cancel", cancel)

    def dead_letters(self) -> DeadLetters:
        """List, show, replay and purge dead letters, on this client's connection."""
        return DeadLetters(self.settings, redis_client=self._redis)

    def suppressions(self) -> Suppressions:
        """List, add and remove a tenant's suppressed addresses, on this client's connection."""
        return Suppressions(self.settings, redis_client=self._redis)

    def pools(self) -> Pools:
        """Which sending pool each tenant is on; move a tenant, name its fallback (on this
        client's connection)."""
        return Pools(self.settings, redis_client=self._redis)

    def unsubscribes(self) -> Unsubscribes:
        """List, add and remove who stopped a tenant's notification mail (by topic), on
        this client's connection (fairpost.mailer.sdk.unsubscribes)."""
        return Unsubscribes(self.settings, redis_client=self._redis)

    def webhooks(self) -> Webhooks:
        """A tenant's signed webhook endpoints (add, list, rotate, replay...), on this client's connection."""
        return Webhooks(self.settings, redis_client=self._redis)

    def events(
        self, *, group: str, consumer: str, tenant: str | None = None, start: Start = "earliest",
        batch: int = 100, block: bool = True, claim_idle_seconds: float = 60.0, pool: str = DEFAULT_POOL,
    ) -> EventReader:  # fmt: skip
        """The outcome feed, read as ``consumer`` of ``group``: each event at least once,
        until acknowledged (``event.ack()``); ``tenant``: that tenant's only; ``block=False``:
        stop when none is waiting (fairpost.mailer.sdk.outcomes.stream, docs/outcomes.md).
        ``pool``: the sending pool whose feed to read (each pool keeps its own)."""
        return EventReader(
            self._routes.redis(pool), self._routes.pool(pool).settings, group=group, consumer=consumer,
            tenant=tenant, start=start, batch=batch, block=block, claim_idle_seconds=claim_idle_seconds,
        )  # fmt: skip


class AsyncMailClient(AsyncRedisOwner, BaseMailClient):
    """Enqueue mail from asyncio code; the same methods as :class:`MailClient`."""

    def __init__(
        self, settings: Settings | None = None, *, redis_client: redis.asyncio.Redis | None = None
    ) -> None:
        super().__init__(settings, redis_client=redis_client)
        self._routes = AsyncRoutes(self.settings, self._redis, **timeouts(self.settings))
        self._policy = PolicyOnce(self.settings.redis_high_water)

    async def aclose(self) -> None:
        await self._routes.redis.aclose()
        await super().aclose()

    @classmethod
    def from_env(cls) -> AsyncMailClient:
        return cls(load_settings())

    async def send(
        self,
        tenant_id: str,
        *,
        sender: str | None = None,
        to: Sequence[str] | str,
        subject: str,
        text: str | None = None,
        html: str | None = None,
        cc: Sequence[str] | str = (),
        bcc: Sequence[str] | str = (),
        reply_to: Sequence[str] | str = (),
        headers: Mapping[str, str] | None = None,
        priority: str = "normal",
        attachments: Sequence[Attachment] = (),
        idempotency_key: str | None = None,
        send_at: datetime | None = None,
        stream: str = TRANSACTIONAL,
        topic: str | None = None,
    ) -> str:
        mail = Mail(
            sender=sender or "",
            to=to,
            subject=subject,
            text=text,
            html=html,
            cc=cc,
            bcc=bcc,
            reply_to=reply_to,
            headers=headers,
            attachments=attachments,
            idempotency_key=idempotency_key,
            send_at=send_at,
            stream=stream,
            topic=topic,
        )
        route = await self._route(tenant_id)
        made = self._jobs(route.settings, tenant_id, [mail], priority, many=False, send_at=send_at)
        with Creating(made) as jobs:
            [(_, job_id)] = await self._failures.acall("enqueue", lambda: self._submit(route, jobs))
        return job_id

    async def send_many(
        self,
        tenant_id: str,
        mails: Iterable[Mail | Mapping[str, object]],
        *,
        priority: str = "normal",
        send_at: datetime | None = None,
    ) -> list[str]:
        route = await self._route(tenant_id)
        made = self._jobs(route.settings, tenant_id, mails, priority, many=True, send_at=send_at)
        with Creating(made) as jobs:
            submitted = await self._failures.acall("enqueue", lambda: self._submit(route, jobs))
        return [job_id for _, job_id in submitted]

    async def _route(self, tenant_id: str) -> AsyncRoute:
        tenant = check_tenant_id(tenant_id)
        return await self._failures.acall("enqueue", lambda: self._routes.for_tenant(tenant))

    async def _submit(self, route: AsyncRoute, jobs: list[NewJob]) -> list[tuple[bool, str]]:
        await self._policy.acheck(self._redis)
        return await route.store.submit(jobs)

    async def status(self, job_id: str) -> JobStatus:
        async def find() -> dict[str, str]:
            for route in self._routes:
                record = await route.store.job(job_id)
                if record:
                    return record
            return {}

        return JobStatus.from_record(job_id, await self._failures.acall("status", find))

    async def cancel(self, job_id: str) -> str:
        async def cancel() -> str:
            *others, last = list(self._routes)
            for route in others:
                with contextlib.suppress(UnknownJob):
                    return await route.lifecycle.cancel(job_id, self.settings.job_ttl)
            return await last.lifecycle.cancel(job_id, self.settings.job_ttl)

        return await self._failures.acall("cancel", cancel)

    def events(
        self, *, group: str, consumer: str, tenant: str | None = None, start: Start = "earliest",
        batch: int = 100, block: bool = True, claim_idle_seconds: float = 60.0, pool: str = DEFAULT_POOL,
    ) -> AsyncEventReader:  # fmt: skip
        """``async for event in client.events(...)``: as :meth:`MailClient.events`."""
        return AsyncEventReader(
            self._routes.redis(pool), self._routes.pool(pool).settings, group=group, consumer=consumer,
            tenant=tenant, start=start, batch=batch, block=block, claim_idle_seconds=claim_idle_seconds,
        )  # fmt: skip
