"""Fakes for the sender's decisions, so they are tested without a server.

The pipeline tests (tests/daemon/test_sender*.py) run the same code against
Redis, moto and the recording SES server; these stand in for SQS, the job
store and the quota engine only to call one decision at a time, fast. Each
records what it was asked, for the test to assert.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from fairpost.config import Settings, load_settings
from fairpost.dispatcher.calls import StoreLimits
from fairpost.mailer.daemon.context import SenderContext
from fairpost.mailer.daemon.holds import Holds
from fairpost.mailer.daemon.inbox import Received
from fairpost.mailer.daemon.metrics import Metrics
from fairpost.mailer.quota.engine import Grant
from fairpost.mailer.quota.overrides import StaticLimits
from fairpost.mailer.sdk.envelope import Envelope, decode
from fairpost.mailer.sdk.keys import MailKeys
from fairpost.mailer.sdk.mail import Mail, validate


class FakeSqs:
    """The two batch calls the inbox makes; every entry recorded, none failed."""

    def __init__(self) -> None:
        self.visibility: dict[str, int] = {}
        """Receipt → the last visibility asked for it."""
        self.visibility_calls = 0
        self.deleted: list[str] = []

    async def change_message_visibility_batch(self, **kwargs: Any) -> dict[str, Any]:
        self.visibility_calls += 1
        for entry in kwargs["Entries"]:
            self.visibility[entry["ReceiptHandle"]] = entry["VisibilityTimeout"]
        return {"Failed": []}

    async def delete_message_batch(self, **kwargs: Any) -> dict[str, Any]:
        self.deleted += [entry["ReceiptHandle"] for entry in kwargs["Entries"]]
        return {"Failed": []}


class _UnusedRedis:
    """What a part that registers a Lua script at start needs of a client: never called."""

    def register_script(self, _: str) -> object:
        return object()


@dataclass
class FakeStore:
    """The job store's calls a decision makes, and the mail side's of the same records
    (fairpost.mailer.daemon.mail_jobs), answered from memory."""

    redis: Any = field(default_factory=_UnusedRedis)
    keys: MailKeys = field(default_factory=lambda: MailKeys("fp"))
    limits: StoreLimits = field(default_factory=StoreLimits)
    states: dict[str, str] = field(default_factory=dict)
    attempts: dict[str, int] = field(default_factory=dict)
    finished: dict[str, str] = field(default_factory=dict)
    throttled: list[tuple[list[str], str, int]] = field(default_factory=list)
    touched: list[tuple[str, int]] = field(default_factory=list)
    claims: list[int] = field(default_factory=list)
    """The codes claim_sending answers, in order (1 when none is left)."""
    clock_ms: int = 1_000_000
    state_reads: list[list[str]] = field(default_factory=list)
    """The jobs of each read of their states, in order."""

    async def job_states(self, job_ids: Sequence[str]) -> dict[str, str]:
        self.state_reads.append(list(job_ids))
        return {j: self.states[j] for j in job_ids if j in self.states}

    async def now_ms(self) -> int:
        return self.clock_ms

    async def count_throttled(self, job_ids: Sequence[str], reason: str, until_ms: int) -> None:
        self.throttled.append((list(job_ids), reason, until_ms))

    async def touch_inflight(self, tenant: str, until_ms: int) -> None:
        self.touched.append((tenant, until_ms))

    async def count_attempt(self, job_id: str, error: str) -> int:
        self.attempts[job_id] = self.attempts.get(job_id, 0) + 1
        return self.attempts[job_id]

    async def finish(self, job_id: str, state: str, **_: Any) -> int:
        self.finished[job_id] = str(state)
        return 1

    async def claim_sending(self, job_ids: Sequence[str], *_: Any, **__: Any) -> list[int]:
        codes = [self.claims.pop(0) if self.claims else 1 for _ in job_ids]
        return codes

    async def release_sending(self, job_id: str) -> None:
        pass

    async def hold_sending(self, job_ids: Sequence[str], lifetime_ms: int) -> None:
        pass

    async def mark_waiting(self, *_: Any) -> None:
        pass


@dataclass
class FakeQuota:
    """The quota engine: grants what ``grant`` says, records refunds."""

    grant: Grant = field(default_factory=lambda: Grant(granted=0, retry_after=0.0, blocked_by=None, at_ms=0))
    global_wait: float = 0.0
    refunds: list[tuple[str, int, int]] = field(default_factory=list)
    asked: list[tuple[str, list[int]]] = field(default_factory=list)

    async def acquire(self, tenant: str, costs: Sequence[int], *_: Any, **__: Any) -> Grant:
        self.asked.append((tenant, list(costs)))
        return self.grant

    async def refund(self, tenant: str, cost: int, at_ms: int, *_: Any, **__: Any) -> None:
        self.refunds.append((tenant, cost, at_ms))

    async def restamp(self, *_: Any, **__: Any) -> int | None:
        """A granted mail's units kept counted: nothing to move here."""
        return None

    peeks: int = 0
    """Calls of :meth:`global_retry_after` (each a quota script call in Redis)."""

    async def global_retry_after(self, *_: Any, **__: Any) -> float:
        self.peeks += 1
        return self.global_wait


def fake_context(**settings: Any) -> tuple[SenderContext, FakeStore, FakeQuota]:
    config: Settings = load_settings(redis_url="redis://unused", **settings)
    store, quota = FakeStore(), FakeQuota()
    ctx = SenderContext(
        settings=config,
        store=cast(Any, store),
        quota=cast(Any, quota),
        limits=StaticLimits(config),
        metrics=Metrics(),
        # The pauses as the context's limits say when asked: a test may swap them.
        holds=Holds(cast(Any, store), config, lambda tenant: ctx.limits.is_paused(tenant)),
        mail=cast(Any, store),
    )
    return ctx, store, quota


def mail(tenant: str, n: int, recipients: int = 1) -> Received:
    """A received message of ``tenant``'s job ``j-<n>``, decoded."""
    to = [f"u{i}@example.org" for i in range(recipients)]
    valid, _ = validate(Mail(sender="app@example.com", to=to, subject="s", text="t"), max_bytes=100_000)
    body = Envelope(job_id=f"j-{n}", tenant=tenant, created_ms=0, mail=valid).encode()
    msg = Received(message_id=f"m-{n}", receipt=f"r-{n}", group=tenant, body=body)
    msg.envelope = decode(body)
    return msg
