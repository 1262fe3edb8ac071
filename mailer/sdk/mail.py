"""A mail as the SDK accepts it, validated before anything is written."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from email.utils import formataddr, getaddresses
from typing import Any

from email_validator import EmailNotValidError, validate_email

from fairpost.config.tenant_id import TENANT_ID_RULE, is_valid_tenant_id
from fairpost.mailer.errors import InvalidMail
from fairpost.mailer.sdk.attachments import Attachment
from fairpost.mailer.sdk.headers import CONTROLS, check_headers, check_subject
from fairpost.mailer.sdk.streams import NOTIFICATION, TRANSACTIONAL, check_stream, check_topic

MAX_RECIPIENTS = 50
"""SES's limit on To + Cc + Bcc of one message."""

MAX_SUBJECT_CHARS = 998
"""RFC 5322's line limit: a longer subject cannot be one header line."""

LOCAL_PART_RULE = (
    "the part before the @ must be 7-bit ASCII: SES does not accept internationalised local parts"
)


@dataclass(frozen=True)
class Mail:
    """One mail. Addresses may carry a display name: ``"Ada <ada@example.com>"``."""

    sender: str
    to: Sequence[str] | str
    subject: str
    text: str | None = None
    html: str | None = None
    cc: Sequence[str] | str = ()
    bcc: Sequence[str] | str = ()
    reply_to: Sequence[str] | str = ()
    headers: Mapping[str, str] | None = field(default=None)
    attachments: Sequence[Attachment] = ()
    """Sent as a MIME message (``Content.Raw``); see :mod:`fairpost.mailer.sdk.mime`."""
    idempotency_key: str | None = None
    """A second mail of the tenant with this key, within FAIRPOST_IDEMPOTENCY_TTL, is not enqueued."""
    send_at: datetime | None = None
    """Timezone-aware: the mail waits in Redis until then."""
    stream: str = TRANSACTIONAL
    """``transactional`` or ``notification`` (subscribed mail the recipient may stop:
    fairpost adds the one-click unsubscribe headers; fairpost.mailer.sdk.streams)."""
    topic: str | None = None
    """A notification's topic, what its recipient unsubscribes from (default ``general``)."""


@dataclass(frozen=True)
class ValidMail:
    """A mail that passed every rule, addresses normalised to the ASCII form SES
    takes (an internationalised domain in Punycode)."""

    sender: str
    to: tuple[str, ...]
    cc: tuple[str, ...]
    bcc: tuple[str, ...]
    reply_to: tuple[str, ...]
    subject: str
    text: str | None
    html: str | None
    headers: dict[str, str]
    raw: bytes | None = field(default=None, repr=False)
    """The whole MIME message, when it travels as one (attachments, or a claim
    check): the sender loads it from Redis and sends it as ``Content.Raw``."""
    stream: str = TRANSACTIONAL
    topic: str | None = None
    """A notification's topic; None for transactional mail."""

    @property
    def recipients(self) -> int:
        """What SES counts against both quotas."""
        return len(self.to) + len(self.cc) + len(self.bcc)

    def to_json(self) -> str:
        # A transactional mail's JSON is what it was before streams existed.
        stream = {"stream": self.stream, "topic": self.topic} if self.stream == NOTIFICATION else {}
        return json.dumps(
            {
                **stream,
                "from": self.sender,
                "to": self.to,
                "cc": self.cc,
                "bcc": self.bcc,
                "reply_to": self.reply_to,
                "subject": self.subject,
                "text": self.text,
                "html": self.html,
                "headers": self.headers,
            },
            separators=(",", ":"),
            ensure_ascii=False,
        )

    @classmethod
    def from_json(cls, text: str) -> ValidMail:
        """Rebuild a mail written by :meth:`to_json`. Raises ValueError/KeyError/TypeError if
        malformed: each field of the type :meth:`to_json` writes, or the mail is not read."""
        data: dict[str, Any] = json.loads(text)
        headers = data["headers"]
        if not isinstance(headers, dict) or not all(isinstance(v, str) for v in headers.values()):
            raise TypeError("headers: not an object of strings")
        text_body, html = data["text"], data["html"]
        if not all(b is None or isinstance(b, str) for b in (text_body, html)):
            raise TypeError("text, html: not strings")
        return cls(
            sender=_string(data["from"], "from"),
            to=_strings(data["to"], "to"),
            cc=_strings(data["cc"], "cc"),
            bcc=_strings(data["bcc"], "bcc"),
            reply_to=_strings(data["reply_to"], "reply_to"),
            subject=_string(data["subject"], "subject"),
            text=text_body,
            html=html,
            headers=dict(headers),
            # Absent in a transactional mail's JSON, and in every mail before streams.
            stream=_string(data.get("stream", TRANSACTIONAL), "stream"),
            topic=None if data.get("topic") is None else _string(data["topic"], "topic"),
        )


def _string(value: object, name: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name}: not a string")
    return value


def _strings(value: object, name: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise TypeError(f"{name}: not a list of strings")
    return tuple(value)


def check_tenant_id(tenant_id: object, field_name: str = "tenant_id") -> str:
    if not is_valid_tenant_id(tenant_id):
        raise InvalidMail(field_name, f"must be {TENANT_ID_RULE}, got {tenant_id!r}")
    assert isinstance(tenant_id, str)
    return tenant_id


def validate(mail: Mail, *, max_bytes: int, prefix: str = "") -> tuple[ValidMail, str]:
    """Check every rule; return the mail and its JSON, or raise :class:`InvalidMail`."""
    sender = _address(mail.sender, prefix + "sender")
    to = _addresses(mail.to, prefix + "to")
    cc = _addresses(mail.cc, prefix + "cc")
    bcc = _addresses(mail.bcc, prefix + "bcc")
    reply_to = _addresses(mail.reply_to, prefix + "reply_to")
    total = len(to) + len(cc) + len(bcc)
    if total == 0:
        raise InvalidMail(prefix + "to", "at least one recipient is required in to, cc or bcc")
    if total > MAX_RECIPIENTS:
        raise InvalidMail(
            prefix + "to", f"at most {MAX_RECIPIENTS} recipients in to + cc + bcc (SES's limit), got {total}"
        )
    subject = check_subject(mail.subject, prefix + "subject")
    if not subject.strip():
        raise InvalidMail(prefix + "subject", "must not be empty")
    if len(subject) > MAX_SUBJECT_CHARS:
        raise InvalidMail(prefix + "subject", f"at most {MAX_SUBJECT_CHARS} characters")
    for name, body in (("text", mail.text), ("html", mail.html)):
        if body is not None and not isinstance(body, str):
            raise InvalidMail(prefix + name, "must be a string")
    if not mail.text and not mail.html:
        raise InvalidMail(prefix + "text", "at least one of text and html is required")
    stream = check_stream(mail.stream, prefix + "stream")
    topic = check_topic(mail.topic, stream, prefix + "topic")
    headers = check_headers(mail.headers, prefix + "headers", notification=stream == NOTIFICATION)
    if stream == NOTIFICATION and (len(to) != 1 or cc or bcc):
        raise InvalidMail(
            prefix + "to",
            "notification mail has exactly one recipient, in to: its unsubscribe link names one address",
        )
    valid = ValidMail(
        sender, to, cc, bcc, reply_to, subject, mail.text, mail.html, headers, stream=stream, topic=topic
    )
    payload = valid.to_json()
    size = len(payload.encode())
    if size > max_bytes:
        raise InvalidMail(
            prefix + "size",
            f"the mail is {size} bytes; the limit is {max_bytes} (FAIRPOST_MAX_MESSAGE_BYTES)",
        )
    return valid, payload


def _address(value: object, field_name: str) -> str:
    if not isinstance(value, str):
        raise InvalidMail(field_name, f"must be an e-mail address string, got {type(value).__name__}")
    if "\r" in value or "\n" in value:
        raise InvalidMail(field_name, "must not contain CR or LF")
    if not CONTROLS.isdisjoint(value):
        raise InvalidMail(field_name, "must not contain control characters (in the address or its name)")
    if not value.strip():
        hint = " (or set the tenant's default_sender)" if field_name.endswith("sender") else ""
        raise InvalidMail(field_name, "must be a valid e-mail address, not empty" + hint)
    # getaddresses, not parseaddr: parseaddr keeps the first of "a@x, b@y" (or of
    # "a@x <b@y>") and silently drops the rest.
    parsed = getaddresses([value])
    if len(parsed) != 1 or not parsed[0][1]:
        raise InvalidMail(field_name, "must be exactly one valid e-mail address")
    name, addr = parsed[0]
    if not addr.rpartition("@")[0].isascii():
        # SES takes no SMTPUTF8 mailbox names: such a mail would be queued only to
        # die at SES. The address stays out of the message (no recipients in errors).
        raise InvalidMail(field_name, LOCAL_PART_RULE)
    try:
        checked = validate_email(addr, check_deliverability=False)
    except EmailNotValidError as exc:
        # email-validator's reason names the rule, not the address: errors carry no recipients.
        raise InvalidMail(field_name, f"not a valid e-mail address: {exc}") from None
    # ascii_email, not normalized: normalized turns an IDNA domain back into Unicode
    # (xn--bcher-kva.example into bücher.example), and SES wants the Punycode form.
    bare = checked.ascii_email
    if bare is None:  # email-validator found SMTPUTF8 needed after all
        raise InvalidMail(field_name, LOCAL_PART_RULE)
    return formataddr((name, bare)) if name else bare


def _addresses(value: object, field_name: str) -> tuple[str, ...]:
    if isinstance(value, str):
        value = (value,)
    if not isinstance(value, Iterable):
        raise InvalidMail(field_name, "must be an address or a list of addresses")
    return tuple(_address(item, f"{field_name}[{i}]") for i, item in enumerate(value))
