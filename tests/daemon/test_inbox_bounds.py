"""The inbox remembers parked messages only while they are parked.

A fake-free unit test: :class:`Inbox` keeps its parked receipts in memory, and
parking touches no SQS call, so none is made here.
"""

from __future__ import annotations

import time
from typing import Any, cast

from fairpost.mailer.daemon.inbox import Inbox, Received
from fairpost.mailer.daemon.metrics import Metrics


def message(n: int) -> Received:
    return Received(message_id=f"m-{n}", receipt=f"r-{n}", group=f"t-{n}", body="")


def test_tenants_whose_parks_ended_are_forgotten() -> None:
    inbox = Inbox(cast(Any, None), "queue", Metrics())
    # 10,000 tenants parked once each, for a wait that is over by the next park.
    for n in range(10_000):
        inbox.parked(f"t-{n}", [message(n)], until=time.monotonic() - 1)
    assert len(inbox._parked) <= 2 * 64, len(inbox._parked)


def test_a_running_park_is_kept_through_a_sweep() -> None:
    inbox = Inbox(cast(Any, None), "queue", Metrics())
    inbox.parked("acme", [message(0)], until=time.monotonic() + 3600)
    for n in range(1, 1_000):
        inbox.parked(f"t-{n}", [message(n)], until=time.monotonic() - 1)
    assert inbox._parked["acme"] == {"r-0": inbox._parked["acme"]["r-0"]}
