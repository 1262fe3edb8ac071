"""The outcome feed's events: their types, their format, and how they are written.

Every fact an application cares about in a mail's life (sent, delivered,
bounced, dead, ...) is one event in the journal, the Redis stream
:meth:`MailKeys.outcomes` (``dispatcher/journal.py``), appended in the same atomic
step as the state change that causes it. This module owns the event format
(version :data:`FORMAT_VERSION`, docs/outcomes.md): what the mail side gives
for an entry (:func:`entry`) and how an entry reads as an :class:`Outcome`
(:func:`from_entry`). The SDK's readers (:mod:`.stream`) and the webhook
deliveries (``mailer/daemon/webhooks``) both read it from here, so an event
reads the same everywhere and its body is the same on every delivery.

An entry written by a dispatcher script that ended a job carries ``state``
and the record fields the journal copies (tenant, idempotency key, dead
reason); one the mail side wrote carries ``type`` and ``data`` (JSON).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from fairpost.dispatcher.calls import CANCELLED
from fairpost.dispatcher.replies import text
from fairpost.mailer.errors import NewerFormat

__all__ = [
    "EVENT_TYPES",
    "FORMAT_VERSION",
    "Outcome",
    "entry",
    "from_entry",
    "iso_timestamp",
    "readable",
    "stream_id",
]

FORMAT_VERSION = 1
"""The events' format. Fields are only ever added within a version; a change
that removes or renames one would come with new event types, or a new version.
An entry says its version in :data:`VERSION_FIELD`; version 1's entries need
not (none had the field before 0.1.0), so an entry without it is version 1."""

VERSION_FIELD = "v"
EVENT_FORMAT = "outcome_event"
"""What :class:`~fairpost.mailer.errors.NewerFormat` names for an entry of a newer version."""

SENT = "mail.sent"
DELIVERED = "mail.delivered"
DELAYED = "mail.delayed"
BOUNCED = "mail.bounced"
COMPLAINED = "mail.complained"
REJECTED = "mail.rejected"
SUPPRESSED = "mail.suppressed"
DEAD = "mail.dead"
CANCELLED_TYPE = "mail.cancelled"
HELD = "mail.held"
"""The mail waits for a hold of its tenant at its recipients' provider (the per-provider
reputation guard); written when it starts to wait so, not at each recheck."""
UNSUBSCRIBED = "recipient.unsubscribed"

EVENT_TYPES = (
    SENT, DELIVERED, DELAYED, BOUNCED, COMPLAINED, REJECTED, SUPPRESSED, DEAD, CANCELLED_TYPE, HELD,
    UNSUBSCRIBED,
)  # fmt: skip
"""Every event type, in the order of a mail's life, then the recipient's."""

RECIPIENT_TYPES = (UNSUBSCRIBED,)
"""Events about a tenant's recipient, not about one mail: their ``job_id`` is None."""

_BY_STATE = {"sent": SENT, "suppressed": SUPPRESSED, "dead": DEAD}


@dataclass(frozen=True)
class Outcome:
    """One event of the feed: ``{"type", "timestamp", "data"}`` and its id."""

    id: str
    """Unique and stable: the stream entry's id (``<ms>-<seq>``); the ``webhook-id`` of its deliveries."""
    type: str
    """One of :data:`EVENT_TYPES`."""
    timestamp: datetime
    """When it happened (Redis's clock, to the millisecond, UTC)."""
    data: dict[str, Any] = field(default_factory=dict)
    """``job_id``, ``tenant_id``, ``idempotency_key`` (or None), ``ses_message_id``
    (or None), and the type's own fields (docs/outcomes.md)."""

    @property
    def tenant(self) -> str:
        return str(self.data.get("tenant_id") or "")

    @property
    def job_id(self) -> str:
        return str(self.data.get("job_id") or "")

    def to_json(self) -> dict[str, Any]:
        """The event as its body has it: ``type``, ``timestamp`` (ISO 8601), ``data``."""
        return {"type": self.type, "timestamp": iso_timestamp(self.timestamp), "data": self.data}

    def body(self) -> str:
        """The JSON every delivery of this event carries, byte for byte the same each time."""
        return json.dumps(self.to_json(), separators=(",", ":"), ensure_ascii=False)


def iso_timestamp(moment: datetime) -> str:
    """``2025-05-01T12:00:00.123Z``: ISO 8601, UTC, milliseconds."""
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def stream_id(moment: datetime) -> str:
    """The first stream id at or after ``moment`` (for reading from a time on)."""
    return f"{max(0, int(moment.timestamp() * 1000))}-0"


def entry(event_type: str, data: Mapping[str, Any], *, tenant: str | None = None) -> dict[str, str]:
    """What the mail side gives for a journal entry: the type, and ``data`` as JSON
    (its ``ses_message_id`` and the type's own fields); ``tenant`` where the job's
    record may be gone (it is copied from the record otherwise)."""
    if event_type not in EVENT_TYPES:
        raise ValueError(f"unknown event type {event_type!r}")
    out = {"type": event_type, "data": json.dumps(dict(data), separators=(",", ":"), ensure_ascii=False)}
    if tenant is not None:
        out["tenant"] = tenant
    return out


def from_entry(entry_id: Any, fields: Mapping[Any, Any] | Sequence[Any] | None) -> Outcome | None:
    """The event a journal entry is; None for an entry that is none (trimmed away, or
    of a kind this fairpost does not know). An entry a newer fairpost wrote in a
    newer format is :class:`~fairpost.mailer.errors.NewerFormat`: its readers leave
    it for a newer reader (:func:`readable`)."""
    if not fields:
        return None
    values = {text(k): text(v) for k, v in _pairs(fields)}
    version = values.get(VERSION_FIELD, "1")
    if version.isdigit() and int(version) > FORMAT_VERSION:
        raise NewerFormat(EVENT_FORMAT, int(version), FORMAT_VERSION)
    job = values.get("job")
    event_type = values.get("type") or _BY_STATE.get(values.get("state", ""))
    if event_type is None or (not job and event_type not in RECIPIENT_TYPES):
        return None
    reason = values.get("dead_reason")
    if event_type == DEAD and reason == CANCELLED:
        event_type = CANCELLED_TYPE
    data: dict[str, Any] = {
        "job_id": job or None,
        "tenant_id": values.get("tenant"),
        "idempotency_key": values.get("idempotency_key") or None,
        "ses_message_id": None,
    }
    if event_type in (DEAD, CANCELLED_TYPE):
        data["reason"] = reason
    try:
        given = json.loads(values.get("data") or "{}")
    except ValueError:
        given = {}
    if isinstance(given, dict):
        data.update(given)
    ident = text(entry_id)
    ms = int(ident.partition("-")[0])
    return Outcome(id=ident, type=event_type, timestamp=datetime.fromtimestamp(ms / 1000, tz=UTC), data=data)


def readable(page: Sequence[tuple[Any, Any]]) -> tuple[list[Outcome], str | None, NewerFormat | None]:
    """The events of a page of entries up to the first a newer fairpost wrote: those
    events, the id of the last entry read (None: not even the first), and that
    newer entry's error (None when every entry was read)."""
    events: list[Outcome] = []
    last: str | None = None
    for entry_id, fields in page:
        try:
            event = from_entry(entry_id, fields)
        except NewerFormat as exc:
            return events, last, exc
        if event is not None:
            events.append(event)
        last = text(entry_id)
    return events, last, None


def _pairs(fields: Mapping[Any, Any] | Sequence[Any]) -> list[tuple[Any, Any]]:
    """A stream entry's fields as redis-py gives them (a dict), or as a flat list."""
    if isinstance(fields, Mapping):
        return list(fields.items())
    return list(zip(fields[::2], fields[1::2], strict=True))
