"""The SDK: applications enqueue mail with :class:`MailClient` or :class:`AsyncMailClient`.

Both validate every mail before writing anything, and write each job (its
record and its place in the tenant's queue) in one atomic step.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from types import TracebackType
from typing import Self

import redis
import redis.asyncio

from config import Settings, load_settings
from dispatcher.jobs import check_priority, new_job_id
from dispatcher.keys import Keys
from dispatcher.store import JobStore, NewJob, StoreLimits, SyncJobStore
from mailer.errors import InvalidMail
from mailer.mail import Mail, check_tenant_id, validate
from mailer.status import JobStatus

MAIL_KIND = "mail"


def store_limits(settings: Settings) -> StoreLimits:
    return StoreLimits(
        default_weight=settings.default_weight,
        default_cap=settings.inflight_cap,
        lease_ms=int(settings.dispatcher.lease_seconds * 1000),
        inflight_ttl_ms=int(settings.dispatcher.inflight_ttl_seconds * 1000),
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


def _new_jobs(
    settings: Settings,
    tenant_id: str,
    mails: Iterable[Mail | Mapping[str, object]],
    priority: str,
    many: bool,
) -> list[NewJob]:
    tenant = check_tenant_id(tenant_id)
    try:
        check_priority(priority)
    except ValueError as exc:
        raise InvalidMail("priority", str(exc)) from None
    jobs = []
    for index, item in enumerate(mails):
        mail = _mail_from(item, index)
        valid, payload = validate(
            mail, max_bytes=settings.max_message_bytes, prefix=f"mails[{index}]." if many else ""
        )
        jobs.append(
            NewJob(
                id=new_job_id(),
                tenant=tenant,
                kind=MAIL_KIND,
                payload=payload,
                priority=priority,
                fields={"recipients": str(valid.recipients)},
            )
        )
    return jobs


class MailClient:
    """Enqueue mail from blocking code.

    >>> client = MailClient.from_env()
    >>> job_id = client.send("acme", sender="no-reply@acme.test", to=["ada@example.com"],
    ...                      subject="Welcome", text="Hello!")
    """

    def __init__(self, settings: Settings | None = None, *, redis_client: redis.Redis | None = None) -> None:
        self.settings = settings or load_settings()
        self._owns_redis = redis_client is None
        self._redis = redis_client or redis.Redis.from_url(self.settings.redis_url)
        self._store = SyncJobStore(self._redis, Keys(self.settings.key_prefix), store_limits(self.settings))

    @classmethod
    def from_env(cls) -> MailClient:
        """Settings from ``FAIRPOST_*`` variables and ``FAIRPOST_CONFIG_FILE``."""
        return cls(load_settings())

    def send(
        self,
        tenant_id: str,
        *,
        sender: str,
        to: Sequence[str] | str,
        subject: str,
        text: str | None = None,
        html: str | None = None,
        cc: Sequence[str] | str = (),
        bcc: Sequence[str] | str = (),
        reply_to: Sequence[str] | str = (),
        headers: Mapping[str, str] | None = None,
        priority: str = "normal",
    ) -> str:
        """Validate and enqueue one mail; return its job id. Raises :class:`InvalidMail`."""
        mail = Mail(
            sender=sender,
            to=to,
            subject=subject,
            text=text,
            html=html,
            cc=cc,
            bcc=bcc,
            reply_to=reply_to,
            headers=headers,
        )
        return self.send_many(tenant_id, [mail], priority=priority, _many=False)[0]

    def send_many(
        self,
        tenant_id: str,
        mails: Iterable[Mail | Mapping[str, object]],
        *,
        priority: str = "normal",
        _many: bool = True,
    ) -> list[str]:
        """Validate every mail, then enqueue them all in one pipelined round trip.

        If any mail is invalid, nothing is written and the error names it (``mails[3].to``).
        """
        jobs = _new_jobs(self.settings, tenant_id, mails, priority, _many)
        self._store.enqueue(jobs)
        return [job.id for job in jobs]

    def status(self, job_id: str) -> JobStatus:
        """The job's state; raises :class:`UnknownJob` if there is no such job."""
        return JobStatus.from_record(job_id, self._store.job(job_id))

    def close(self) -> None:
        if self._owns_redis:
            self._redis.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncMailClient:
    """Enqueue mail from asyncio code; the same methods as :class:`MailClient`."""

    def __init__(
        self, settings: Settings | None = None, *, redis_client: redis.asyncio.Redis | None = None
    ) -> None:
        self.settings = settings or load_settings()
        self._owns_redis = redis_client is None
        self._redis = redis_client or redis.asyncio.Redis.from_url(self.settings.redis_url)
        self._store = JobStore(self._redis, Keys(self.settings.key_prefix), store_limits(self.settings))

    @classmethod
    def from_env(cls) -> AsyncMailClient:
        return cls(load_settings())

    async def send(
        self,
        tenant_id: str,
        *,
        sender: str,
        to: Sequence[str] | str,
        subject: str,
        text: str | None = None,
        html: str | None = None,
        cc: Sequence[str] | str = (),
        bcc: Sequence[str] | str = (),
        reply_to: Sequence[str] | str = (),
        headers: Mapping[str, str] | None = None,
        priority: str = "normal",
    ) -> str:
        mail = Mail(
            sender=sender,
            to=to,
            subject=subject,
            text=text,
            html=html,
            cc=cc,
            bcc=bcc,
            reply_to=reply_to,
            headers=headers,
        )
        return (await self.send_many(tenant_id, [mail], priority=priority, _many=False))[0]

    async def send_many(
        self,
        tenant_id: str,
        mails: Iterable[Mail | Mapping[str, object]],
        *,
        priority: str = "normal",
        _many: bool = True,
    ) -> list[str]:
        jobs = _new_jobs(self.settings, tenant_id, mails, priority, _many)
        await self._store.enqueue(jobs)
        return [job.id for job in jobs]

    async def status(self, job_id: str) -> JobStatus:
        return JobStatus.from_record(job_id, await self._store.job(job_id))

    async def aclose(self) -> None:
        if self._owns_redis:
            await self._redis.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()
