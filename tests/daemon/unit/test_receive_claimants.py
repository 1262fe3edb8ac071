"""Each received message claims its job's sending marker as itself (Received.claimant):
the claimants of one receive, drawn together (mailer/daemon/receive.py), are each a
random 128-bit hex string of their own, as a message's alone would be."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from fairpost.mailer.daemon.inbox import Received
from fairpost.mailer.daemon.receive import Poll
from fairpost.mailer.daemon.sender import Sender
from tests.daemon.unit.fakes import FakeSqs, fake_context


class ReceivingSqs(FakeSqs):
    def __init__(self, count: int) -> None:
        super().__init__()
        self.count = count

    async def receive_message(self, **kwargs: Any) -> dict[str, Any]:
        return {
            "Messages": [
                {"MessageId": f"m-{n}", "ReceiptHandle": f"r-{n}", "Body": "{}"} for n in range(self.count)
            ]
        }


async def received(count: int) -> list[Received]:
    ctx, _, _ = fake_context()
    sender = Sender(
        sqs=cast(Any, ReceivingSqs(count)),
        ses_client=cast(Any, None),
        queue_url="https://sqs/queue",
        store=ctx.store,
        quota=ctx.quota,
        settings=ctx.settings,
    )
    return await sender.receiver.receive(asyncio.Event(), Poll())


async def test_each_message_of_a_receive_claims_as_itself() -> None:
    messages = await received(10)
    claimants = [m.claimant for m in messages]
    assert [m.receipt for m in messages] == [f"r-{n}" for n in range(10)]
    assert all(len(c) == 32 and int(c, 16) >= 0 for c in claimants)
    assert len(set(claimants)) == 10
    assert not set(claimants) & {m.claimant for m in await received(10)}
    assert len(Received(message_id="m", receipt="r", group="", body="").claimant) == 32
