"""What SQS refuses, for :mod:`fairpost.mailer.testing.sqs_server`: its errors, and the
checks of queue attributes, request fields and message attributes.

An error is a :class:`~fairpost.mailer.errors.SqsError` (built by :class:`Refuse`): its
JSON ``__type`` and the query-protocol code
SQS sends beside it (``x-amzn-query-error``), which botocore reports as
``Error.Code``. Messages name the field and the rule, never a message's body.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Callable, Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

from fairpost.mailer.errors import SqsError

__all__ = [
    "QUEUE_ATTRIBUTES",
    "Refuse",
    "SqsError",
    "batch_entries",
    "check_throughput",
    "checked_attributes",
    "checked_body",
    "default_attributes",
    "integer",
    "message_attributes",
    "names",
    "required",
    "string",
    "string_map",
    "system_names",
    "token",
]

Request = dict[str, Any]

# -- queue attributes ------------------------------------------------------------------------

_DEFAULTS = {
    "VisibilityTimeout": "30",
    "MaximumMessageSize": "1048576",
    "MessageRetentionPeriod": "345600",
    "DelaySeconds": "0",
    "ReceiveMessageWaitTimeSeconds": "0",
    "SqsManagedSseEnabled": "true",
}
_FIFO_DEFAULTS = {
    "FifoQueue": "true",
    "ContentBasedDeduplication": "false",
    "DeduplicationScope": "queue",
    "FifoThroughputLimit": "perQueue",
}
_RANGES = {
    "VisibilityTimeout": (0, 43_200),
    "MaximumMessageSize": (1024, 1_048_576),
    "MessageRetentionPeriod": (60, 1_209_600),
    "DelaySeconds": (0, 900),
    "ReceiveMessageWaitTimeSeconds": (0, 20),
    "KmsDataKeyReusePeriodSeconds": (60, 86_400),
}
_BOOLEANS = ("FifoQueue", "ContentBasedDeduplication", "SqsManagedSseEnabled")
_CHOICES = {
    **dict.fromkeys(_BOOLEANS, ("true", "false")),
    "DeduplicationScope": ("messageGroup", "queue"),
    "FifoThroughputLimit": ("perQueue", "perMessageGroupId"),
}
_FREE_FORM = ("Policy", "RedrivePolicy", "RedriveAllowPolicy", "KmsMasterKeyId")
_FIFO_ONLY = ("ContentBasedDeduplication", "DeduplicationScope", "FifoThroughputLimit")
_COUNTED = (
    "ApproximateNumberOfMessages",
    "ApproximateNumberOfMessagesNotVisible",
    "ApproximateNumberOfMessagesDelayed",
    "CreatedTimestamp",
    "LastModifiedTimestamp",
    "QueueArn",
)
QUEUE_ATTRIBUTES = frozenset((*_RANGES, *_CHOICES, *_FREE_FORM, *_COUNTED))

# The code botocore reports (SQS's query-protocol code, sent in ``x-amzn-query-error``)
# for each error's JSON ``__type``, where the two differ.
_QUERY_CODES = {
    "QueueDoesNotExist": "AWS.SimpleQueueService.NonExistentQueue",
    "QueueNameExists": "QueueAlreadyExists",
    "InvalidParameterValueException": "InvalidParameterValue",
    "MissingRequiredParameterException": "MissingParameter",
    "MessageNotInflight": "AWS.SimpleQueueService.MessageNotInflight",
    "EmptyBatchRequest": "AWS.SimpleQueueService.EmptyBatchRequest",
    "TooManyEntriesInBatchRequest": "AWS.SimpleQueueService.TooManyEntriesInBatchRequest",
    "BatchEntryIdsNotDistinct": "AWS.SimpleQueueService.BatchEntryIdsNotDistinct",
    "InvalidBatchEntryId": "AWS.SimpleQueueService.InvalidBatchEntryId",
    "BatchRequestTooLong": "AWS.SimpleQueueService.BatchRequestTooLong",
    "UnsupportedOperation": "AWS.SimpleQueueService.UnsupportedOperation",
}


class Refuse:
    """The :class:`SqsError` SQS answers, by what was wrong."""

    @staticmethod
    def error(shape: str, message: str, status: int = 400) -> SqsError:
        return SqsError(shape, _QUERY_CODES.get(shape, shape), message, status)

    @staticmethod
    def invalid(name: str, value: object, reason: str) -> SqsError:
        message = f"Value {value} for parameter {name} is invalid. Reason: {reason}"
        return Refuse.error("InvalidParameterValueException", message)

    @staticmethod
    def missing(name: str) -> SqsError:
        return Refuse.error(
            "MissingRequiredParameterException", f"The request must contain the parameter {name}."
        )

    @staticmethod
    def no_queue() -> SqsError:
        return Refuse.error("QueueDoesNotExist", "The specified queue does not exist.")

    @staticmethod
    def bad_receipt(handle: str) -> SqsError:
        return Refuse.error(
            "ReceiptHandleIsInvalid",
            f'The input receipt handle "{handle}" is not a valid receipt handle.',
            404,
        )

    @staticmethod
    def expired(handle: str) -> SqsError:
        return Refuse.invalid("ReceiptHandle", handle, "The receipt handle has expired.")


def default_attributes(fifo: bool) -> dict[str, str]:
    return {**_DEFAULTS, **(_FIFO_DEFAULTS if fifo else {})}


def _bad_value(name: str, rule: str) -> SqsError:
    return Refuse.error("InvalidAttributeValue", f"Invalid value for the parameter {name}: {rule}")


def checked_attributes(
    attributes: Mapping[str, str], *, fifo: bool, creating: bool, find: Callable[[str], bool | None]
) -> dict[str, str]:
    """Queue attributes as SQS stores them; :class:`SqsError` naming the first bad one.
    ``find(arn)``: whether that queue is FIFO, None if there is none (a redrive target must exist)."""
    wanted: dict[str, str] = {}
    for name, raw in attributes.items():
        value = str(raw)
        if name == "FifoQueue" and not creating:
            raise Refuse.error("InvalidAttributeName", "FifoQueue can only be set when the queue is created.")
        if name not in QUEUE_ATTRIBUTES or name in _COUNTED or (name in _FIFO_ONLY and not fifo):
            raise Refuse.error("InvalidAttributeName", f"Unknown Attribute {name}.")
        if name in _RANGES:
            low, high = _RANGES[name]
            if not value.lstrip("-").isdigit() or not low <= int(value) <= high:
                raise _bad_value(name, f"must be an integer from {low} to {high}")
            value = str(int(value))
        elif name in _CHOICES:
            value = value.lower() if name in _BOOLEANS else value
            if value not in _CHOICES[name]:
                raise _bad_value(name, f"must be one of {', '.join(_CHOICES[name])}")
        elif name == "RedrivePolicy" and value:
            value = _checked_redrive(value, fifo, find)
        wanted[name] = value
    return wanted


def check_throughput(attributes: Mapping[str, str]) -> None:
    per_group = attributes.get("FifoThroughputLimit") == "perMessageGroupId"
    if per_group and attributes.get("DeduplicationScope") != "messageGroup":
        raise _bad_value("FifoThroughputLimit", "perMessageGroupId needs DeduplicationScope messageGroup")


def _checked_redrive(raw: str, fifo: bool, find: Callable[[str], bool | None]) -> str:
    try:
        policy = json.loads(raw)
        target, max_receives = str(policy["deadLetterTargetArn"]), int(policy["maxReceiveCount"])
    except (ValueError, KeyError, TypeError):
        raise Refuse.invalid(
            "RedrivePolicy", raw, "not JSON with deadLetterTargetArn and maxReceiveCount"
        ) from None
    if not 1 <= max_receives <= 1000:
        raise Refuse.invalid("RedrivePolicy", raw, "maxReceiveCount must be from 1 to 1000")
    target_fifo = find(target)
    if target_fifo is None:
        raise Refuse.invalid("RedrivePolicy", raw, "Dead letter target does not exist")
    if target_fifo != fifo:
        raise Refuse.invalid(
            "RedrivePolicy", raw, "Dead-letter queue must be same type of queue as the source"
        )
    return json.dumps({"deadLetterTargetArn": target, "maxReceiveCount": max_receives}, separators=(",", ":"))


# -- request fields --------------------------------------------------------------------------

_SYSTEM_NAMES = frozenset(
    {
        "All",
        "SenderId",
        "SentTimestamp",
        "ApproximateReceiveCount",
        "ApproximateFirstReceiveTimestamp",
        "SequenceNumber",
        "MessageDeduplicationId",
        "MessageGroupId",
        "AWSTraceHeader",
        "DeadLetterQueueSourceArn",
    }
)
_INVALID_BODY = re.compile("[^\x09\x0a\x0d\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
_ATTRIBUTE_NAME = re.compile(r"[A-Za-z0-9_\-.]{1,256}")
_BATCH_ID = re.compile(r"[A-Za-z0-9_\-]{1,80}")
_TOKEN = re.compile(r"[\x21-\x7e]{1,128}")  # group and deduplication ids: printable ASCII


def string(request: Request, name: str) -> str | None:
    value = request.get(name)
    if value is not None and not isinstance(value, str):
        raise Refuse.invalid(name, value, "must be a string")
    return value


def required(request: Request, name: str) -> str:
    value = string(request, name)
    if value is None:
        raise Refuse.missing(name)
    return value


def integer(request: Request, name: str, low: int, high: int) -> int | None:
    value = request.get(name)
    if value is not None and (
        isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high
    ):
        raise Refuse.invalid(name, value, f"Must be between {low} and {high}, if provided.")
    return value


def names(request: Request, name: str) -> list[str]:
    value = request.get(name) or []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise Refuse.invalid(name, value, "must be a list of strings")
    return value


def string_map(request: Request, name: str) -> dict[str, str]:
    value = request.get(name) or {}
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise Refuse.invalid(name, "(map)", "must map names to strings")
    return value


def token(request: Request, name: str) -> str | None:
    """A group or deduplication id (or a receive attempt id)."""
    value = string(request, name)
    if value is not None and not _TOKEN.fullmatch(value):
        raise Refuse.invalid(name, value, "1 to 128 letters, digits or punctuation")
    return value


def system_names(request: Request) -> set[str]:
    """The attributes a receive asks for, old name and new; the old one also takes queue attributes."""
    wanted = set(names(request, "AttributeNames")) | set(names(request, "MessageSystemAttributeNames"))
    unknown = sorted(wanted - _SYSTEM_NAMES - QUEUE_ATTRIBUTES)
    if unknown:
        raise Refuse.error("InvalidAttributeName", f"Unknown Attribute {unknown[0]}.")
    return wanted


def checked_body(request: Request) -> str:
    body = request.get("MessageBody")
    if not isinstance(body, str) or not body:
        raise Refuse.missing("MessageBody")
    if _INVALID_BODY.search(body):
        raise Refuse.error(
            "InvalidMessageContents",
            "Invalid characters found. Valid unicode characters are #x9 | #xA | #xD | #x20 to #xD7FF | "
            "#xE000 to #xFFFD | #x10000 to #x10FFFF",
        )
    return body


def message_attributes(raw: object, *, system: bool = False) -> dict[str, dict[str, str]]:
    """Message attributes (or system attributes: AWSTraceHeader) as SQS checks them;
    binary values stay in base64, as JSON carries them."""
    what = "MessageSystemAttributes" if system else "MessageAttributes"
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise Refuse.invalid(what, "(map)", "must map names to attribute values")
    if len(raw) > 10:
        raise Refuse.invalid(what, len(raw), f"Number of message attributes [{len(raw)}] exceeds 10.")
    checked: dict[str, dict[str, str]] = {}
    for name, value in raw.items():
        if system and name != "AWSTraceHeader":
            raise Refuse.invalid(what, name, "only AWSTraceHeader is a message system attribute")
        reserved = name.lower().startswith(("aws.", "amazon."))
        if not _ATTRIBUTE_NAME.fullmatch(name) or reserved or ".." in name or "." in (name[0], name[-1]):
            raise Refuse.invalid(f"{what}.Name", name, "letters, digits, _ - and . (not AWS. or Amazon.)")
        if not isinstance(value, dict) or not isinstance(value.get("DataType"), str):
            raise Refuse.invalid(f"{what}.{name}", "(value)", "DataType is required")
        data_type = value["DataType"]
        base = data_type.split(".", 1)[0]
        if base not in ("String", "Number", "Binary") or (system and data_type != "String"):
            raise Refuse.invalid(f"{what}.{name}.DataType", data_type, "String, Number or Binary")
        if "StringListValues" in value or "BinaryListValues" in value:
            raise Refuse.invalid(f"{what}.{name}", "(list)", "list values are not supported")
        field = "BinaryValue" if base == "Binary" else "StringValue"
        text = value.get(field)
        if not isinstance(text, str) or not text:
            raise Refuse.invalid(f"{what}.{name}.{field}", "(value)", "must not be empty")
        try:
            if base == "Binary":
                base64.b64decode(text, validate=True)
            elif base == "Number":
                Decimal(text)
        except (binascii.Error, InvalidOperation):
            raise Refuse.invalid(f"{what}.{name}.{field}", "(value)", f"not a valid {base}") from None
        checked[name] = {"DataType": data_type, field: text}
    return checked


def batch_entries(request: Request, what: str) -> list[Request]:
    """A batch's entries: 1 to 10, each with a distinct, well-formed ``Id``."""
    entries = request.get("Entries")
    if entries is None:
        raise Refuse.missing("Entries")
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise Refuse.invalid("Entries", "(list)", "must be a list of entries")
    if not entries:
        raise Refuse.error(
            "EmptyBatchRequest", f"There should be at least one {what}RequestEntry in the request."
        )
    if len(entries) > 10:
        raise Refuse.error(
            "TooManyEntriesInBatchRequest",
            f"Maximum number of entries per request are 10. You have sent {len(entries)}.",
        )
    ids = [entry.get("Id") for entry in entries]
    if not all(isinstance(i, str) and _BATCH_ID.fullmatch(i) for i in ids):
        raise Refuse.error(
            "InvalidBatchEntryId",
            "A batch entry id can only contain alphanumeric characters, hyphens and underscores. "
            "It can be at most 80 letters long.",
        )
    repeated = next((i for i in ids if ids.count(i) > 1), None)
    if repeated is not None:
        raise Refuse.error("BatchEntryIdsNotDistinct", f"Id {repeated} repeated.")
    return entries
