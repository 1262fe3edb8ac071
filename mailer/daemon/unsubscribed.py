"""Notification mail to an address that unsubscribed is never sent (issue #42).

Asked before anything is counted or sent, in the same round trip as the
group's job states (fairpost.mailer.daemon.group): a notification whose one
recipient has stopped its topic (or every topic of its tenant) ends
``suppressed``, with ``mail.suppressed`` naming the reason ``unsubscribed``.
So an unsubscribe takes effect at once, for mail already queued as well.
Transactional mail is never asked about: it has no topic to stop.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Protocol, TypeVar

import redis.asyncio

from fairpost.dispatcher.replies import Queued
from fairpost.dispatcher.store import JobStore
from fairpost.mailer.daemon.mail_jobs import MailState
from fairpost.mailer.daemon.metrics import Metrics
from fairpost.mailer.sdk.envelope import Envelope
from fairpost.mailer.sdk.keys import mail_keys
from fairpost.mailer.sdk.outcomes import feed
from fairpost.mailer.sdk.streams import NOTIFICATION
from fairpost.mailer.sdk.unsubscribes import ask_unsubscribed, holds

__all__ = ["Unsubscribed"]

log = logging.getLogger("fairpost.sender")


class _Message(Protocol):
    envelope: Envelope | None


M = TypeVar("M", bound=_Message)


def _recipient(env: Envelope) -> str | None:
    """A notification's one recipient; None for transactional mail."""
    return env.mail.to[0] if env.mail.stream == NOTIFICATION and env.mail.to else None


class Unsubscribed:
    def __init__(self, store: JobStore, metrics: Metrics, keep_seconds: int) -> None:
        self.store = store
        self.metrics = metrics
        self.keep_seconds = keep_seconds

    def ask(
        self, pipe: redis.asyncio.client.Pipeline, tenant: str, envelopes: Sequence[Envelope]
    ) -> Queued[dict[str, Any]]:
        """Queue the read of the notifications' recipients (nothing for transactional
        mail); its answer: job id → the stored value (None: not unsubscribed)."""
        asked = [(env.job_id, a) for env in envelopes if (a := _recipient(env)) is not None]
        read = ask_unsubscribed(pipe, mail_keys(self.store.keys), tenant, [a for _, a in asked])
        ids = [job_id for job_id, _ in asked]
        return Queued(read.size, lambda replies: dict(zip(ids, read.read(replies), strict=True)))

    async def screen(self, tenant: str, messages: list[M], values: dict[str, Any]) -> list[M]:
        """The messages still to send; each unsubscribed one finished ``suppressed``
        and left out (its message is the caller's to delete). ``values``: :meth:`ask`'s answer."""
        kept: list[M] = []
        for msg in messages:
            env = msg.envelope
            assert env is not None
            address = _recipient(env)
            if address is None or not holds(values.get(env.job_id), env.mail.topic):
                kept.append(msg)
                continue
            self.metrics.suppressed(tenant, 1)
            event = feed.entry(
                feed.SUPPRESSED,
                {
                    "recipients": [address],
                    "partial": False,
                    "reason": "unsubscribed",
                    "topic": env.mail.topic,
                },
            )
            await self.store.finish(
                env.job_id, MailState.SUPPRESSED, keep_seconds=self.keep_seconds,
                fields={"suppressed": 1, "suppressed_reason": "unsubscribed"}, entry=event,
            )  # fmt: skip
            log.info(
                "notification not sent: its recipient unsubscribed from its topic",
                extra={"job_id": env.job_id, "tenant": tenant},
            )
        return kept
