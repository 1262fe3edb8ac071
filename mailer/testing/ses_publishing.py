"""SES's event publishing, for :class:`SesServer` and the tests: records and their delivery.

:func:`ses_event` builds an event-publishing record for a sent mail (Bounce,
Complaint, Delivery, Reject, DeliveryDelay, Send) and :func:`received_record`
a receipt notification; :func:`wrap` gives the SQS body SNS (``sns``), SNS raw
delivery (``raw``) or EventBridge (``eventbridge``) delivers for a record.
:class:`EventSink` puts them on an SQS queue (moto); :func:`simulator_events`
gives the events SES's mailbox simulator produces for a recipient
(``bounce@``, ``complaint@``, ``success@``, ``suppressionlist@``
``simulator.amazonses.com``, with ``+label`` allowed).
"""

from __future__ import annotations

import json
import queue
import threading
import time
import uuid
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any, Literal

from fairpost.mailer.testing.ses_mail import SentMail
from fairpost.mailer.testing.ses_tenancy import ACCOUNT, REGION

__all__ = [
    "SIMULATOR_DOMAIN",
    "Envelope",
    "EventSink",
    "received_record",
    "ses_event",
    "simulator_events",
    "wrap",
]

SIMULATOR_DOMAIN = "simulator.amazonses.com"

Envelope = Literal["sns", "raw", "eventbridge"]

_DETAIL_TYPES = {
    "Bounce": "Email Bounced",
    "Complaint": "Email Complaint Received",
    "Delivery": "Email Delivered",
    "Reject": "Email Rejected",
    "DeliveryDelay": "Email Delivery Delayed",
    "Send": "Email Sent",
}


def _iso(at: float | None = None) -> str:
    return datetime.fromtimestamp(at or time.time(), tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def ses_event(
    event_type: str, mail: SentMail, recipients: Iterable[str] = (), *, bounce_type: str = "Permanent",
    bounce_subtype: str = "General",
) -> dict[str, Any]:  # fmt: skip
    """An SES event-publishing record for ``mail``, as the SES docs show it."""
    tags: dict[str, list[str]] = {name: [value] for name, value in mail.tags.items()}
    if mail.configuration_set_name:
        tags["ses:configuration-set"] = [mail.configuration_set_name]
    record: dict[str, Any] = {
        "eventType": event_type,
        "mail": {
            "timestamp": _iso(mail.wall_time),
            "source": mail.from_address,
            "sendingAccountId": ACCOUNT,
            "messageId": mail.message_id,
            "destination": list(mail.recipients),
            "headersTruncated": False,
            "tags": tags,
        },
    }
    record.update(_details(event_type, list(recipients), bounce_type, bounce_subtype))
    return record


def _details(event_type: str, listed: list[str], bounce_type: str, bounce_subtype: str) -> dict[str, Any]:
    """The part of an event record that its type adds (none for ``Send``)."""
    now = _iso()
    if event_type == "Bounce":
        return {
            "bounce": {
                "bounceType": bounce_type,
                "bounceSubType": bounce_subtype,
                "bouncedRecipients": [
                    {
                        "emailAddress": r,
                        "action": "failed",
                        "status": "5.1.1",
                        "diagnosticCode": f"smtp; 550 5.1.1 <{r}>: user unknown",
                    }
                    for r in listed
                ],
                "timestamp": now,
                "feedbackId": f"0100{uuid.uuid4().hex}-000000",
                "reportingMTA": "dsn; a1-2.smtp-out.amazonses.com",
            }
        }
    if event_type == "Complaint":
        return {
            "complaint": {
                "complainedRecipients": [{"emailAddress": r} for r in listed],
                "timestamp": now,
                "feedbackId": f"0100{uuid.uuid4().hex}-000000",
                "complaintFeedbackType": "abuse",
            }
        }
    if event_type == "Delivery":
        return {
            "delivery": {
                "timestamp": now,
                "processingTimeMillis": 500,
                "recipients": listed,
                "smtpResponse": "250 2.6.0 Message received",
                "reportingMTA": "a1-2.smtp-out.amazonses.com",
            }
        }
    if event_type == "Reject":
        return {"reject": {"reason": "Bad content"}}
    if event_type == "DeliveryDelay":
        return {
            "deliveryDelay": {
                "timestamp": now,
                "delayType": "MailboxFull",
                "expirationTime": _iso(time.time() + 86_400),
                "delayedRecipients": [
                    {"emailAddress": r, "status": "4.2.2", "diagnosticCode": "smtp; 452 4.2.2 full"}
                    for r in listed
                ],
            }
        }
    return {}


def received_record(
    sender: str, recipients: Iterable[str], *, subject: str = "unsubscribe"
) -> dict[str, Any]:
    """A receipt notification for mail SES received (a receipt rule's SNS action,
    ``Encoding`` UTF-8 without the content), as the SES developer guide shows it."""
    listed = list(recipients)
    return {
        "notificationType": "Received",
        "mail": {
            "timestamp": _iso(),
            "source": sender,
            "messageId": uuid.uuid4().hex,
            "destination": listed,
            "headersTruncated": False,
            "commonHeaders": {"from": [sender], "to": listed, "subject": subject},
        },
        "receipt": {
            "timestamp": _iso(),
            "processingTimeMillis": 222,
            "recipients": listed,
            "spamVerdict": {"status": "PASS"},
            "virusVerdict": {"status": "PASS"},
            "spfVerdict": {"status": "PASS"},
            "dkimVerdict": {"status": "PASS"},
            "dmarcVerdict": {"status": "PASS"},
            "action": {
                "type": "SNS",
                "topicArn": f"arn:aws:sns:{REGION}:{ACCOUNT}:fairpost-ses-events",
                "encoding": "UTF8",
            },
        },
    }


def wrap(record: dict[str, Any], envelope: Envelope) -> str:
    """The SQS body SNS or EventBridge delivers for ``record``."""
    if envelope == "raw":
        return json.dumps(record)
    if envelope == "sns":
        return json.dumps(
            {
                "Type": "Notification",
                "MessageId": str(uuid.uuid4()),
                "TopicArn": f"arn:aws:sns:{REGION}:{ACCOUNT}:fairpost-ses-events",
                "Subject": "Amazon SES Email Event Notification",
                "Message": json.dumps(record),
                "Timestamp": _iso(),
                "SignatureVersion": "1",
                "Signature": "EXAMPLE",
                "SigningCertURL": "https://sns.us-east-1.amazonaws.com/SimpleNotificationService-EXAMPLE.pem",
                "UnsubscribeURL": "https://sns.us-east-1.amazonaws.com/?Action=Unsubscribe",
            }
        )
    config_set = record["mail"]["tags"].get("ses:configuration-set", ["default"])[0]
    return json.dumps(
        {
            "version": "0",
            "id": str(uuid.uuid4()),
            "detail-type": _DETAIL_TYPES.get(record["eventType"], "Email " + record["eventType"]),
            "source": "aws.ses",
            "account": ACCOUNT,
            "time": _iso(),
            "region": REGION,
            "resources": [f"arn:aws:ses:{REGION}:{ACCOUNT}:configuration-set/{config_set}"],
            "detail": record,
        }
    )


def simulator_events(mail: SentMail) -> list[dict[str, Any]]:
    """What SES's mailbox simulator reports for the mail's simulator recipients."""
    events = []
    for recipient in mail.recipients:
        local, _, domain = recipient.rpartition("<")[2].rstrip(">").partition("@")
        if domain.lower() != SIMULATOR_DOMAIN:
            continue
        box = local.split("+", 1)[0].lower()
        if box == "bounce":
            events.append(ses_event("Bounce", mail, [recipient]))
        elif box == "suppressionlist":
            events.append(ses_event("Bounce", mail, [recipient], bounce_subtype="OnAccountSuppressionList"))
        elif box == "complaint":
            events += [ses_event("Delivery", mail, [recipient]), ses_event("Complaint", mail, [recipient])]
        elif box in ("success", "ooto"):
            events.append(ses_event("Delivery", mail, [recipient]))
    return events


class EventSink:
    """Puts SES events on an SQS queue, in order, from a thread of its own (as SES
    publishes them a moment after accepting the mail)."""

    def __init__(self, sqs: Any, queue_url: str, envelope: Envelope = "sns") -> None:
        self.sqs = sqs
        self.queue_url = queue_url
        self.envelope: Envelope = envelope
        self._queue: queue.Queue[str | None] = queue.Queue()
        self.published = 0
        self._thread = threading.Thread(target=self._run, name="ses-event-sink", daemon=True)
        self._thread.start()

    def emit(self, record: dict[str, Any]) -> None:
        self._queue.put(wrap(record, self.envelope))

    def emit_body(self, body: str) -> None:
        """Any body at all (an unreadable one, say)."""
        self._queue.put(body)

    def _run(self) -> None:
        while (body := self._queue.get()) is not None:
            self.sqs.send_message(QueueUrl=self.queue_url, MessageBody=body)
            self.published += 1
            self._queue.task_done()
        self._queue.task_done()

    def flush(self, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while self._queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.01)

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=5)
