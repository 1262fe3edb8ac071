"""The SQS message body: a versioned JSON envelope around one mail job.

A sender may meet bodies written by an older or newer fairpost, or by
something else entirely; :func:`decode` says exactly what is wrong so the
message can be dead-lettered with its raw body instead of blocking its group.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from mailer.mail import ValidMail

ENVELOPE_VERSION = 1


class PoisonMessage(ValueError):
    """An SQS body that is not a fairpost envelope this version can read."""


@dataclass(frozen=True)
class Envelope:
    job_id: str
    tenant: str
    created_ms: int
    mail: ValidMail

    def encode(self) -> str:
        return json.dumps(
            {
                "v": ENVELOPE_VERSION,
                "job_id": self.job_id,
                "tenant": self.tenant,
                "created_ms": self.created_ms,
                "mail": json.loads(self.mail.to_json()),
            },
            separators=(",", ":"),
            ensure_ascii=False,
        )


def encode(job_id: str, tenant: str, created_ms: int, mail_json: str) -> str:
    """Build the body from the job's stored payload, without re-parsing the mail."""
    head = json.dumps({"v": ENVELOPE_VERSION, "job_id": job_id, "tenant": tenant, "created_ms": created_ms})
    return head[:-1] + ',"mail":' + mail_json + "}"


def decode(body: str) -> Envelope:
    try:
        data: Any = json.loads(body)
    except ValueError:
        raise PoisonMessage("body is not JSON") from None
    if not isinstance(data, dict):
        raise PoisonMessage("body is not a JSON object")
    version = data.get("v")
    if version != ENVELOPE_VERSION:
        raise PoisonMessage(f"unknown envelope version {version!r} (this fairpost reads {ENVELOPE_VERSION})")
    try:
        job_id, tenant, created_ms = str(data["job_id"]), str(data["tenant"]), int(data["created_ms"])
        mail = ValidMail.from_json(json.dumps(data["mail"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise PoisonMessage(f"envelope field missing or malformed: {exc}") from None
    if not job_id or not tenant or mail.recipients < 1:
        raise PoisonMessage("envelope has an empty job id, tenant or recipient list")
    return Envelope(job_id=job_id, tenant=tenant, created_ms=created_ms, mail=mail)
