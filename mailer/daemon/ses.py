"""Sending one mail through SES v2, and what each failure means.

Every SES answer falls in one of six classes, and the class decides what
the sender does (docs/design.md, "SQS and SES facts"):

========== ======================================== ===========================================
class      SES says                                 the sender
========== ======================================== ===========================================
sent       200 with a MessageId                     records it, deletes the SQS message
throttled  TooManyRequests, LimitExceeded           refunds the quota, backs off, retries
paused     AccountSuspended, SendingPaused for the  refunds, pauses the whole sender,
           account, credentials refused             keeps every job
tenant     this tenant's set-up: its identity       refunds, parks this tenant alone with a
           unverified or denied (AccessDenied,      growing backoff (reason ``ses_<code>``);
           ``ses:FromAddress``), its configuration  no attempt counted, nothing dead
           set or SES tenant missing, paused or
           disabled
permanent  MessageRejected (the mail itself, or     dead letter with the reason
           "not verified" naming only its
           recipients: SES's sandbox), bad
           request (malformed address), 4xx
transient  5xx, network errors, timeouts            retries with backoff, counts an attempt
========== ======================================== ===========================================

The scope of a refusal is decided from the error and the request (which
identity, configuration set or SES tenant it named); when that cannot tell,
from GetAccount (:class:`AccountCheck`): an account that can send means the
refusal was this tenant's.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import logging
import math
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from fairpost.config.sections import TenantSettings
from fairpost.mailer.daemon import tracing
from fairpost.mailer.daemon.aws import SesClient
from fairpost.mailer.sdk.envelope import Envelope
from fairpost.mailer.sdk.streams import NOTIFICATION

log = logging.getLogger("fairpost.sender")


class Verdict(enum.Enum):
    SENT = "sent"
    THROTTLED = "throttled"
    PAUSED = "paused"
    TENANT = "tenant"
    PERMANENT = "permanent"
    TRANSIENT = "transient"


@dataclass(frozen=True)
class SendResult:
    verdict: Verdict
    message_id: str | None = None
    error: str | None = None
    """A short, secret-free description: the SES error code and message."""
    code: str | None = None
    """SES's error code, as given (``AccessDeniedException``)."""
    scope: str = ""

    @property
    def reason(self) -> str:
        """Why a tenant waits, for stats and metrics: ``ses_<code>``."""
        return "ses_" + (self.code or "error")


_THROTTLED = {"TooManyRequestsException", "LimitExceededException", "Throttling", "ThrottlingException"}
_PAUSED = {
    "AccountSuspendedException",
    # Credentials: an operator must act; no mail or tenant is at fault.
    "UnrecognizedClientException",
    "InvalidClientTokenId",
    "ExpiredTokenException",
    "ExpiredToken",
    "SignatureDoesNotMatch",
}
_DENIED = {"AccessDeniedException", "AccessDenied"}
_TENANT_RESOURCE = re.compile(
    r":(identity|configuration-set|tenant)/|FromAddress|FromDisplayName", re.IGNORECASE
)
"""What an IAM refusal names when it is about this request's sender, configuration set or SES tenant."""
_UNVERIFIED = re.compile(r"not verified|failed the check", re.IGNORECASE)
_TENANT_NOT_FOUND = re.compile(r"configuration set|tenant", re.IGNORECASE)


_SEPARATORS = "@<>\"',;:()[]"
_WORD = r"[^\s@<>\"',;:()\[\]]"
_ADDRESS = re.compile(rf"(?<!{_WORD}){_WORD}+@{_WORD}+")
"""An address: a word, ``@``, a word. A match starts only where a word does, so a
long word without ``@`` is scanned once, not once from each of its characters."""
_NAME_WORD = r"[^\W\d_][^\s<>,;:=\"()\[\]]*"
_NAMED = re.compile(rf'(?:"(?:[^"\\]|\\.){{0,200}}"|{_NAME_WORD}(?:[ \t]+{_NAME_WORD}){{0,3}})\s*<<address>>')
"""A display name before a masked address (``Boss <<address>>``, ``"Ada L." <<address>>``):
a quoted string, or up to four words that start with a letter (so ``550 5.1.1``
before it stays). Run on the cut text only, so its work stays bounded."""
_MAX_ERROR_CHARS = 500
_SCAN_CHARS = _MAX_ERROR_CHARS + 254
"""What is read of a text: the output, and room for an address (254 characters at
most) that begins within it to be masked whole."""
_CONTROLS = {c: (" " if chr(c).isspace() else None) for c in (*range(0x20), *range(0x7F, 0xA0))}
"""C0, DEL and C1: terminal escapes must not reach a log or a terminal. Tabs and line
breaks become spaces, to keep words apart."""


def redact(message: str) -> str:
    """SES's text, safe to log, store and print: at most 500 characters, recipients
    masked with their display names, no control characters. Texts from outside can be long, and this runs on
    the event loop: the work is bounded by the output, not the input."""
    head = message[:_SCAN_CHARS]
    if len(message) > _SCAN_CHARS and _in_address(message[_SCAN_CHARS]):
        # The cut went through an address, maybe: what is left of it ("ada", "ada@")
        # the pattern cannot see as one. It goes, up to the last separator.
        end = len(head)
        while end and _in_address(head[end - 1]):
            end -= 1
        head = head[:end]
    masked = _ADDRESS.sub("<address>", head.translate(_CONTROLS))
    return _NAMED.sub("<address>", masked)[:_MAX_ERROR_CHARS]


def _in_address(char: str) -> bool:
    return char == "@" or not (char.isspace() or char in _SEPARATORS)


_UNSURE = "unsure"
"""classify's scope when only GetAccount can tell: the account, or this tenant."""


def classify(exc: Exception, request: Mapping[str, Any] | None = None) -> SendResult:
    """What an SES error means for the mail ``request`` was for (see the table above).
    May answer an ``unsure`` scope (error ``_UNSURE``): :func:`send` asks GetAccount."""
    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        code = str(error.get("Code", ""))
        message = str(error.get("Message", ""))
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        text = f"SES {code or status}: {redact(message)}".strip()
        request = request or {}

        def result(verdict: Verdict) -> SendResult:
            return SendResult(verdict, error=text, code=code or str(status))

        if code in _THROTTLED or status == 429:
            return result(Verdict.THROTTLED)
        if code in _PAUSED:
            return result(Verdict.PAUSED)
        if code == "SendingPausedException":
            # With an SES tenant named, it may be that tenant SES paused, not the account.
            return result(Verdict.PAUSED) if "TenantName" not in request else _unsure(result(Verdict.TENANT))
        if code in _DENIED:
            return (
                result(Verdict.TENANT)
                if _TENANT_RESOURCE.search(message)
                else _unsure(result(Verdict.TENANT))
            )
        if code == "MessageRejected" and _UNVERIFIED.search(message):
            # In SES's sandbox an unverified recipient is refused with the same words.
            return result(Verdict.PERMANENT if _only_recipients_named(message, request) else Verdict.TENANT)
        if code == "MailFromDomainNotVerifiedException":
            return result(Verdict.TENANT)
        if code == "NotFoundException" and _TENANT_NOT_FOUND.search(message):
            named = "ConfigurationSetName" in request or "TenantName" in request
            return result(Verdict.TENANT if named else Verdict.PERMANENT)
        if status >= 500 or status == 0:
            return result(Verdict.TRANSIENT)
        return result(Verdict.PERMANENT)
    if isinstance(exc, BotoCoreError | OSError | TimeoutError):
        return SendResult(Verdict.TRANSIENT, error=redact(f"{type(exc).__name__}: {exc}"))
    raise exc


def _only_recipients_named(message: str, request: Mapping[str, Any]) -> bool:
    """Whether the identities an "is not verified" names are this mail's recipients
    (addresses, or their domains) and none is the sender's address or domain. Naming
    nothing, or anything else, is taken for the sender's set-up, as SES means it
    outside the sandbox."""
    listed = _IDENTITIES.search(message[:_MAX_IDENTITIES_CHARS])
    named = {_bare(i) for i in listed["identities"].split(",")} - {""} if listed else set()
    sender = _bare(str(request.get("FromEmailAddress", "")))
    destination = request.get("Destination") or {}
    recipients = {
        _bare(str(a))
        for field in ("ToAddresses", "CcAddresses", "BccAddresses")
        for a in destination.get(field) or ()
    }
    if not named or not sender or any(_is_senders(i, sender) for i in named):
        return False
    domains = {r.rpartition("@")[2] for r in recipients}
    return all(i in recipients or i in domains for i in named)


_IDENTITIES = re.compile(r"failed the check(?: in region [\w-]+)?:(?P<identities>[^\n]*)", re.IGNORECASE)
_MAX_IDENTITIES_CHARS = 50 * 330
"""Room for SES's 50 recipients at their longest, and its words around them."""


def _bare(identity: str) -> str:
    """``Ada <ada@example.org>`` → ``ada@example.org``; SES compares them without case."""
    identity = identity.strip()
    if identity.endswith(">") and "<" in identity:
        identity = identity[identity.rindex("<") + 1 : -1]
    return identity.strip().strip(".").lower()


def _is_senders(identity: str, sender: str) -> bool:
    """The sender's address, or its domain or a parent of it (which SES lets it send from)."""
    domain = sender.rpartition("@")[2]
    return identity == sender or (
        "@" not in identity and (identity == domain or domain.endswith("." + identity))
    )


def _unsure(tenant_scoped: SendResult) -> SendResult:
    return dataclasses.replace(tenant_scoped, scope=_UNSURE)


class AccountCheck:
    """Can the account send? SES GetAccount (``SendingEnabled``, ``EnforcementStatus``),
    asked at most once per ``every`` seconds however many refusals need it."""

    def __init__(self, ses: SesClient, every: float = 10.0) -> None:
        self._ses = ses
        self._every = every
        self._checked_at = -math.inf
        self._enabled = True
        self._lock = asyncio.Lock()

    async def sending_enabled(self) -> bool:
        async with self._lock:
            if time.monotonic() - self._checked_at >= self._every:
                self._enabled = await self._ask()
                self._checked_at = time.monotonic()
            return self._enabled

    async def _ask(self) -> bool:
        try:
            account = await self._ses.get_account()
        except Exception as exc:  # cannot tell: hold the sender, as for credentials
            log.warning("SES GetAccount failed (%s): taking a refusal as the account's", type(exc).__name__)
            return False
        enforcement = str(account.get("EnforcementStatus", "HEALTHY")).upper()
        return bool(account.get("SendingEnabled", True)) and enforcement not in (
            "SHUTDOWN",
            "PROBATION_PAUSED",
        )


def send_email_request(env: Envelope, tenant: TenantSettings) -> dict[str, Any]:
    """The SendEmail parameters for one mail, with the tenant's SES options."""
    mail = env.mail
    body: dict[str, Any] = {}
    if mail.text:
        body["Text"] = {"Data": mail.text, "Charset": "UTF-8"}
    if mail.html:
        body["Html"] = {"Data": mail.html, "Charset": "UTF-8"}
    simple: dict[str, Any] = {"Subject": {"Data": mail.subject, "Charset": "UTF-8"}, "Body": body}
    if mail.headers:
        simple["Headers"] = [{"Name": k, "Value": v} for k, v in mail.headers.items()]
    destination: dict[str, Any] = {"ToAddresses": list(mail.to)}
    if mail.cc:
        destination["CcAddresses"] = list(mail.cc)
    if mail.bcc:
        destination["BccAddresses"] = list(mail.bcc)
    content: dict[str, Any] = {"Simple": simple}
    if mail.raw is not None:
        # A MIME message (attachments, or a claim check): its headers, Reply-To
        # included, are in it; Destination still names every recipient (Bcc too).
        content = {"Raw": {"Data": mail.raw}}
    request: dict[str, Any] = {
        "FromEmailAddress": mail.sender,
        "Destination": destination,
        "Content": content,
        "EmailTags": [
            {"Name": "fairpost-job-id", "Value": env.job_id},
            {"Name": "fairpost-tenant", "Value": env.tenant},
        ],
    }
    if mail.reply_to and mail.raw is None:
        request["ReplyToAddresses"] = list(mail.reply_to)
    if tenant.ses_tenant_name:
        request["TenantName"] = tenant.ses_tenant_name
    configuration_set = tenant.configuration_set
    if mail.stream == NOTIFICATION:
        # Its stream says so to SES's events and metrics, and may pick its own set.
        request["EmailTags"].append({"Name": "fairpost-stream", "Value": NOTIFICATION})
        configuration_set = tenant.notification_configuration_set or configuration_set
    if configuration_set:
        request["ConfigurationSetName"] = configuration_set
    return request


async def send(
    ses: SesClient, env: Envelope, tenant: TenantSettings, account: AccountCheck | None = None
) -> SendResult:
    """Send one mail; a refusal whose scope the error cannot tell is the account's
    unless ``account`` says the account can send. Traced (a CLIENT span under the
    job's processing, mailer/daemon/tracing.py) when the job's processing is."""
    job = tracing.job_trace(env.job_id)
    if job is None:
        return await _send(ses, env, tenant, account)
    call = job.ses_call()
    try:
        result = await _send(ses, env, tenant, account)
    except BaseException as exc:
        call.failed(exc)
        raise
    call.answered(result.verdict.value, result.message_id, result.error, result.code)
    return result


async def _send(
    ses: SesClient, env: Envelope, tenant: TenantSettings, account: AccountCheck | None
) -> SendResult:
    request = send_email_request(env, tenant)
    try:
        response = await ses.send_email(**request)
    except Exception as exc:  # classify() re-raises what is not an AWS or network error
        result = classify(exc, request)
        if result.scope == _UNSURE:
            enabled = account is not None and await account.sending_enabled()
            verdict = Verdict.TENANT if enabled else Verdict.PAUSED
            result = dataclasses.replace(result, verdict=verdict, scope="")
        return result
    return SendResult(Verdict.SENT, message_id=str(response.get("MessageId", "")))
