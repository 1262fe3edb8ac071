"""The SQS message body: a versioned JSON envelope around one mail job.

A sender may meet bodies written by an older or newer fairpost, or by
something else entirely; :func:`decode` says exactly what is wrong so the
message can be dead-lettered with its raw body instead of blocking its group.

Version 1 carries the mail. Version 2 is a claim check: the mail's content
(a MIME message: attachments, or too big for SQS) stays in Redis under
``content_key``, and ``mail`` carries only what the sender needs before it
loads it (addresses, subject). This fairpost writes version 1 whenever it can
and reads both. A body of a version above both, which a newer fairpost wrote,
is :class:`~fairpost.mailer.errors.NewerFormat`: the sender leaves it in SQS
for a newer replica, never deletes or dead-letters it
(:meth:`fairpost.mailer.daemon.endings.Endings.newer`). Fields this fairpost
does not know are ignored: adding an optional field is no new version;
removing or renaming one, or changing what one means, is.

A mail sent inside a trace (OpenTelemetry, :mod:`fairpost.mailer.sdk.tracing`)
carries its creation's trace context in the payload's last field,
:data:`TRACE`: ``"trace":{"traceparent":...,"tracestate":...,"priority":...}``.
Either version may have it; a mail without it (untraced, or written before it
existed) is read as before, and a fairpost that does not know the field
ignores it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fairpost.mailer.errors import NewerFormat, PoisonMessage
from fairpost.mailer.sdk.mail import ValidMail

ENVELOPE_VERSION = 1
CLAIM_CHECK_VERSION = 2
READABLE_VERSIONS = (ENVELOPE_VERSION, CLAIM_CHECK_VERSION)
BODY = "sqs_body"
"""What :class:`~fairpost.mailer.errors.NewerFormat` names, and its metric's ``format`` label."""

STORED_MARK = '{"content":"stored",'
"""How a job payload whose content is stored beside the record begins (see
:func:`fairpost.mailer.sdk.compose.stored_payload`); no version 1 payload begins so."""

TRACE = "trace"
"""The payload field with the trace context of the mail's creation (W3C
``traceparent`` and ``tracestate``) and its ``priority``, for the daemon's spans."""
_TRACE_TAIL = ',"' + TRACE + '":{'


@dataclass(frozen=True)
class Envelope:
    job_id: str
    tenant: str
    created_ms: int
    mail: ValidMail
    content_key: str | None = None
    """Version 2: where the mail's content waits in Redis (``mail`` then has
    only its addresses and subject until the sender loads it)."""
    trace: Mapping[str, str] | None = None
    """The :data:`TRACE` field: the trace context the mail was created in; None: untraced."""

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
        if self.trace is not None:
            data["mail"][TRACE] = dict(self.trace)
        return json.dumps(data, separators=(",", ":"), ensure_ascii=False)


def with_trace(payload: str, trace: Mapping[str, str]) -> str:
    """The payload with ``trace`` as its last field (:data:`TRACE`), where
    :func:`payload_trace` finds it without parsing the mail."""
    return payload[:-1] + _TRACE_TAIL[:-1] + json.dumps(dict(trace), separators=(",", ":")) + "}"


def payload_trace(payload: str) -> dict[str, str] | None:
    """The :data:`TRACE` field of a job's payload, read from its tail; None if it has
    none. No string in the mail can hold the tail's unescaped quotes."""
    start = payload.rfind(_TRACE_TAIL)
    if start < 0:
        return None
    try:
        value: Any = json.loads(payload[start + len(_TRACE_TAIL) - 1 : -1])
    except ValueError:
        return None
    return _trace_field(value)


def _trace_field(value: Any) -> dict[str, str] | None:
    """A well-formed trace field, or None: a broken one costs the mail its trace, never its send."""
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        return None
    return value


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
    if isinstance(version, int) and not isinstance(version, bool) and version > READABLE_VERSIONS[-1]:
        raise NewerFormat(BODY, version, READABLE_VERSIONS[-1])
    if version not in READABLE_VERSIONS or isinstance(version, bool):
        raise PoisonMessage(f"unknown envelope version {version!r} (this fairpost reads 1 and 2)")
    try:
        job_id, tenant, created_ms = str(data["job_id"]), str(data["tenant"]), int(data["created_ms"])
        mail = ValidMail.from_json(json.dumps(data["mail"]))
        content_key = str(data["content_key"]) if version == CLAIM_CHECK_VERSION else None
        trace = _trace_field(data["mail"].get(TRACE))
    except (KeyError, TypeError, ValueError) as exc:
        raise PoisonMessage(f"envelope field missing or malformed: {exc}") from None
    if not job_id or not tenant or mail.recipients < 1:
        raise PoisonMessage("envelope has an empty job id, tenant or recipient list")
    if content_key == "":
        raise PoisonMessage("claim-check envelope has an empty content key")
    return Envelope(
        job_id=job_id, tenant=tenant, created_ms=created_ms, mail=mail, content_key=content_key, trace=trace
    )
