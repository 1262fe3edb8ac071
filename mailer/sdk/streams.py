"""Mail streams and topics (issue #42): what a mail is, for its recipient.

Every mail belongs to one stream. ``transactional`` (the default: password
resets, receipts) is mail the recipient asked for by acting; ``notification``
is subscribed mail (alerts, digests, reports), which the recipient may stop,
topic by topic, with one click (docs/unsubscribe.md). Within a tenant the two
never wait for each other: notification mail goes through its tenant's bulk
lanes in Redis (``dispatcher/keys.py``) and a FIFO group of its own in SQS
(:func:`group_id`), while the tenant's quota stays one.

A mail of the notification stream carries ``"stream"`` and ``"topic"`` in its
JSON; a transactional mail carries neither, so its payload and SQS body are
what they were before streams existed, and a job written before them reads
as transactional.
"""

from __future__ import annotations

import json
import re
from typing import Any

from fairpost.config.tenant_id import is_valid_tenant_id
from fairpost.mailer.errors import InvalidMail

__all__ = [
    "DEFAULT_TOPIC",
    "NOTIFICATION",
    "STREAMS",
    "TOPIC_RULE",
    "TRANSACTIONAL",
    "check_stream",
    "check_topic",
    "group_id",
    "payload_stream",
    "split_group",
    "tenant_of_group",
]

TRANSACTIONAL = "transactional"
NOTIFICATION = "notification"
STREAMS = (TRANSACTIONAL, NOTIFICATION)

DEFAULT_TOPIC = "general"
"""The topic of a notification mail sent without one."""

TOPIC_RULE = "1 to 32 characters from a-z, 0-9, '_' and '-'"
_TOPIC = re.compile(r"[a-z0-9_-]{1,32}")

_GROUP_SUFFIX = ":" + NOTIFICATION
"""What a tenant's notification FIFO group adds to its id (``:`` is in no tenant id)."""

_MARK = '"stream":"' + NOTIFICATION + '"'


def check_stream(value: object, field_name: str = "stream") -> str:
    if value not in STREAMS:
        raise InvalidMail(field_name, f"must be one of {', '.join(STREAMS)}, got {value!r}")
    assert isinstance(value, str)
    return value


def check_topic(value: object, stream: str, field_name: str = "topic") -> str | None:
    """The topic of a notification mail (:data:`DEFAULT_TOPIC` if none); a transactional
    mail has none: the recipient cannot unsubscribe from it."""
    if stream == TRANSACTIONAL:
        if value is not None:
            raise InvalidMail(field_name, "only notification mail has a topic (stream='notification')")
        return None
    if value is None:
        return DEFAULT_TOPIC
    if not isinstance(value, str) or _TOPIC.fullmatch(value) is None:
        raise InvalidMail(field_name, f"must be {TOPIC_RULE}, got {value!r}")
    return value


def group_id(tenant: str, stream: str) -> str:
    """The SQS ``MessageGroupId`` of the tenant's mail of ``stream``: a FIFO group
    is served strictly in order, so a notification backlog in the tenant's own
    group would hold its transactional mail behind it."""
    return tenant if stream == TRANSACTIONAL else tenant + _GROUP_SUFFIX


def split_group(scope: str) -> tuple[str, str] | None:
    """``(tenant, stream)`` of a notification group id (:func:`group_id`); None for
    anything else (a tenant id alone included)."""
    tenant, sep, stream = scope.rpartition(":")
    if not sep or stream != NOTIFICATION or not is_valid_tenant_id(tenant):
        return None
    return tenant, stream


def tenant_of_group(group: str) -> str:
    """The tenant whose FIFO group ``group`` is (either stream's)."""
    split = split_group(group)
    return group if split is None else split[0]


def payload_stream(payload: str) -> str:
    """The stream of a job's payload (a mail's JSON, or a claim check's), read
    without parsing it unless it may be a notification's."""
    if _MARK not in payload:
        return TRANSACTIONAL
    try:
        data: Any = json.loads(payload)
    except ValueError:
        return TRANSACTIONAL
    return NOTIFICATION if isinstance(data, dict) and data.get("stream") == NOTIFICATION else TRANSACTIONAL
