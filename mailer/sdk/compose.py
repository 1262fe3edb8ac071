"""From a :class:`Mail` to the job the SDK enqueues: validation, send options
(idempotency key, send time), and where the content goes.

A plain mail's JSON is the job's payload and rides in the SQS message
(envelope version 1). A mail with attachments, or one whose JSON is over
:data:`INLINE_MAX_BYTES`, becomes a MIME message kept in Redis beside the job
record (:meth:`MailKeys.content`); the payload, and the SQS message, carry only
its addresses, subject and that key (a claim check, envelope version 2).
"""

from __future__ import annotations

import dataclasses
import json
from datetime import datetime
from email.utils import parseaddr

from fairpost.config import Settings
from fairpost.dispatcher.jobs import NewJob, new_job_id
from fairpost.dispatcher.keys import lane
from fairpost.mailer.errors import InvalidMail
from fairpost.mailer.sdk.attachments import check_attachments
from fairpost.mailer.sdk.envelope import STORED_MARK
from fairpost.mailer.sdk.keys import MailKeys
from fairpost.mailer.sdk.list_unsubscribe import has_own, unsubscribe_headers
from fairpost.mailer.sdk.mail import Mail, ValidMail, validate
from fairpost.mailer.sdk.mime import SES_MAX_MESSAGE_BYTES, build_mime
from fairpost.mailer.sdk.streams import NOTIFICATION

INLINE_MAX_BYTES = 256 * 1024
"""A mail's JSON up to this size travels inside its SQS message; a bigger one
as a claim check. Well under SQS's 1 MiB, so a batch of ten stays cheap."""

MAX_IDEMPOTENCY_KEY_CHARS = 256


def check_send_at(value: object, field_name: str) -> int:
    """Milliseconds since the epoch, or 0 for "now"; naive datetimes are refused."""
    if value is None:
        return 0
    if not isinstance(value, datetime):
        raise InvalidMail(field_name, f"must be a datetime, got {type(value).__name__}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidMail(field_name, "must be timezone-aware (e.g. datetime.now(UTC) + timedelta(hours=1))")
    return max(1, int(value.timestamp() * 1000))


def check_idempotency_key(value: object, field_name: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise InvalidMail(field_name, "must be a non-empty string")
    if len(value) > MAX_IDEMPOTENCY_KEY_CHARS or any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise InvalidMail(
            field_name, f"at most {MAX_IDEMPOTENCY_KEY_CHARS} characters, without control characters"
        )
    return value


def stored_payload(mail: ValidMail, content_key: str, size: int) -> str:
    """The payload of a mail whose content is stored beside the record: its
    addresses and subject (for the quota and logs) and where the rest is."""
    data = {
        "content": "stored",
        "content_key": content_key,
        "size": size,
        **json.loads(mail.to_json()),
        "text": None,
        "html": None,
        "headers": {},
    }
    payload = json.dumps(data, separators=(",", ":"), ensure_ascii=False)
    assert payload.startswith(STORED_MARK)
    return payload


def with_unsubscribe(settings: Settings, tenant: str, mail: ValidMail) -> tuple[ValidMail, str]:
    """A notification mail with fairpost's one-click unsubscribe headers for its one recipient."""
    assert mail.topic is not None
    address = parseaddr(mail.to[0])[1]
    headers = {**mail.headers, **unsubscribe_headers(settings, tenant, address, mail.topic)}
    valid = dataclasses.replace(mail, headers=headers)
    return valid, valid.to_json()


def mail_job(
    settings: Settings,
    keys: MailKeys,
    tenant: str,
    mail: Mail,
    *,
    priority: str,
    kind: str,
    prefix: str = "",
    send_at: datetime | None = None,
) -> NewJob:
    """Validate ``mail`` and build its job; raises :class:`InvalidMail` naming the field."""
    valid, payload = validate(mail, max_bytes=settings.max_message_bytes, prefix=prefix)
    notification = valid.stream == NOTIFICATION
    # The application's own List-Unsubscribe passed the header rules in validate().
    if notification and not has_own(valid.headers):
        valid, payload = with_unsubscribe(settings, tenant, valid)
    attachments = check_attachments(mail.attachments, prefix + "attachments")
    send_at_ms = check_send_at(mail.send_at if mail.send_at is not None else send_at, prefix + "send_at")
    idempotency_key = check_idempotency_key(mail.idempotency_key, prefix + "idempotency_key")
    job_id = new_job_id()
    content: bytes | None = None
    if attachments or len(payload.encode()) > INLINE_MAX_BYTES:
        content = build_mime(valid, attachments, prefix=prefix)
        size = len(content)
        if size > SES_MAX_MESSAGE_BYTES:
            raise InvalidMail(
                prefix + "size",
                f"the MIME message is {size:,} bytes; SES v2 accepts at most {SES_MAX_MESSAGE_BYTES:,}",
            )
        if size > settings.max_message_bytes:
            raise InvalidMail(
                prefix + "size",
                f"the MIME message is {size} bytes; the limit is {settings.max_message_bytes} "
                "(FAIRPOST_MAX_MESSAGE_BYTES)",
            )
        payload = stored_payload(valid, keys.content(job_id), size)
    return NewJob(
        id=job_id,
        tenant=tenant,
        kind=kind,
        payload=payload,
        priority=lane(priority, bulk=notification),
        fields={"recipients": str(valid.recipients)},
        send_at_ms=send_at_ms,
        idempotency_key=idempotency_key,
        idempotency_ttl=settings.idempotency_ttl,
        content=content,
    )
