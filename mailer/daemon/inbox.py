"""The SQS messages a sender holds, and the one place their settlements reach SQS.

Every received message is held until it is settled: each round of it (its
receive, or a timed retry) ends with one decision
(:mod:`fairpost.mailer.daemon.settlement`), which :meth:`Inbox.settle` applies:
a delete, a new visibility, or a retry timed here. Parked messages are
remembered per tenant, so a change of limits or a resume can bring them back
at once (:meth:`Inbox.unpark`); at shutdown whatever is still held goes
straight back (:meth:`Inbox.release_held`).
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from fairpost.mailer.daemon.aws import SqsClient
from fairpost.mailer.daemon.metrics import Metrics
from fairpost.mailer.daemon.settlement import (
    HAND_BACK,
    Backoff,
    Delete,
    HandBack,
    Park,
    Settlement,
    TimedRetry,
)
from fairpost.mailer.daemon.tracing import JobTrace
from fairpost.mailer.errors import SettledTwice
from fairpost.mailer.sdk.envelope import Envelope

log = logging.getLogger("fairpost.sender")

_T = TypeVar("_T")

MAX_VISIBILITY = 43_000
"""SQS allows 12 h (43,200 s) of visibility from a receive; keep a margin.
A longer wait (a daily quota) is served in steps: the message comes back,
is refused again, and is extended again."""


_SWEEP_MIN = 64
"""Tenants the parked map may hold before it is first swept."""


@dataclass
class Received:
    """One SQS message and what becomes of it this round."""

    message_id: str
    receipt: str
    group: str
    body: str
    envelope: Envelope | None = None
    hidden_until: float = 0.0
    """Monotonic time its visibility (from the receive, or as last changed) ends."""
    in_call: bool = False
    """Its SES call started and SES has, or may have, the mail without its answer
    recorded yet: it is never handed back or tried again here (at shutdown, or after
    a failure), but left to come back after its visibility timeout, its sending
    marker still held."""
    claimant: str = field(default_factory=lambda: os.urandom(16).hex())
    """Whose sending marker this receive takes (send_claim.lua): trying it again here
    after a failure takes the marker it may hold already as its own."""
    trace: JobTrace | None = None
    """Its processing span, from its decode until it is settled (tracing on only)."""
    settlement: Settlement | None = field(default=None, init=False)
    """This round's decision (fairpost.mailer.daemon.settlement); None: none yet."""

    def decide(self, settlement: Settlement) -> None:
        """What becomes of it this round. A second decision is a defect: only
        :meth:`overrule` and :meth:`reopen` change one."""
        if self.settlement is not None:
            raise SettledTwice(f"message {self.message_id}: {self.settlement} then {settlement}")
        self.settlement = settlement

    def overrule(self, settlement: Settlement) -> None:
        """A later look changes this round's decision: the group's answers taken
        together (fairpost.mailer.daemon.answers.Answers.after_group), a failure of
        the group's handling, or the shutdown."""
        self.settlement = settlement

    def reopen(self) -> None:
        """A new round: asked for again (a timed retry), or the round's decisions are
        void because its group failed on an outage and is decided again."""
        self.settlement = None

    @property
    def deleted(self) -> bool:
        return isinstance(self.settlement, Delete)

    @property
    def retry_at(self) -> float | None:
        """When this process asks for it again (monotonic), if it does."""
        return self.settlement.at if isinstance(self.settlement, TimedRetry) else None


class Inbox:
    def __init__(
        self,
        sqs: SqsClient,
        queue_url: str,
        metrics: Metrics,
        *,
        on_due: Callable[[list[Received]], Awaitable[None]] | None = None,
    ) -> None:
        self.sqs = sqs
        self.queue_url = queue_url
        self.metrics = metrics
        self._held: dict[str, Received] = {}
        self._deletes = _Deletes(sqs, queue_url)
        # Messages parked for quota or a pause: tenant → receipt → monotonic time it returns.
        self._parked: dict[str, dict[str, float]] = {}
        self._sweep_above = _SWEEP_MIN
        self.timers: set[asyncio.Task[None]] = set()
        """The timed retries waiting (:class:`fairpost.mailer.daemon.settlement.TimedRetry`)."""
        self.on_due = on_due
        """Asks again for a timed retry's messages when due (the Sender's new round)."""

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
        """Apply each message's settlement: the deletes, then the visibility changes in
        batches of ten; a park is remembered for :meth:`unpark`, and a timed retry is
        timed here (:meth:`on_due` is called with its messages when due). ``promptly``:
        the deletes do not wait for company (they free a FIFO group whose backlog
        waits behind them)."""
        deletes = [m for m in messages if isinstance(m.settlement, Delete)]
        if deletes:
            await self._deletes.delete(deletes, promptly=promptly)
        now = time.monotonic()
        changes: list[tuple[Received, float]] = []
        retries: dict[float, list[Received]] = {}
        for m in messages:
            settled = m.settlement
            if isinstance(settled, Park):
                changes.append((m, settled.seconds))
                self.parked(settled.tenant, [m], now + settled.seconds)
            elif isinstance(settled, Backoff):
                changes.append((m, settled.seconds))
            elif isinstance(settled, HandBack):
                changes.append((m, 0.0))
            elif isinstance(settled, TimedRetry):
                # A visibility change only when SQS would show it again before the margin.
                if m.hidden_until < settled.at + settled.margin:
                    changes.append((m, settled.at - now + settled.margin))
                if settled.tenant is not None:
                    self.parked(settled.tenant, [m], settled.at)
                retries.setdefault(settled.at, []).append(m)
        for m, seconds in changes:
            m.hidden_until = now + seconds
        # SQS counts whole seconds: round up, or a short wait becomes no wait at
        # all and the message comes straight back.
        await self._change_visibility(
            [(m.receipt, min(MAX_VISIBILITY, max(0, math.ceil(seconds)))) for m, seconds in changes],
            "SQS visibility change failed",
        )
        for due, again in retries.items():
            self._time(again, due)

    def _time(self, again: list[Received], due: float) -> None:
        timer = asyncio.create_task(self._ask_again(again, due), name="sender-precise-retry")
        self.timers.add(timer)
        timer.add_done_callback(self._timer_done)

    async def _ask_again(self, messages: list[Received], due: float) -> None:
        """The quota frees in less than a second or two, or an outage may be over: ask
        again at that moment.

        SQS counts visibility in whole seconds, so parking for 0.3 s would
        cost 1 s, a third of a per-second quota. The messages stay parked in
        SQS meanwhile (with a margin), so if this process dies they come back
        there; no worker slot is held while waiting, only this timer.
        """
        await asyncio.sleep(max(0.0, due - time.monotonic()))
        assert self.on_due is not None
        await self.on_due(messages)

    def _timer_done(self, timer: asyncio.Task[None]) -> None:
        self.timers.discard(timer)
        if not timer.cancelled() and timer.exception() is not None:
            # Its messages stay parked in SQS and come back when their visibility ends.
            log.error("timed retry failed", exc_info=timer.exception())

    async def cancel_timers(self) -> None:
        """Shutdown: no timed retry asks again; their messages stay held."""
        for timer in list(self.timers):
            timer.cancel()
        await asyncio.gather(*self.timers, return_exceptions=True)

    async def extend(self, messages: Sequence[Received], seconds: int) -> None:
        """Keep ``messages`` hidden ``seconds`` more from now (their sends go on)."""
        until = time.monotonic() + seconds
        for m in messages:
            m.hidden_until = until
        await self._change_visibility(
            [(m.receipt, seconds) for m in messages], "SQS visibility extension failed"
        )

    async def hand_back(self, response: Any) -> None:
        """A receive's messages this process will not look at: straight back to SQS."""
        if isinstance(response, BaseException):
            return
        messages = [
            Received(message_id=m["MessageId"], receipt=m["ReceiptHandle"], group="", body="")
            for m in response.get("Messages", [])
        ]
        for msg in messages:
            msg.decide(HAND_BACK)
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
        # A failure is a message that came back (or went) already: nothing to do.
        await self._change_visibility([(r, 0) for r in receipts], None)
        return len(receipts)

    async def _change_visibility(self, changes: Sequence[tuple[str, int]], failure: str | None) -> None:
        """New visibilities (receipt, seconds from now) in SQS's batches of ten; each
        entry SQS refuses is logged under ``failure`` (None: expected, not logged)."""
        for chunk in _chunks(changes, 10):
            entries = [
                {"Id": str(i), "ReceiptHandle": receipt, "VisibilityTimeout": seconds}
                for i, (receipt, seconds) in enumerate(chunk)
            ]
            response = await self.sqs.change_message_visibility_batch(
                QueueUrl=self.queue_url, Entries=entries
            )
            if failure is None:
                continue
            for fail in response.get("Failed", []):
                log.warning("%s: %s", failure, fail.get("Message", fail.get("Code")))

    async def release_held(self) -> int:
        """Shutdown: give every message received but not finished back to SQS at once."""
        # A message whose SES call was cut off is left to its visibility timeout:
        # SES may have it, and its sending marker lasts as long.
        held = [m for m in self._held.values() if not m.in_call]
        for m in held:
            if not m.deleted:
                m.overrule(HAND_BACK)
        await self.settle(held)
        released = sum(1 for m in held if not m.deleted)
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
        self._pending: list[tuple[Received, _Waiting]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._calls: set[asyncio.Task[None]] = set()

    async def delete(self, messages: Sequence[Received], *, promptly: bool = False) -> None:
        loop = asyncio.get_running_loop()
        # One future for the caller's messages, not one each and a gather of them
        # (#41: a future and a done callback a mail less): done once every one of
        # them is deleted, failed with the first error of a call that deleted some.
        waiting = _Waiting(loop.create_future(), len(messages))
        if not messages:
            waiting.future.set_result(None)
        for msg in messages:
            self._pending.append((msg, waiting))
        if promptly or len(self._pending) >= 10:
            self._flush()
        elif self._timer is None:
            self._timer = loop.call_later(self._linger, self._flush)
        # Shielded: a caller cancelled (shutdown) does not cancel others' deletes.
        await asyncio.shield(waiting.future)

    def _flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        while self._pending:
            chunk, self._pending = self._pending[:10], self._pending[10:]
            call = asyncio.ensure_future(self._send(chunk))
            self._calls.add(call)
            call.add_done_callback(self._calls.discard)

    async def _send(self, chunk: list[tuple[Received, _Waiting]]) -> None:
        entries = [{"Id": str(i), "ReceiptHandle": m.receipt} for i, (m, _) in enumerate(chunk)]
        try:
            response = await self._sqs.delete_message_batch(QueueUrl=self._queue_url, Entries=entries)
        except Exception as exc:
            for _, waiting in chunk:
                if not waiting.future.done():
                    waiting.future.set_exception(exc)
            return
        for fail in response.get("Failed", []):
            # The message will come back; its job record says sent, so it is not sent twice.
            log.warning("SQS delete failed: %s", fail.get("Message", fail.get("Code")))
        for _, waiting in chunk:
            waiting.left -= 1
            if not waiting.left and not waiting.future.done():
                waiting.future.set_result(None)


class _Waiting:
    """One caller of :meth:`_Deletes.delete`: its future, and how many of its messages
    are still to be deleted."""

    __slots__ = ("future", "left")

    def __init__(self, future: asyncio.Future[None], left: int) -> None:
        self.future = future
        self.left = left


def _chunks(items: Sequence[_T], size: int) -> list[Sequence[_T]]:
    return [items[i : i + size] for i in range(0, len(items), size)]
