"""Sending one mail through SES v2, and what each failure means.

Every SES answer falls in one of five classes, and the class decides what
the sender does (docs/design.md, "SQS and SES facts"):

========== ======================================== ===========================================
class      SES says                                 the sender
========== ======================================== ===========================================
sent       200 with a MessageId                     records it, deletes the SQS message
throttled  TooManyRequests, LimitExceeded           refunds the quota, backs off, retries
paused     SendingPaused, AccountSuspended, and     refunds, pauses the whole sender,
           credentials refused                      keeps every job
permanent  MessageRejected, unverified sender,      dead letter with the reason
           bad request (malformed address), 4xx
transient  5xx, network errors, timeouts            retries with backoff, counts an attempt
========== ======================================== ===========================================
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from config.settings import TenantSettings
from mailer.daemon.aws import SesClient
from mailer.sdk.envelope import Envelope


class Verdict(enum.Enum):
    SENT = "sent"
    THROTTLED = "throttled"
    PAUSED = "paused"
    PERMANENT = "permanent"
    TRANSIENT = "transient"


@dataclass(frozen=True)
class SendResult:
    verdict: Verdict
    message_id: str | None = None
    error: str | None = None
    """A short, secret-free description: the SES error code and message."""


_THROTTLED = {"TooManyRequestsException", "LimitExceededException", "Throttling", "ThrottlingException"}
_PAUSED = {
    "SendingPausedException",
    "AccountSuspendedException",
    # Credentials or permissions: an operator must act; no mail is at fault.
    "AccessDeniedException",
    "AccessDenied",
    "UnrecognizedClientException",
    "InvalidClientTokenId",
    "ExpiredTokenException",
    "ExpiredToken",
    "SignatureDoesNotMatch",
}


_ADDRESS = re.compile(r"[^\s@<>\"',;:()\[\]]+@[^\s@<>\"',;:()\[\]]+")
_MAX_ERROR_CHARS = 500


def redact(message: str) -> str:
    """SES's error text may list recipients; logs and job records must not."""
    return _ADDRESS.sub("<address>", message)[:_MAX_ERROR_CHARS]


def classify(exc: Exception) -> SendResult:
    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        code = str(error.get("Code", ""))
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        text = f"SES {code or status}: {redact(str(error.get('Message', '')))}".strip()
        if code in _THROTTLED or status == 429:
            return SendResult(Verdict.THROTTLED, error=text)
        if code in _PAUSED:
            return SendResult(Verdict.PAUSED, error=text)
        if status >= 500 or status == 0:
            return SendResult(Verdict.TRANSIENT, error=text)
        return SendResult(Verdict.PERMANENT, error=text)
    if isinstance(exc, BotoCoreError | OSError | TimeoutError):
        return SendResult(Verdict.TRANSIENT, error=redact(f"{type(exc).__name__}: {exc}"))
    raise exc


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
    if tenant.configuration_set:
        request["ConfigurationSetName"] = tenant.configuration_set
    return request


async def send(ses: SesClient, env: Envelope, tenant: TenantSettings) -> SendResult:
    try:
        response = await ses.send_email(**send_email_request(env, tenant))
    except Exception as exc:  # classify() re-raises what is not an AWS or network error
        return classify(exc)
    return SendResult(Verdict.SENT, message_id=str(response.get("MessageId", "")))
