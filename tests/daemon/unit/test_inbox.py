"""The inbox applies each message's settlement, and only once a round.

Against a fake SQS client (tests/daemon/unit/fakes.py): the calls are what is
asserted; the pipeline tests run the same inbox against moto.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, cast

import pytest

from fairpost.mailer.daemon.inbox import Inbox, Received
from fairpost.mailer.daemon.metrics import Metrics
from fairpost.mailer.daemon.settlement import (
    HAND_BACK,
    Backoff,
    Delete,
    Leave,
    Park,
    Settlement,
    TimedRetry,
)
from fairpost.mailer.errors import SettledTwice
from tests.daemon.unit.fakes import FakeSqs


def inbox() -> tuple[Inbox, FakeSqs]:
    sqs = FakeSqs()
    return Inbox(cast(Any, sqs), "queue", Metrics()), sqs


def message(n: int, hidden_for: float = 60.0) -> Received:
    hidden_until = time.monotonic() + hidden_for
    return Received(message_id=f"m-{n}", receipt=f"r-{n}", group="acme", body="", hidden_until=hidden_until)


def test_a_second_decision_in_a_round_is_refused_unless_named() -> None:
    msg = message(0)
    msg.decide(Park(5.0, "acme", "tenant_quota"))
    with pytest.raises(SettledTwice):
        msg.decide(Delete("sent"))
    msg.overrule(HAND_BACK)  # the group's answers together
    assert msg.settlement == HAND_BACK
    msg.reopen()  # a new round
    msg.decide(Delete("sent"))
    assert msg.deleted


async def test_each_settlement_becomes_its_sqs_call() -> None:
    box, sqs = inbox()
    decided: dict[int, Settlement] = {
        0: Delete("sent"),
        1: Park(2.2, "acme", "tenant_quota"),
        2: Backoff(4.0, "ses_throttled"),
        3: HAND_BACK,
        4: Leave("outage"),
    }
    messages = [message(n) for n in range(6)]  # the last one undecided: left as Leave
    for n, settled in decided.items():
        messages[n].decide(settled)
    await box.settle(messages, promptly=True)
    assert sqs.deleted == ["r-0"]
    # Whole seconds, rounded up: a short wait must not become none.
    assert sqs.visibility == {"r-1": 3, "r-2": 4, "r-3": 0}


async def test_a_park_is_remembered_for_its_tenant_and_unparked_at_once() -> None:
    box, sqs = inbox()
    parked, other = message(0), message(1)
    parked.decide(Park(600.0, "acme", "paused"))
    other.decide(Backoff(600.0, "ses_throttled"))
    await box.settle([parked, other])
    assert await box.unpark("acme") == 1
    assert sqs.visibility == {"r-0": 0, "r-1": 600}
    assert await box.unpark("acme") == 0  # forgotten once brought back


async def test_a_timed_retry_changes_visibility_only_when_sqs_would_show_it_sooner() -> None:
    box, sqs = inbox()
    due: asyncio.Future[list[Received]] = asyncio.get_running_loop().create_future()

    async def on_due(messages: list[Received]) -> None:
        due.set_result(messages)

    box.on_due = on_due
    kept = message(0, hidden_for=60.0)  # hidden longer than the retry and its margin
    short = message(1, hidden_for=1.0)
    at = time.monotonic() + 0.5
    kept.decide(TimedRetry(at, 10.0, "acme"))
    short.decide(TimedRetry(at, 10.0, "acme"))
    await box.settle([kept, short])
    assert set(sqs.visibility) == {"r-1"}
    assert sqs.visibility["r-1"] in (10, 11)  # what is left of 0.5 s and the 10 s margin, rounded up
    assert kept.retry_at == at
    assert [m.receipt for m in await asyncio.wait_for(due, timeout=10)] == ["r-0", "r-1"]
    assert await box.unpark("acme") == 0  # the retry's moment is past: nothing parked is left


async def test_shutdown_hands_back_what_is_held_but_not_what_ses_may_have() -> None:
    box, sqs = inbox()
    undecided, parked, sent, calling = (message(n) for n in range(4))
    parked.decide(Park(60.0, "acme", "tenant_quota"))
    sent.decide(Delete("sent"))
    calling.in_call = True
    box.hold([undecided, parked, sent, calling])
    assert await box.release_held() == 2
    assert sqs.visibility == {"r-0": 0, "r-1": 0}
    assert sqs.deleted == ["r-2"]


async def test_a_receive_not_looked_at_goes_straight_back() -> None:
    box, sqs = inbox()
    await box.hand_back({"Messages": [{"MessageId": "m-0", "ReceiptHandle": "r-0"}]})
    assert sqs.visibility == {"r-0": 0}


class _SlowSqs(FakeSqs):
    """Each DeleteMessageBatch waits for its release; one named receipt's call fails."""

    def __init__(self, failing: str | None = None) -> None:
        super().__init__()
        self.failing = failing
        self.calls: list[asyncio.Event] = []
        self.both_called = asyncio.Event()

    async def delete_message_batch(self, **kwargs: Any) -> dict[str, Any]:
        released = asyncio.Event()
        self.calls.append(released)
        if len(self.calls) == 2:
            self.both_called.set()
        await released.wait()
        if any(entry["ReceiptHandle"] == self.failing for entry in kwargs["Entries"]):
            raise ConnectionError("SQS away")
        return await super().delete_message_batch(**kwargs)


async def _fifteen_deleted(sqs: _SlowSqs) -> tuple[asyncio.Future[None], list[Received]]:
    """Fifteen deletes of one caller: two calls (SQS's batches of ten), both made."""
    box = Inbox(cast(Any, sqs), "queue", Metrics())
    messages = [message(n) for n in range(15)]
    for msg in messages:
        msg.decide(Delete("sent"))
    settling = asyncio.ensure_future(box.settle(messages, promptly=True))
    await asyncio.wait_for(sqs.both_called.wait(), 5)
    return settling, messages


async def test_a_delete_of_many_calls_returns_once_every_call_deleted_its_part() -> None:
    """The caller learns its deletes are done only once both calls have answered,
    whichever answers first."""
    sqs = _SlowSqs()
    settling, messages = await _fifteen_deleted(sqs)
    sqs.calls[1].set()
    await asyncio.sleep(0.01)
    assert not settling.done()
    sqs.calls[0].set()
    await asyncio.wait_for(settling, 5)
    assert sorted(sqs.deleted) == sorted(m.receipt for m in messages)


async def test_a_failed_delete_call_fails_the_caller_whose_messages_it_held() -> None:
    sqs = _SlowSqs(failing="r-12")
    settling, _ = await _fifteen_deleted(sqs)
    sqs.calls[1].set()  # the call of r-10..r-14 fails first: the caller learns it at once
    with pytest.raises(ConnectionError):
        await asyncio.wait_for(settling, 5)
    sqs.calls[0].set()
    await asyncio.sleep(0.01)
    assert sorted(sqs.deleted) == sorted(f"r-{n}" for n in range(10))


async def test_a_delete_of_nothing_returns_at_once() -> None:
    box, sqs = inbox()
    await box.settle([], promptly=False)
    assert sqs.deleted == []
