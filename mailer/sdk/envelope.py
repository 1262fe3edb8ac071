"""The SQS message body: a versioned JSON envelope around one mail job.

A sender may meet bodies written by an older or newer fairpost, or by
something else entirely; :func:`decode` says exactly what is wrong so the
message can be dead-lettered with its raw body instead of blocking its group.

Version 1 carries the mail. Version 2 is a claim check: the mail's content
(a MIME message: attachments, or too big for SQS) stays in Redis under
``content_key``, and ``mail`` carries only what the sender needs before it
loads it (addresses, subject). This fairpost writes version 1 whenever it can
and reads both; an older one dead-letters a version 2 body as unreadable
rather than send it wrong.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from fairpost.mailer.errors import PoisonMessage
from fairpost.mailer.sdk.mail import ValidMail

ENVELOPE_VERSION = 1
CLAIM_CHECK_VERSION = 2
READABLE_VERSIONS = (ENVELOPE_VERSION, CLAIM_CHECK_VERSION)

STORED_MARK = '{"content":"stored",'
"""How a job payload whose content is stored beside the record begins (see
:func:`fairpost.mailer.sdk.compose.stored_payload`); no version 1 payload begins so."""


@dataclass(frozen=True)
class Envelope:
    job_id: str
    tenant: str
    created_ms: int
    mail: ValidMail
    content_key: str | None = None
    """Version 2: where the mail's content waits in Redis (``mail`` then has
    only its addresses and subject until the sender loads it)."""

    def encode(self) -> str:
        data: dict[str, Any] = {
            "v": CLAIM_CHECK_VERSION if self.content_key else ENVELOPE_VERSION,
            "job_id": self.job_id,
            "tenant": self.tenant,
            "created_ms": self.created_ms,
        }
        if self.content_key:
            data["content_key"] = self.content_key
        data["mail"] = json.loads(self.mail.to_json())
        return json.dumps(data, separators=(",", ":"), ensure_ascii=False)


def encode(job_id: str, tenant: str, created_ms: int, mail_json: str) -> str:
    """Build the body from the job's stored payload, without re-parsing the mail
    (a claim-check payload, small by design, is read for its content key)."""
    head: dict[str, Any] = {
        "v": ENVELOPE_VERSION,
        "job_id": job_id,
        "tenant": tenant,
        "created_ms": created_ms,
    }
    if mail_json.startswith(STORED_MARK):
        head["v"] = CLAIM_CHECK_VERSION
        head["content_key"] = json.loads(mail_json)["content_key"]
    return json.dumps(head)[:-1] + ',"mail":' + mail_json + "}"


def decode(body: str) -> Envelope:
    try:
        data: Any = json.loads(body)
    except ValueError:
        raise PoisonMessage("body is not JSON") from None
    if not isinstance(data, dict):
        raise PoisonMessage("body is not a JSON object")
    version = data.get("v")
    if version not in READABLE_VERSIONS or isinstance(version, bool):
        raise PoisonMessage(f"unknown envelope version {version!r} (this fairpost reads 1 and 2)")
    try:
        job_id, tenant, created_ms = str(data["job_id"]), str(data["tenant"]), int(data["created_ms"])
        mail = ValidMail.from_json(json.dumps(data["mail"]))
        content_key = str(data["content_key"]) if version == CLAIM_CHECK_VERSION else None
    except (KeyError, TypeError, ValueError) as exc:
        raise PoisonMessage(f"envelope field missing or malformed: {exc}") from None
    if not job_id or not tenant or mail.recipients < 1:
        raise PoisonMessage("envelope has an empty job id, tenant or recipient list")
    if content_key == "":
        raise PoisonMessage("claim-check envelope has an empty content key")
    return Envelope(job_id=job_id, tenant=tenant, created_ms=created_ms, mail=mail, content_key=content_key)
