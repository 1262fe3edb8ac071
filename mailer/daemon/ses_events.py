"""SES events as they arrive in SQS, read into one shape.

A configuration set's event destination publishes to SNS or to EventBridge;
either one delivers to the SQS queue fairpost reads
(``FAIRPOST_EVENTS_QUEUE_NAME``). Three bodies are accepted, as AWS documents
them:

- SNS (``Type: Notification``): the SES event is the JSON string in ``Message``;
- SNS with raw message delivery: the body is the SES event itself;
- EventBridge (``source: aws.ses``, ``detail-type: Email Bounced`` ...): the SES
  event is ``detail``.

The SES event is an *event publishing* record (``eventType``), a
feedback notification (``notificationType``, identity notifications), or a
receipt notification (``notificationType: Received``: mail SES received for a
receipt rule, read for unsubscribes by mail). The first two both
name ``Bounce``, ``Complaint``, ``Delivery``; event publishing also ``Reject``
and ``DeliveryDelay`` (and ``Send``, ``Open``, ``Click``, ... which fairpost
does not need). Each names the mail by ``mail.messageId``, SES's id that
fairpost recorded when SES accepted the mail.

A body that is none of these raises ``ValueError`` with a reason that names
no address; so does one whose ids (which name Redis keys) are not printable
ASCII, as SES's, SNS's and EventBridge's all are.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from fairpost.config import is_valid_tenant_id
from fairpost.mailer.daemon.ses import redact

__all__ = ["KINDS", "Kind", "SesEvent", "parse_event"]

Kind = Literal["bounce", "complaint", "delivery", "reject", "delivery_delay", "received", "other"]
KINDS: tuple[Kind, ...] = ("bounce", "complaint", "delivery", "reject", "delivery_delay", "received", "other")

_KIND = {
    "bounce": "bounce",
    "complaint": "complaint",
    "delivery": "delivery",
    "reject": "reject",
    "deliverydelay": "delivery_delay",
    # SES receiving mail (a receipt rule's SNS action): an unsubscribe by mail, when
    # it is addressed to FAIRPOST_UNSUBSCRIBE__MAILTO_DOMAIN (mailer/daemon/unsubscriber.py).
    "received": "received",
}
_ID = re.compile(r"[\x21-\x7e]{1,200}")
"""An id a key is built from: printable ASCII (Redis keys are UTF-8, which cannot
carry a lone surrogate a JSON escape can), at most 200 characters."""

_RECIPIENTS = {
    "bounce": ("bounce", "bouncedRecipients"),
    "complaint": ("complaint", "complainedRecipients"),
    "delivery_delay": ("deliveryDelay", "delayedRecipients"),
}


@dataclass(frozen=True)
class SesEvent:
    kind: Kind
    message_id: str
    """SES's message id of the mail (``mail.messageId``)."""
    event_id: str
    """Identifies this event, for dropping SQS's duplicate deliveries."""
    recipients: tuple[str, ...] = ()
    """The bounced, complained-of, delayed or delivered addresses (never logged)."""
    bounce_type: str | None = None
    """``Permanent``, ``Transient`` or ``Undetermined`` (bounces only)."""
    bounce_subtype: str | None = None
    diagnostic: str | None = None
    """SMTP status and diagnostic, the reject reason, or the delay type; addresses redacted."""
    job_id: str | None = None
    """The ``fairpost-job-id`` tag, when the event carries the mail's tags."""
    tenant: str | None = None
    """The ``fairpost-tenant`` tag, likewise."""

    @property
    def permanent(self) -> bool:
        return self.kind == "bounce" and self.bounce_type == "Permanent"


def parse_event(body: str) -> SesEvent:
    """Read one SQS body (SNS, raw, or EventBridge wrapped); ``ValueError`` if it is not an SES event."""
    try:
        data = json.loads(body)
    except ValueError:
        raise ValueError("not JSON") from None
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    envelope_id = ""
    if data.get("Type") == "Notification" and isinstance(data.get("Message"), str):
        envelope_id = str(data.get("MessageId", ""))
        try:
            data = json.loads(data["Message"])
        except ValueError:
            raise ValueError("an SNS notification whose Message is not JSON") from None
    elif isinstance(data.get("detail"), dict) and "detail-type" in data:
        if data.get("source") != "aws.ses":
            raise ValueError(f"an EventBridge event from {str(data.get('source'))[:40]!r}, not aws.ses")
        envelope_id = str(data.get("id", ""))
        data = data["detail"]
    if not isinstance(data, dict):
        raise ValueError("the SES event is not a JSON object")
    return _ses_event(data, envelope_id)


def _ses_event(data: dict[str, Any], envelope_id: str) -> SesEvent:
    name = data.get("eventType", data.get("notificationType"))
    if not isinstance(name, str):
        raise ValueError("no eventType or notificationType")
    mail = data.get("mail")
    if not isinstance(mail, dict) or not isinstance(mail.get("messageId"), str) or not mail["messageId"]:
        raise ValueError(f"a {_shown(name)} event without mail.messageId")
    if not _ID.fullmatch(mail["messageId"]):
        raise ValueError(f"a {_shown(name)} event whose mail.messageId is not 1 to 200 printable ASCII")
    kind: Kind = _KIND.get(name.lower(), "other")  # type: ignore[assignment]
    tags = mail.get("tags") if isinstance(mail.get("tags"), dict) else {}
    detail = data.get(_RECIPIENTS[kind][0] if kind in _RECIPIENTS else kind) or {}
    if not isinstance(detail, dict):
        raise ValueError(f"a {_shown(name)} event whose details are not an object")
    recipients: tuple[str, ...] = ()
    diagnostic: str | None = None
    if kind in _RECIPIENTS:
        listed = detail.get(_RECIPIENTS[kind][1]) or []
        if not isinstance(listed, list):
            raise ValueError(f"a {_shown(name)} event whose recipients are not a list")
        recipients = tuple(
            str(r["emailAddress"]) for r in listed if isinstance(r, dict) and r.get("emailAddress")
        )
        first = next((r for r in listed if isinstance(r, dict)), {})
        parts = [str(first.get(k)) for k in ("status", "diagnosticCode") if first.get(k)]
        if kind == "delivery_delay" and detail.get("delayType"):
            parts.insert(0, str(detail["delayType"]))
        diagnostic = redact(" ".join(parts)) if parts else None
    elif kind == "delivery":
        listed = detail.get("recipients") or []
        recipients = tuple(str(r) for r in listed) if isinstance(listed, list) else ()
        diagnostic = redact(str(detail.get("smtpResponse", ""))) or None
    elif kind == "reject":
        diagnostic = redact(str(detail.get("reason", ""))) or None
    elif kind == "received":
        receipt = data.get("receipt")
        listed = (receipt.get("recipients") if isinstance(receipt, dict) else None) or mail.get("destination")
        recipients = tuple(str(r) for r in listed) if isinstance(listed, list) else ()
    feedback = detail.get("feedbackId")
    event_id = (
        str(feedback)
        if feedback
        else envelope_id or f"{mail['messageId']}:{name}:{detail.get('timestamp', '')}"
    )
    if not _ID.fullmatch(event_id[:200]):
        raise ValueError(f"a {_shown(name)} event whose id is not printable ASCII")
    return SesEvent(
        kind=kind,
        message_id=mail["messageId"],
        event_id=event_id[:200],
        recipients=recipients,
        bounce_type=_opt(detail.get("bounceType")) if kind == "bounce" else None,
        bounce_subtype=_opt(detail.get("bounceSubType")) if kind == "bounce" else None,
        diagnostic=diagnostic,
        job_id=_valid(_tag(tags, "fairpost-job-id"), _ID.fullmatch),
        tenant=_valid(_tag(tags, "fairpost-tenant"), is_valid_tenant_id),
    )


def _opt(value: object) -> str | None:
    return str(value) if value else None


def _tag(tags: Any, name: str) -> str | None:
    value = tags.get(name) if isinstance(tags, dict) else None
    if isinstance(value, list) and value and isinstance(value[0], str):
        return value[0]
    return value if isinstance(value, str) else None


def _valid(value: str | None, rule: Callable[[str], object]) -> str | None:
    """A tag that breaks its rule is no tag: the event is matched by its message id alone."""
    return value if value is not None and rule(value) else None


def _shown(name: str) -> str:
    """An event type as a reason may show it: short, and ASCII whatever the body held."""
    return name[:30].encode("ascii", "backslashreplace").decode("ascii")
