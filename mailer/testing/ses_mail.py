"""What the recording SES server deals in: requests, mails, errors and windows.

:class:`SentMail` is one ``SendEmail`` request as parsed
(:func:`parse_send_email`, which refuses what SES's wire format refuses) and
checked as SES checks a message (:func:`validation_problem`). :class:`SesError`
is one error answer, and :class:`Faults` names every one fairpost handles.
:class:`Rejection` records a refused call. :func:`max_in_window` counts the
recipients sent in any sliding window, to check a rate after the fact.

No HTTP and no server state here: :mod:`fairpost.mailer.testing.ses_server`
serves these, and :mod:`fairpost.mailer.testing.ses_tenancy` builds SES events
from a :class:`SentMail`.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json
import uuid
from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from email import policy
from email.parser import BytesHeaderParser
from email.utils import getaddresses, parseaddr
from typing import Any, Literal

from fairpost.mailer.errors import RefusedRequest

__all__ = [
    "JOB_ID_TAG",
    "MAX_RECIPIENTS",
    "Faults",
    "RejectReason",
    "Rejection",
    "SentMail",
    "SesError",
    "max_in_window",
    "max_in_window_by",
    "parse_send_email",
    "validation_problem",
]

JOB_ID_TAG = "fairpost-job-id"
"""The ``EmailTags`` name under which fairpost passes a mail's job id."""

MAX_RECIPIENTS = 50
"""SES refuses a message with more recipients (To + Cc + Bcc) than this."""


@dataclass(frozen=True)
class SesError:
    """One error answer: what a SendEmail call gets instead of a MessageId.

    ``action="answer"`` answers ``status`` with ``x-amzn-ErrorType: code`` and a
    ``{"message": ...}`` JSON body (``code=None``: an HTML body and no header, as
    from a load balancer, which botocore reports with ``Code == str(status)``).
    ``"close"`` closes the connection without answering and ``"reset"`` resets
    it (TCP RST); botocore raises ``ConnectionClosedError`` for both.
    ``delay`` seconds pass before the answer (or the drop), e.g. to trip the
    client's read timeout.
    """

    code: str | None
    status: int
    message: str = ""
    action: Literal["answer", "close", "reset"] = "answer"
    delay: float = 0.0

    def with_message(self, message: str) -> SesError:
        return dataclasses.replace(self, message=message)

    def delayed(self, seconds: float) -> SesError:
        return dataclasses.replace(self, delay=seconds)

    @property
    def is_network_error(self) -> bool:
        return self.action != "answer"


class Faults:
    """Every error class fairpost handles, as SES v2 answers it."""

    # Throttled: refund the quota, back off, retry.
    TOO_MANY_REQUESTS = SesError("TooManyRequestsException", 429, "Maximum sending rate exceeded.")
    LIMIT_EXCEEDED = SesError("LimitExceededException", 400, "Daily message quota exceeded.")
    # Account-wide stop: pause the sender, keep every job.
    SENDING_PAUSED = SesError("SendingPausedException", 400, "Sending is paused for this account.")
    ACCOUNT_SUSPENDED = SesError(
        "AccountSuspendedException", 400, "The account has been suspended and cannot send email."
    )
    # One tenant's own SES set-up: that tenant alone waits (mailer/daemon/ses.py).
    ACCESS_DENIED_IDENTITY = SesError(
        "AccessDeniedException",
        403,
        "User: arn:aws:iam::123456789012:user/fairpost is not authorized to perform: ses:SendEmail "
        "on resource: arn:aws:ses:us-east-1:123456789012:identity/bad.example",
    )
    ACCESS_DENIED_FROM_ADDRESS = SesError(
        "AccessDeniedException",
        403,
        "User: arn:aws:iam::123456789012:user/fairpost is not authorized to perform: ses:SendEmail "
        "with an explicit deny in an identity-based policy (condition ses:FromAddress)",
    )
    ACCESS_DENIED = SesError("AccessDeniedException", 403, "Access denied.")
    """No resource named: only GetAccount can tell the account's refusal from the tenant's."""
    IDENTITY_NOT_VERIFIED = SesError(
        "MessageRejected",
        400,
        "Email address is not verified. The following identities failed the check in region "
        "US-EAST-1: app@bad.example",
    )
    CONFIGURATION_SET_MISSING = SesError(
        "NotFoundException", 404, "Configuration set <bad-events> does not exist."
    )
    TENANT_SENDING_PAUSED = SesError("SendingPausedException", 400, "Sending is paused for this tenant.")
    # Permanent: dead letter with the reason.
    MESSAGE_REJECTED = SesError("MessageRejected", 400, "The message was rejected.")
    MAIL_FROM_DOMAIN_NOT_VERIFIED = SesError(
        "MailFromDomainNotVerifiedException", 400, "The MAIL FROM domain is not verified."
    )
    BAD_REQUEST = SesError("BadRequestException", 400, "Missing final '@domain'")
    NOT_FOUND = SesError("NotFoundException", 404, "The resource does not exist.")
    # Transient: retry with backoff, counted as attempts.
    INTERNAL_SERVICE_ERROR = SesError(
        "InternalServiceErrorException", 500, "An error occurred with the Amazon SES API v2."
    )
    INTERNAL_FAILURE = SesError(
        "InternalFailure", 500, "The request processing has failed because of an unknown error."
    )
    SERVICE_UNAVAILABLE = SesError(
        "ServiceUnavailable", 503, "The request has failed due to a temporary failure of the server."
    )
    PLAIN_500 = SesError(None, 500, "Internal Server Error")
    PLAIN_503 = SesError(None, 503, "Service Unavailable")
    DROP_CONNECTION = SesError(None, 0, action="close")
    RESET_CONNECTION = SesError(None, 0, action="reset")

    @classmethod
    def all(cls) -> tuple[SesError, ...]:
        return tuple(value for value in vars(cls).values() if isinstance(value, SesError))


@dataclass(frozen=True)
class SentMail:
    """One SendEmail request as parsed; recorded when SES accepted it.

    ``to``/``cc``/``bcc`` are the envelope recipients: ``Destination`` if given,
    else (raw content) the message's To/Cc/Bcc headers. ``subject`` is
    ``Simple.Subject.Data`` or the raw message's Subject header. ``monotonic``
    and ``wall_time`` are taken when the server decided (the order of ``sent``).
    """

    message_id: str = ""
    monotonic: float = 0.0
    wall_time: float = 0.0
    from_address: str | None = None
    to: tuple[str, ...] = ()
    cc: tuple[str, ...] = ()
    bcc: tuple[str, ...] = ()
    subject: str | None = None
    raw_size: int | None = None
    raw_data: bytes | None = field(default=None, repr=False)
    template_name: str | None = None
    tenant_name: str | None = None
    configuration_set_name: str | None = None
    tags: Mapping[str, str] = field(default_factory=dict)
    reply_to: tuple[str, ...] = ()
    user_agent: str = ""
    """The request's ``User-Agent`` header: which client sent it."""
    headers: tuple[tuple[str, str], ...] = ()
    """The message's headers as a mailbox would read them: ``Simple.Headers``, or the
    raw message's header section parsed (folding undone, encoded words left encoded)."""

    def header(self, name: str) -> str | None:
        return next((v for n, v in self.headers if n.lower() == name.lower()), None)

    @property
    def recipients(self) -> tuple[str, ...]:
        return self.to + self.cc + self.bcc

    @property
    def recipient_count(self) -> int:
        return len(self.to) + len(self.cc) + len(self.bcc)

    @property
    def job_id(self) -> str | None:
        return self.tags.get(JOB_ID_TAG)

    def tag(self, name: str) -> str | None:
        return self.tags.get(name)


RejectReason = Literal[
    "down", "injected", "rule", "paused", "unverified", "not_found", "invalid", "daily", "rate"
]


@dataclass(frozen=True)
class Rejection:
    """A SendEmail call that got an error (or a dropped connection) instead of a MessageId."""

    monotonic: float
    wall_time: float
    reason: RejectReason
    error: SesError
    mail: SentMail | None  # None when the request could not be parsed

    @property
    def code(self) -> str | None:
        return self.error.code


def max_in_window(
    mails: Iterable[SentMail], seconds: float, key: Callable[[SentMail], Hashable] | None = None
) -> int:
    """Most recipients in any half-open window ``[t, t + seconds)`` of ``SentMail.monotonic``.

    Mails exactly ``seconds`` apart fall in different windows. With ``key``
    (e.g. ``lambda m: m.tenant_name`` or ``lambda m: m.tag("x")``), windows
    are counted per key value and the largest of them is returned.
    """
    by_key = max_in_window_by(mails, seconds, key if key is not None else (lambda _mail: None))
    return max(by_key.values(), default=0)


def max_in_window_by(
    mails: Iterable[SentMail], seconds: float, key: Callable[[SentMail], Hashable]
) -> dict[Hashable, int]:
    """Per value of ``key``, most recipients in any window ``[t, t + seconds)``."""
    if seconds <= 0:
        raise ValueError("seconds must be > 0")
    groups: dict[Hashable, list[SentMail]] = defaultdict(list)
    for mail in sorted(mails, key=lambda m: m.monotonic):
        groups[key(mail)].append(mail)
    return {k: _max_window(group, seconds) for k, group in groups.items()}


def _max_window(mails: list[SentMail], seconds: float) -> int:
    """Sliding two pointers over mails sorted by time."""
    best = total = start = 0
    for mail in mails:
        total += mail.recipient_count
        while mail.monotonic - mails[start].monotonic >= seconds:
            total -= mails[start].recipient_count
            start += 1
        best = max(best, total)
    return best


# -- the request ---------------------------------------------------------------------------


def _refused(error: SesError) -> RefusedRequest:
    return RefusedRequest(error.code or str(error.status), error.status, error.message)


def _strings(value: object, what: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _refused(Faults.BAD_REQUEST.with_message(f"{what} must be a list of strings"))
    return tuple(value)


def _opt_str(value: object) -> str | None:
    return value if isinstance(value, str) else None


def parse_send_email(body: bytes) -> SentMail:
    """A SendEmail request body as a :class:`SentMail` (not yet timed).

    Raises :class:`RefusedRequest` as SES answers a request it cannot read.
    """
    request = _json_object(body)
    destination = request.get("Destination")
    destination = destination if isinstance(destination, dict) else None
    kind, content = _content(request)
    from_address = _opt_str(request.get("FromEmailAddress"))
    to = _strings(destination.get("ToAddresses"), "ToAddresses") if destination else ()
    cc = _strings(destination.get("CcAddresses"), "CcAddresses") if destination else ()
    bcc = _strings(destination.get("BccAddresses"), "BccAddresses") if destination else ()
    subject: str | None = None
    raw_data: bytes | None = None
    template_name: str | None = None
    message_headers: tuple[tuple[str, str], ...] = ()
    if kind == "Simple":
        subject_part = content.get("Subject")
        subject = _opt_str(subject_part.get("Data")) if isinstance(subject_part, dict) else None
        given = content.get("Headers")
        if isinstance(given, list):
            message_headers = tuple(
                (str(h.get("Name")), str(h.get("Value"))) for h in given if isinstance(h, dict)
            )
    elif kind == "Raw":
        raw_data = _raw_data(content)
        headers = BytesHeaderParser(policy=policy.default).parsebytes(raw_data)
        message_headers = _unfolded_headers(raw_data)
        header_subject = headers.get("Subject")
        subject = None if header_subject is None else str(header_subject)
        if from_address is None and headers.get("From") is not None:
            from_address = str(headers["From"])
        if destination is None:
            to, cc, bcc = (
                tuple(addr for _, addr in getaddresses([str(h) for h in headers.get_all(name, [])]) if addr)
                for name in ("To", "Cc", "Bcc")
            )
    else:
        template_name = _opt_str(content.get("TemplateName"))
    return SentMail(
        message_id=f"0100{uuid.uuid4().hex[:12]}-{uuid.uuid4()}-000000",
        monotonic=0.0,
        wall_time=0.0,
        from_address=from_address,
        to=to,
        cc=cc,
        bcc=bcc,
        subject=subject,
        raw_size=None if raw_data is None else len(raw_data),
        raw_data=raw_data,
        template_name=template_name,
        tenant_name=_opt_str(request.get("TenantName")),
        configuration_set_name=_opt_str(request.get("ConfigurationSetName")),
        tags=_tags(request.get("EmailTags")),
        reply_to=_strings(request.get("ReplyToAddresses"), "ReplyToAddresses"),
        headers=message_headers,
    )


def _json_object(body: bytes) -> dict[str, Any]:
    try:
        request = json.loads(body or b"{}")
    except ValueError as exc:
        raise _refused(SesError("SerializationException", 400, f"Malformed JSON: {exc}")) from None
    if not isinstance(request, dict):
        raise _refused(SesError("SerializationException", 400, "Expected a JSON object"))
    return request


def _content(request: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The request's one kind of content (Simple, Raw or Template), and its part."""
    content = request.get("Content")
    if not isinstance(content, dict):
        raise _refused(Faults.BAD_REQUEST.with_message("Content is required"))
    kinds = [k for k in ("Simple", "Raw", "Template") if isinstance(content.get(k), dict)]
    if len(kinds) != 1:
        raise _refused(
            Faults.BAD_REQUEST.with_message("Content must have exactly one of Simple, Raw or Template")
        )
    return kinds[0], content[kinds[0]]


def _raw_data(raw: dict[str, Any]) -> bytes:
    encoded = raw.get("Data")
    if not isinstance(encoded, str):
        raise _refused(Faults.BAD_REQUEST.with_message("Raw.Data is required"))
    try:
        return base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise _refused(Faults.BAD_REQUEST.with_message("Raw.Data is not valid base64")) from None


def _unfolded_headers(raw_data: bytes) -> tuple[tuple[str, str], ...]:
    """Unfolded as RFC 5322 says (CRLF + white space is one space), never decoded."""
    return tuple(
        (name, " ".join(value.split()))
        for name, value in BytesHeaderParser(policy=policy.compat32).parsebytes(raw_data).items()
    )


def _tags(raw_tags: object) -> dict[str, str]:
    tags: dict[str, str] = {}
    if isinstance(raw_tags, list):
        for tag in raw_tags:
            if isinstance(tag, dict) and isinstance(tag.get("Name"), str):
                tags[tag["Name"]] = str(tag.get("Value", ""))
    return tags


def _address_problem(address: str) -> str | None:
    addr = parseaddr(address)[1]
    local, at, domain = addr.rpartition("@")
    if not at or not local or not domain:
        return f"Missing final '@domain': {address}"
    if any(c.isspace() for c in addr) or "." not in domain:
        return f"Illegal address: {address}"
    return None


def validation_problem(mail: SentMail) -> str | None:
    """Why SES refuses ``mail`` as a message (sender, recipients, addresses); None if it would not."""
    if not mail.from_address:
        return "Missing required parameter: FromEmailAddress"
    if mail.recipient_count == 0:
        return "Missing required header 'To'."
    if mail.recipient_count > MAX_RECIPIENTS:
        return f"Recipient count exceeds {MAX_RECIPIENTS}."
    for address in (mail.from_address, *mail.recipients):
        problem = _address_problem(address)
        if problem is not None:
            return problem
    return None
