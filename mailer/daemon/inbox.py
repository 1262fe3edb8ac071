"""The SQS messages a sender holds, and giving each back to SQS.

Every received message is held until it is settled: deleted (sent, or
ended dead) or given a new visibility (parked until its quota frees, or
retried later). Parked messages are remembered per tenant, so a change of
limits or a resume can bring them back at once (:meth:`Inbox.unpark`); at
shutdown whatever is still held goes straight back (:meth:`Inbox.release_held`).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from fairpost.mailer.daemon.aws import SqsClient
from fairpost.mailer.daemon.metrics import Metrics
from fairpost.mailer.daemon.tracing import JobTrace
from fairpost.mailer.sdk.envelope import Envelope

log = logging.getLogger("fairpost.sender")

MAX_VISIBILITY = 43_000
"""SQS allows 12 h (43,200 s) of visibility from a receive; keep a margin.
A longer wait (a daily quota) is served in steps: the message comes back,
is refused again, and is extended again."""


_SWEEP_MIN = 64
"""Tenants the parked map may hold before it is first swept."""


@dataclass
class Received:
    """One SQS message and what became of it."""

    message_id: str
    receipt: str
    group: str
    body: str
    envelope: Envelope | None = None
    delete: bool = False
    visibility: float | None = None
    retry_at: float | None = None
    """Set (monotonic) when the quota frees in under PRECISE_WAIT_MAX seconds: this
    process asks again then, instead of waiting for SQS's whole-second visibility."""
    hidden_until: float = 0.0
    """Monotonic time its visibility (from the receive, or as last changed) ends."""
    in_call: bool = False
    """Its SES call started and SES has, or may have, the mail without its answer
    recorded yet: it is never handed back or tried again here (at shutdown, or after
    a failure), but left to come back after its visibility timeout, its sending
    marker still held."""
    claimant: str = field(default_factory=lambda: uuid.uuid4().hex)
    """Whose sending marker this receive takes (send_claim.lua): trying it again here
    after a failure takes the marker it may hold already as its own."""
    trace: JobTrace | None = None
    """Its processing span, from its decode until it is settled (tracing on only)."""

    def retry_here(self, at: float, margin: float) -> None:
        """This process asks for it again at ``at`` (monotonic). SQS keeps it hidden
        ``margin`` seconds longer, so that it comes back from there if this process
        dies meanwhile: a visibility change only when it would come back sooner."""
        now = time.monotonic()
        self.retry_at = at
        kept = self.hidden_until >= at + margin
        self.visibility = None if kept else at - now + margin
        if self.visibility is not None:
            self.hidden_until = now + self.visibility


class Inbox:
    def __init__(self, sqs: SqsClient, queue_url: str, metrics: Metrics) -> None:
        self.sqs = sqs
        self.queue_url = queue_url
        self.metrics = metrics
        self._held: dict[str, Received] = {}
        self._deletes = _Deletes(sqs, queue_url)
        # Messages parked for quota or a pause: tenant → receipt → monotonic time it returns.
        self._parked: dict[str, dict[str, float]] = {}
        self._sweep_above = _SWEEP_MIN

    def hold(self, messages: Sequence[Received]) -> None:
        for msg in messages:
            self._held[msg.receipt] = msg

    def held(self) -> list[Received]:
        """Every message received and not yet settled."""
        return list(self._held.values())

    def release(self, messages: Sequence[Received]) -> None:
        """These are settled: no longer this process's to hand back."""
        for msg in messages:
            self._held.pop(msg.receipt, None)

    def parked(self, tenant: str, messages: Sequence[Received], until: float) -> None:
        """Remember ``messages`` wait in SQS until ``until`` (monotonic)."""
        now = time.monotonic()
        parked = self._parked.setdefault(tenant, {})
        for receipt in [r for r, when in parked.items() if when <= now]:
            del parked[receipt]
        for msg in messages:
            parked[msg.receipt] = until
        if len(self._parked) > self._sweep_above:
            self._sweep(now)

    def _sweep(self, now: float) -> None:
        """Forget the tenants whose parks are over, or the map would keep every tenant
        ever parked. Run when the map has doubled since the last sweep: amortised O(1)."""
        for tenant, parked in list(self._parked.items()):
            if all(when <= now for when in parked.values()):
                del self._parked[tenant]
        self._sweep_above = max(_SWEEP_MIN, 2 * len(self._parked))

    async def settle(self, messages: Sequence[Received], *, promptly: bool = False) -> None:
        """Delete what is done and set the visibility of what waits, in batches of ten.
        ``promptly``: the deletes do not wait for company (they free a FIFO group whose
        backlog waits behind them)."""
        deletes = [m for m in messages if m.delete]
        changes = [m for m in messages if not m.delete and m.visibility is not None]
        if deletes:
            await self._deletes.delete(deletes, promptly=promptly)
        for chunk in _chunks(changes, 10):
            visibilities: list[dict[str, Any]] = [
                {
                    "Id": str(i),
                    "ReceiptHandle": m.receipt,
                    # SQS counts whole seconds: round up, or a short wait becomes
                    # no wait at all and the message comes straight back.
                    "VisibilityTimeout": min(MAX_VISIBILITY, max(0, math.ceil(m.visibility or 0))),
                }
                for i, m in enumerate(chunk)
            ]
            response = await self.sqs.change_message_visibility_batch(
                QueueUrl=self.queue_url, Entries=visibilities
            )
            for fail in response.get("Failed", []):
                log.warning("SQS visibility change failed: %s", fail.get("Message", fail.get("Code")))

    async def extend(self, messages: Sequence[Received], seconds: int) -> None:
        """Keep ``messages`` hidden ``seconds`` more from now (their sends go on)."""
        for chunk in _chunks(messages, 10):
            entries = [
                {"Id": str(i), "ReceiptHandle": m.receipt, "VisibilityTimeout": seconds}
                for i, m in enumerate(chunk)
            ]
            response = await self.sqs.change_message_visibility_batch(
                QueueUrl=self.queue_url, Entries=entries
            )
            for fail in response.get("Failed", []):
                log.warning("SQS visibility extension failed: %s", fail.get("Message", fail.get("Code")))

    async def hand_back(self, response: Any) -> None:
        """A receive's messages this process will not look at: straight back to SQS."""
        if isinstance(response, BaseException):
            return
        messages = [
            Received(message_id=m["MessageId"], receipt=m["ReceiptHandle"], group="", body="", visibility=0)
            for m in response.get("Messages", [])
        ]
        if messages:
            await self.settle(messages)

    async def unpark(self, tenant: str | None = None) -> int:
        """Bring the tenant's parked messages (every tenant's for ``None``) back now.
        Returns how many."""
        now = time.monotonic()
        tenants = list(self._parked) if tenant is None else [tenant]
        receipts: list[str] = []
        for name in tenants:
            parked = self._parked.pop(name, {})
            receipts += [r for r, until in parked.items() if until > now]
        for start in range(0, len(receipts), 10):
            entries = [
                {"Id": str(i), "ReceiptHandle": r, "VisibilityTimeout": 0}
                for i, r in enumerate(receipts[start : start + 10])
            ]
            # A failure is a message that came back (or went) already: nothing to do.
            await self.sqs.change_message_visibility_batch(QueueUrl=self.queue_url, Entries=entries)
        return len(receipts)

    async def release_held(self) -> int:
        """Shutdown: give every message received but not finished back to SQS at once."""
        # A message whose SES call was cut off is left to its visibility timeout:
        # SES may have it, and its sending marker lasts as long.
        held = [m for m in self._held.values() if not m.in_call]
        for m in held:
            if not m.delete:
                m.visibility = 0
        await self.settle(held)
        released = sum(1 for m in held if not m.delete)
        self.metrics.handed_back(released)
        return released


class _Deletes:
    """Deletes from every batch and every timed retry, gathered into SQS's batches of
    ten: a group asked again on its own would otherwise cost a DeleteMessageBatch for
    one or two messages. A delete waits at most ``linger`` seconds for company; the
    caller still learns when (and whether) its own messages were deleted."""

    def __init__(self, sqs: SqsClient, queue_url: str, linger: float = 0.05) -> None:
        self._sqs = sqs
        self._queue_url = queue_url
        self._linger = linger
        self._pending: list[tuple[Received, asyncio.Future[None]]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._calls: set[asyncio.Task[None]] = set()

    async def delete(self, messages: Sequence[Received], *, promptly: bool = False) -> None:
        loop = asyncio.get_running_loop()
        done: list[asyncio.Future[None]] = []
        for msg in messages:
            future: asyncio.Future[None] = loop.create_future()
            self._pending.append((msg, future))
            done.append(future)
        if promptly or len(self._pending) >= 10:
            self._flush()
        elif self._timer is None:
            self._timer = loop.call_later(self._linger, self._flush)
        # Shielded: a caller cancelled (shutdown) does not cancel others' deletes.
        await asyncio.shield(asyncio.gather(*done))

    def _flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        while self._pending:
            chunk, self._pending = self._pending[:10], self._pending[10:]
            call = asyncio.ensure_future(self._send(chunk))
            self._calls.add(call)
            call.add_done_callback(self._calls.discard)

    async def _send(self, chunk: list[tuple[Received, asyncio.Future[None]]]) -> None:
        entries = [{"Id": str(i), "ReceiptHandle": m.receipt} for i, (m, _) in enumerate(chunk)]
        try:
            response = await self._sqs.delete_message_batch(QueueUrl=self._queue_url, Entries=entries)
        except Exception as exc:
            for _, future in chunk:
                if not future.done():
                    future.set_exception(exc)
            return
        for fail in response.get("Failed", []):
            # The message will come back; its job record says sent, so it is not sent twice.
            log.warning("SQS delete failed: %s", fail.get("Message", fail.get("Code")))
        for _, future in chunk:
            if not future.done():
                future.set_result(None)


def _chunks(items: Sequence[Received], size: int) -> list[Sequence[Received]]:
    return [items[i : i + size] for i in range(0, len(items), size)]
