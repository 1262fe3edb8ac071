"""A job's status, as the SDK and ``fairpost status`` show it."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from fairpost.dispatcher.errors import UnknownJob
from fairpost.dispatcher.keys import BULK
from fairpost.mailer.sdk.streams import NOTIFICATION, TRANSACTIONAL


@dataclass(frozen=True)
class JobStatus:
    job_id: str
    tenant_id: str
    state: str
    """scheduled, queued, claimed, dispatched, sent, dead or suppressed (every
    recipient on its tenant's suppression list: not sent)."""
    priority: str
    recipients: int
    attempts: int
    """SES calls that failed transiently. Throttled receives are not attempts."""
    throttled: int
    """Times the mail waited for its quota."""
    created_at: datetime | None
    dispatched_at: datetime | None
    sent_at: datetime | None
    finished_at: datetime | None
    ses_message_id: str | None
    last_error: str | None
    dead_reason: str | None
    """Why it is dead: "cancelled", SES's rejection, attempts exhausted, ..."""
    scheduled_for: datetime | None = None
    """The ``send_at`` it was enqueued with, if any."""
    replays: int = 0
    """Times it was replayed from the dead letters."""
    delivery: str | None = None
    """What SES reported after accepting it (SES events): ``delivered``, ``delayed``,
    ``rejected``, ``bounced`` or ``complained`` (the worst of its recipients)."""
    bounce_type: str | None = None
    """For ``bounced``: ``Permanent`` (the address is suppressed), ``Transient`` or ``Undetermined``."""
    diagnostic: str | None = None
    """SES's diagnostic for a bounce, delay or reject (addresses redacted)."""
    suppressed: int = 0
    """Recipients dropped unsent: on the tenant's suppression list."""
    waiting_for: str | None = None
    """While it is not finished: why it last waited (``tenant_quota``, ``global_quota``,
    ``global_share``, ``paused`` (by an operator), ``reputation_paused`` (by the reputation
    guard), ``ses`` (throttled), ``ses_<code>`` (its tenant held
    for an SES fault of its own), ``ses_tenant_disabled`` (SES disabled its SES tenant),
    ``provider_paused:<provider>`` (its tenant held at its recipients' mailbox provider: it
    waits ``scheduled`` in Redis))."""
    waiting_until: datetime | None = None
    """Until when that wait was to last."""
    stream: str = "transactional"
    """``transactional`` or ``notification`` (fairpost.mailer.sdk.streams)."""
    suppressed_reason: str | None = None
    """``unsubscribed`` when a notification was not sent because its recipient
    unsubscribed from its topic; None for the suppression list (bounces, complaints)."""

    @classmethod
    def from_record(cls, job_id: str, record: dict[str, str]) -> JobStatus:
        if not record:
            raise UnknownJob(job_id)
        final = record.get("state") in _FINAL
        return cls(
            job_id=job_id,
            tenant_id=record.get("tenant", ""),
            state=record.get("state", ""),
            priority=record.get("priority", "normal").removeprefix(BULK),
            recipients=int(record.get("recipients", "0")),
            attempts=int(record.get("attempts", "0")),
            throttled=int(record.get("throttled", "0")),
            created_at=record_time(record.get("created_ms")),
            dispatched_at=record_time(record.get("dispatched_ms")),
            sent_at=record_time(record.get("sent_ms")),
            finished_at=record_time(record.get("finished_ms")),
            ses_message_id=record.get("ses_message_id") or None,
            last_error=record.get("last_error") or None,
            dead_reason=record.get("dead_reason") or None,
            scheduled_for=record_time(record.get("send_at_ms")),
            replays=int(record.get("replays", "0")),
            delivery=record.get("delivery") or None,
            bounce_type=record.get("bounce_type") or None,
            diagnostic=record.get("diagnostic") or None,
            suppressed=int(record.get("suppressed", "0")),
            waiting_for=None if final else record.get("waiting_for") or None,
            waiting_until=None if final else record_time(record.get("waiting_until_ms")),
            # A bulk lane is the notification stream's (compose.mail_job).
            stream=NOTIFICATION if record.get("priority", "").startswith(BULK) else TRANSACTIONAL,
            suppressed_reason=record.get("suppressed_reason") or None,
        )

    def to_json(self) -> dict[str, Any]:
        return json_fields(self)


_FINAL = ("sent", "dead", "suppressed")


def json_fields(record: Any) -> dict[str, Any]:
    """A record dataclass (this status, a dead letter) as JSON-ready fields: times in ISO 8601."""
    data: dict[str, Any] = asdict(record)
    for name, value in data.items():
        if isinstance(value, datetime):
            data[name] = value.isoformat()
    return data


def record_time(ms: int | str | None) -> datetime | None:
    """A time stored in a job record (Redis time, ms since the epoch); None if unset."""
    return datetime.fromtimestamp(int(ms) / 1000, tz=UTC) if ms else None
