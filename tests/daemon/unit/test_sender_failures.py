"""What a failed round settles: a bug backs its mails off, an outage asks again here.

The Sender built on fakes (tests/daemon/unit/fakes.py) for SQS, the job store
and the quota engine; the group decision is replaced by one that fails as the
case needs (the pipeline tests, test_sender_unexpected.py and
test_timed_retry_outage.py, fail it for real).
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from fairpost.mailer.daemon.inbox import Received
from fairpost.mailer.daemon.sender import Sender
from fairpost.mailer.daemon.settlement import Delete
from tests.daemon.unit.fakes import FakeSqs, FakeStore, fake_context, mail


def sender(monkeypatch: pytest.MonkeyPatch, handle: Any) -> tuple[Sender, FakeSqs, FakeStore]:
    ctx, store, _ = fake_context(sender={"backoff_base_seconds": 3.0})
    sqs = FakeSqs()
    built = Sender(
        sqs=cast(Any, sqs),
        ses_client=cast(Any, None),
        queue_url="https://sqs/queue",
        store=ctx.store,
        quota=ctx.quota,
        settings=ctx.settings,
    )
    monkeypatch.setattr(built.groups, "handle", handle)
    return built, sqs, store


async def test_a_bug_backs_its_groups_mails_off_and_spares_the_other_group(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def handle(tenant: str, group: list[Received]) -> None:
        if tenant == "bad":
            raise KeyError("a defect")
        for msg in group:
            msg.decide(Delete("sent"))

    built, sqs, store = sender(monkeypatch, handle)
    await built.process([mail("bad", 0), mail("good", 1), mail("bad", 2)])
    assert sqs.deleted == ["r-1"]
    assert sqs.visibility == {"r-0": 3, "r-2": 3}  # the first attempt's back-off
    assert store.attempts == {"j-0": 1, "j-2": 1}
    assert built.inbox.held() == []


async def test_a_group_that_met_an_outage_is_decided_again_here(monkeypatch: pytest.MonkeyPatch) -> None:
    rounds: list[list[str]] = []
    again = asyncio.Event()

    async def handle(tenant: str, group: list[Received]) -> None:
        rounds.append([m.receipt for m in group])
        for msg in group:
            msg.decide(Delete("sent"))  # decided, then the round fails: void
        if len(rounds) == 1:
            raise RedisConnectionError("Redis is away")
        again.set()

    built, sqs, _ = sender(monkeypatch, handle)
    await built.process([mail("acme", 0), mail("acme", 1)])
    assert sqs.deleted == []  # the first round's decisions were void
    assert len(built.inbox.timers) == 1
    await asyncio.wait_for(again.wait(), timeout=10)
    await asyncio.gather(*built.inbox.timers)
    assert rounds == [["r-0", "r-1"], ["r-0", "r-1"]]
    assert sqs.deleted == ["r-0", "r-1"]
    assert built.inbox.held() == []
