"""The receive loop: wait for the gate, long-poll SQS, hand the batch on.

One loop per ``sender.receivers``. Each turn waits while the gate is closed
(fairpost.mailer.daemon.gate), receives up to ten messages and passes them to the
sender's batch handling, then lingers a moment if mail is only trickling in
(unless a throttled tenant's group was just freed: :meth:`Receiver.group_freed`).
A failed turn, whatever it raised, is ridden out on the shared outage
back-off (fairpost.dispatcher.loop); a batch whose handling failed on one is asked
for again by the sender on that back-off (fairpost.mailer.daemon.sender).

A stop never cuts a long poll off: SQS keeps a poll open on its side until its
wait ends, whoever still listens, and hides what it hands that poll for the
visibility timeout (in a FIFO queue, with the whole group behind it). So a
poll in flight at the stop lands, within ``FAIRPOST_SENDER__WAIT_SECONDS``,
and what it brings goes straight back (:meth:`Receiver.landed`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from fairpost.dispatcher.backoff import OutageBackoff, done_before_stop, wait_or_stop
from fairpost.dispatcher.loop import forever
from fairpost.mailer.daemon.context import SenderContext
from fairpost.mailer.daemon.gate import Gate
from fairpost.mailer.daemon.inbox import Inbox, Received
from fairpost.mailer.daemon.ses import redact

log = logging.getLogger("fairpost.sender")

Process = Callable[[list[Received]], Awaitable[None]]

RECEIVE_RETRY_MOST = 1.0
"""Seconds at most between tries of a receive loop that fails (Redis or SQS away): a
throttled tenant sends again within 5 s of Redis answering, and a busy machine
needs the rest of that for the receive, the quota and the SES call (2 s left a
loaded CI machine 0.2 s over). A failing receive a second costs one SQS call."""

_LANDING_MARGIN = 2.0
"""Seconds past its wait a poll in flight at the stop is still waited on (the network's share)."""


class Receiver:
    def __init__(self, ctx: SenderContext, gate: Gate, inbox: Inbox, process: Process) -> None:
        self.ctx = ctx
        self.gate = gate
        self.inbox = inbox
        self.process = process
        self._freed = asyncio.Event()
        # Polls in flight at the stop, landing: each hands back what its poll brings.
        self._landing: set[asyncio.Task[int]] = set()

    def group_freed(self) -> None:
        """A throttled tenant's FIFO group was just freed (its timed retry sent the
        last mail SQS held back its backlog for): receive now, not after a linger.
        The tenant's quota is free again by the time its next mail comes, and every
        moment of linger is that quota unused. Kept until the next receive starts, so
        a loop busy with a batch meanwhile skips its linger after it."""
        self._freed.set()

    async def run(self, stop: asyncio.Event) -> None:
        """Receive and hand on until ``stop`` is set."""
        # Tried at least every few seconds: mail waiting in SQS is received again within
        # that of Redis (or SQS) answering, however long the outage was.
        backoff = OutageBackoff(self.ctx.settings.max_outage_seconds, first=0.2, most=RECEIVE_RETRY_MOST)

        poll = Poll()  # this loop's own: several loops share the receiver

        async def turn() -> None:
            await self.turn(stop, poll)

        def failed(task: str, exc: Exception) -> None:
            # What a failed batch held comes back after its visibility timeout.
            self.ctx.metrics.receive_failed()
            self.ctx.metrics.task_failed(task)

        # A batch's failure may quote its mail: addresses are masked in the log.
        await forever("sender", turn, stop, backoff=backoff, on_error=failed, described=_described)

    async def turn(self, stop: asyncio.Event, poll: Poll | None = None) -> None:
        """One turn of the loop: the gate, one receive, its batch handled, and a
        linger if mail only trickles in. (tests/ops/test_redis_budget.py drives the
        sender through it, turn by turn, to count its Redis commands.)"""
        if await self.gate.wait(stop):
            return  # the world is looked at again before receiving
        messages = await self.receive(stop, poll or Poll())
        if messages:
            await self.process(messages)
            linger = self.ctx.settings.sender.linger_seconds
            if len(messages) < 10 and linger > 0:
                # Mail is trickling in: let some gather, so that the next
                # receive and its delete each carry more than one or two.
                await wait_or_stop(stop, linger, self._freed)

    async def landed(self) -> int:
        """Shutdown: wait for the polls in flight at the stop to land (SQS ends each
        within its wait) and hand back what they brought. Returns how many."""
        if not self._landing:
            return 0
        # SQS ends a poll within its wait. One that has not landed a moment past that
        # never reached SQS or hangs on a dead connection: it is not waited on, and
        # anything it holds comes back after its visibility timeout.
        done, late = await asyncio.wait(
            set(self._landing), timeout=self.ctx.settings.sender.wait_seconds + _LANDING_MARGIN
        )
        for landing in late:
            landing.cancel()
        await asyncio.gather(*late, return_exceptions=True)
        return sum(r for task in done if not task.cancelled() and isinstance(r := task.result(), int))

    def _land(self, poll: asyncio.Future[Any]) -> asyncio.Task[int]:
        landing = asyncio.create_task(self._hand_back(poll), name="sender-poll-landing")
        self._landing.add(landing)
        landing.add_done_callback(self._landing.discard)
        return landing

    async def _hand_back(self, poll: asyncio.Future[Any]) -> int:
        try:
            response = await poll
        except Exception as exc:
            log.warning("SQS receive in flight at shutdown failed: %s", exc)
            return 0
        brought = len(response.get("Messages", []))
        try:
            await self.inbox.hand_back(response)
        except Exception as exc:
            log.warning(
                "could not hand back %d messages a poll brought at shutdown (%s); "
                "they return after their visibility timeout",
                brought,
                exc,
            )
            return 0
        self.ctx.metrics.handed_back(brought)
        return brought

    async def receive(self, stop: asyncio.Event, poll: Poll) -> list[Received]:
        """One long poll; nothing if ``stop`` is set meanwhile. A failure is raised, for
        the loop to ride out on its back-off; the loop's next poll asks again with the
        same attempt id (:class:`Poll`)."""
        if stop.is_set():
            return []
        # This poll brings any group freed so far.
        self._freed.clear()
        s = self.ctx.settings.sender
        poll.attempt_id = poll.attempt_id or uuid.uuid4().hex
        request: dict[str, Any] = {
            "QueueUrl": self.inbox.queue_url,
            "MaxNumberOfMessages": 10,
            "WaitTimeSeconds": s.wait_seconds,
            "VisibilityTimeout": s.visibility_timeout,
            "MessageSystemAttributeNames": ["MessageGroupId"],
            "ReceiveRequestAttemptId": poll.attempt_id,
        }
        asked_at = time.monotonic()
        receive = asyncio.ensure_future(self.inbox.sqs.receive_message(**request))
        try:
            received = await done_before_stop(receive, stop)
        except asyncio.CancelledError:
            self._land(receive)
            raise
        if not received:
            # Shutting down mid-poll: the poll lands and what it brings goes
            # straight back for another replica. Shielded, so that a grace
            # period ending meanwhile leaves it to land for landed().
            await asyncio.shield(self._land(receive))
            return []
        response = receive.result()  # a failure keeps the attempt id for the next poll
        poll.attempt_id = None
        stats = self.ctx.stats
        stats.receives += 1
        raw = response.get("Messages", [])
        self.ctx.metrics.received(len(raw))
        if not raw:
            stats.empty_receives += 1
        # Each message's claimant (Received.claimant), drawn for the whole receive at
        # once: one read of the system's random source, not one a mail (#41).
        claimants = os.urandom(16 * len(raw)).hex()
        return [
            Received(
                message_id=m["MessageId"],
                receipt=m["ReceiptHandle"],
                group=m.get("Attributes", {}).get("MessageGroupId", ""),
                body=m.get("Body", ""),
                hidden_until=asked_at + s.visibility_timeout,
                claimant=claimants[32 * i : 32 * i + 32],
            )
            for i, m in enumerate(raw)
        ]


@dataclass
class Poll:
    """One receive loop's polls. A poll whose answer was lost (SQS had it, the answer
    never came) is asked again with the same ``ReceiveRequestAttemptId``: SQS then
    returns the same messages instead of hiding them until their visibility ends."""

    attempt_id: str | None = None


def _described(exc: Exception) -> str:
    return redact(f"{type(exc).__name__}: {exc}")
