"""A granted mail's message is kept hidden from its receive on, not from its grant.

Between a receive and the sends it leads to lie the group's decision, the quota
acquire and the sending markers' claim; on a loaded replica they take seconds.
A message whose visibility has mostly run out by the time its send starts must be
kept hidden before it lapses, or another receiver gets it while SES has it.
The Sender is built on fakes (tests/daemon/unit/fakes.py); SES is a fake that
answers when the test lets it (the pipeline tests, test_sender_once.py, run the
same against the recording SES server).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, cast

from fairpost.mailer.daemon.counting import Counting
from fairpost.mailer.daemon.endings import Endings
from fairpost.mailer.daemon.gate import Gate
from fairpost.mailer.daemon.inbox import Inbox, Received
from fairpost.mailer.daemon.parking import Parking
from fairpost.mailer.daemon.send import Sending
from fairpost.mailer.testing.wait import wait_for_async
from tests.daemon.unit.fakes import FakeSqs, fake_context, mail


class _HeldSes:
    """SES whose SendEmail answers only once ``answer`` is set."""

    def __init__(self) -> None:
        self.answer = asyncio.Event()
        self.called = asyncio.Event()

    async def send_email(self, **_: Any) -> dict[str, str]:
        self.called.set()
        await self.answer.wait()
        return {"MessageId": "ses-1"}


async def _never(_: list[Received]) -> None:
    raise AssertionError("no timed retry is due in this test")


class _TimedSqs(FakeSqs):
    """Records when each visibility change was asked (monotonic)."""

    def __init__(self) -> None:
        super().__init__()
        self.asked_at: list[float] = []

    async def change_message_visibility_batch(self, **kwargs: Any) -> dict[str, Any]:
        self.asked_at.append(time.monotonic())
        return await super().change_message_visibility_batch(**kwargs)


async def test_a_message_received_long_before_its_send_is_kept_hidden_before_it_lapses() -> None:
    lifetime = 30
    ctx, _, _ = fake_context(sender={"visibility_timeout": lifetime})
    sqs, ses = _TimedSqs(), _HeldSes()
    gate = Gate(ctx.quota, ctx.limits)
    endings = Endings(ctx)
    inbox = Inbox(cast(Any, sqs), "https://sqs/queue", ctx.metrics, on_due=_never)
    parking = Parking(ctx, gate, endings)
    sending = Sending(ctx, cast(Any, ses), gate, inbox, endings, Counting(ctx), parking)
    msg = mail("acme", 0)
    # Received 25 s ago: 5 s of its visibility are left when its send starts.
    msg.hidden_until = time.monotonic() + 5
    lapses_at = msg.hidden_until
    send = asyncio.create_task(sending.send_granted("acme", [msg], at_ms=1_000_000))
    try:
        await asyncio.wait_for(ses.called.wait(), 20)
        await wait_for_async(lambda: sqs.visibility.get("r-0") == lifetime, within=20, what="kept hidden")
    finally:
        send.cancel()
        await asyncio.gather(send, return_exceptions=True)
    assert sqs.asked_at[0] < lapses_at, "its visibility was extended only after it had lapsed"
