"""Dead letters: every job that ended undelivered, kept with its reason,
attempts and last error until FAIRPOST_JOB_TTL, for ``fairpost dead`` and
admin tools.

>>> with DeadLetters() as dead:
...     for letter in dead.list(tenant="acme"):
...         print(letter.job_id, letter.reason)
...     dead.replay("4f1c...")           # back to its tenant's queue, quotas apply
...     dead.purge(older_than=timedelta(days=3))

A replayed job goes through the normal path again (its tenant's queue, the
fair claim, the in-flight cap, the quotas), with its attempts counted from
zero. An unreadable SQS message (``poison-<message id>``) keeps only its raw
body and cannot be replayed.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from typing import Any

import redis

from fairpost.config import Settings
from fairpost.dispatcher.errors import NotReplayable, UnknownJob
from fairpost.dispatcher.keys import BULK
from fairpost.dispatcher.lifecycle import SyncLifecycle
from fairpost.dispatcher.record import has_payload
from fairpost.dispatcher.store import store_limits
from fairpost.mailer.sdk.connection import RedisOwner
from fairpost.mailer.sdk.failures import redis_operation
from fairpost.mailer.sdk.keys import MailKeys
from fairpost.mailer.sdk.mail import check_tenant_id
from fairpost.mailer.sdk.status import json_fields, record_time

__all__ = ["DeadLetter", "DeadLetters", "ReplayReport"]


@dataclass(frozen=True)
class DeadLetter:
    job_id: str
    tenant_id: str
    reason: str
    """Why it died: "cancelled", SES's rejection, "gave up after 5 attempts: ...", ..."""
    attempts: int
    last_error: str | None
    died_at: datetime | None
    created_at: datetime | None
    priority: str
    recipients: int
    replays: int
    """Times it was replayed before (and died again)."""
    replayable: bool
    """False for an unreadable SQS message: only its raw body is left."""
    raw_body: str | None = field(default=None, repr=False)

    @classmethod
    def from_record(cls, job_id: str, record: dict[str, str], died_ms: int | None) -> DeadLetter:
        return cls(
            job_id=job_id,
            tenant_id=record.get("tenant", ""),
            reason=record.get("dead_reason", ""),
            attempts=int(record.get("attempts", "0")),
            last_error=record.get("last_error") or None,
            died_at=record_time(died_ms if died_ms is not None else record.get("finished_ms")),
            created_at=record_time(record.get("created_ms")),
            priority=record.get("priority", "normal").removeprefix(BULK),
            recipients=int(record.get("recipients", "0")),
            replays=int(record.get("replays", "0")),
            replayable=has_payload(record),
            raw_body=record.get("raw_body"),
        )

    def to_json(self) -> dict[str, Any]:
        return json_fields(self)


@dataclass(frozen=True)
class ReplayReport:
    replayed: list[str]
    not_replayable: dict[str, str]
    """Job id → why it was skipped."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class DeadLetters(RedisOwner):
    """List, show, replay and purge dead letters (blocking, like an admin tool)."""

    def __init__(self, settings: Settings | None = None, *, redis_client: redis.Redis | None = None) -> None:
        super().__init__(settings, redis_client=redis_client)
        self.keys = MailKeys(self.settings.key_prefix)
        self._lifecycle = SyncLifecycle(self._redis, self.keys, store_limits(self.settings))

    @redis_operation("dead letters: list")
    def list(self, tenant: str | None = None, *, limit: int | None = None) -> list[DeadLetter]:
        """Newest first; of one tenant if given."""
        if tenant is not None:
            check_tenant_id(tenant, "tenant")
        letters = [
            DeadLetter.from_record(job_id, record, died)
            for job_id, record, died in self._lifecycle.records(self._lifecycle.dead_ids())
            if record.get("state") == "dead" and (tenant is None or record.get("tenant") == tenant)
        ]
        return letters if limit is None else letters[:limit]

    @redis_operation("dead letters: show")
    def show(self, job_id: str) -> DeadLetter:
        """One dead letter; :class:`UnknownJob` if there is none with this id."""
        found = self._lifecycle.records([job_id])
        if not found or found[0][1].get("state") != "dead":
            raise UnknownJob(job_id)
        return DeadLetter.from_record(*found[0])

    @redis_operation("dead letters: replay", writes=True, repeatable=False)
    def replay(self, job_id: str) -> None:
        """Back to its tenant's queue. Raises :class:`NotReplayable` (not dead, or a
        poison message) or :class:`UnknownJob`."""
        self._lifecycle.replay(job_id)

    @redis_operation("dead letters: replay", writes=True, repeatable=False)
    def replay_tenant(self, tenant: str) -> ReplayReport:
        """Replay every dead letter of one tenant, oldest first."""
        check_tenant_id(tenant, "tenant")
        return self._replay_where(tenant)

    @redis_operation("dead letters: replay", writes=True, repeatable=False)
    def replay_all(self) -> ReplayReport:
        """Replay every dead letter, oldest first."""
        return self._replay_where(None)

    @redis_operation("dead letters: purge", writes=True)
    def purge(
        self,
        *,
        tenant: str | None = None,
        older_than: timedelta | float | None = None,
        everything: bool = False,
    ) -> int:
        """Delete dead letters for good (record and content); returns how many.

        Say which: a tenant, an age (``older_than``, a timedelta or seconds), or
        ``everything=True``. Given together, tenant and age both apply.
        """
        if tenant is None and older_than is None and not everything:
            raise ValueError("purge needs tenant=, older_than= or everything=True")
        if tenant is not None:
            check_tenant_id(tenant, "tenant")
        before = None
        if older_than is not None:
            seconds = older_than.total_seconds() if isinstance(older_than, timedelta) else float(older_than)
            before = self._lifecycle.server_ms() - int(seconds * 1000)
        ids = self._lifecycle.dead_ids(died_before_ms=before, newest_first=False)
        return self._lifecycle.purge(ids, tenant)

    def _replay_where(self, tenant: str | None) -> ReplayReport:
        replayed: list[str] = []
        skipped: dict[str, str] = {}
        ids = self._lifecycle.dead_ids(newest_first=False)
        for job_id, record, _ in self._lifecycle.records(ids):
            if tenant is not None and record.get("tenant") != tenant:
                continue
            try:
                self._lifecycle.replay(job_id)
            except (NotReplayable, UnknownJob) as exc:
                skipped[job_id] = str(exc)
            else:
                replayed.append(job_id)
        return ReplayReport(replayed, skipped)
