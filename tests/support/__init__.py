"""Test support: daemons as real processes, the pipeline in the test's event loop, shared constants.

The services themselves (redis-server, moto, LocalStack, the recording SES) and
the one wait helper live in fairpost.mailer.testing, where the demo and bench use them too.
"""

from collections.abc import Iterable, Sequence
from typing import Any

import redis
import redis.asyncio

from fairpost.dispatcher.record import ENTRY_SEP
from fairpost.dispatcher.replies import text
from fairpost.mailer.sdk.envelope import encode
from fairpost.mailer.sdk.keys import MailKeys
from fairpost.mailer.testing.ses_server import SentMail

KEYS = MailKeys()
"""The keys under the default prefix, the one ``Settings()`` uses."""


SQS_BATCH = 10
"""The most messages one SQS receive hands a sender."""

JOB_SCORES = ("-inf", "(inf")
"""The score range of a set of jobs' jobs (their times), the set's anchor (scored
``+inf``, :data:`~fairpost.dispatcher.keys.ANCHOR`) left out: ``ZCOUNT key *JOB_SCORES``
counts the leases, or the dispatched index's jobs."""


def overtaken_by(sent: Sequence[SentMail], tenant: str, since: int, job: str) -> int:
    """How many of ``tenant``'s mails SES got after the first ``since`` and before ``job``'s:
    what overtook ``job``, as SES saw it, whatever the machine's speed."""
    at = next(i for i, mail in enumerate(sent) if mail.job_id == job)
    return sum(1 for mail in sent[since:at] if mail.tag("fairpost-tenant") == tenant)


def entry_ids(entries: Iterable[Any]) -> list[str]:
    """The job ids of a queue's entries (``LRANGE`` of :meth:`MailKeys.queue`): each is
    an id, or an id and the waiting job's payload (dispatcher/record.py)."""
    return [text(entry).partition(ENTRY_SEP)[0] for entry in entries]


def _in_entries(entries: Iterable[Any], job_id: str) -> str | None:
    for entry in entries:
        found, sep, payload = text(entry).partition(ENTRY_SEP)
        if sep and found == job_id:
            return payload
    return None


def stored_payload(client: redis.Redis, job_id: str, keys: MailKeys = KEYS) -> str | None:
    """A job's payload wherever Redis keeps it: its key, or (a waiting job) its queue entry."""
    payload = client.get(keys.payload(job_id))
    if payload is not None:
        return text(payload)
    tenant, priority = client.hmget(keys.job(job_id), "tenant", "priority")
    if tenant is None:
        return None
    return _in_entries(client.lrange(keys.queue(text(tenant), text(priority)), 0, -1), job_id)


async def message_body(client: redis.asyncio.Redis, job_id: str, keys: MailKeys = KEYS) -> str:
    """The SQS message the dispatcher would hand off for a job (mailer/daemon/handoff.py),
    read from Redis wherever its payload is (its key, or its entry in its queue)."""
    record = {text(k): text(v) for k, v in (await client.hgetall(keys.job(job_id))).items()}
    payload = await client.get(keys.payload(job_id))
    if payload is None:
        entries = await client.lrange(keys.queue(record["tenant"], record["priority"]), 0, -1)
        payload = _in_entries(entries, job_id)
    assert payload is not None, f"job {job_id} has no payload"
    return encode(job_id, record["tenant"], int(record["created_ms"]), text(payload))
