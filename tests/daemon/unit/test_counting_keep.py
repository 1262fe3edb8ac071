"""A mail in its SES call is kept counted beside the call (fairpost.mailer.daemon.counting).

The call is awaited in the sender's own task; the keeping starts only once the
call outlasts ``every``. Against the fakes (tests/daemon/unit/fakes.py) and a
quota engine whose restamps the test holds and releases.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from fairpost.mailer.daemon import ses
from fairpost.mailer.daemon.counting import Counting, Stamp, _Keeper
from fairpost.mailer.testing.wait import wait_for_async
from tests.daemon.unit.fakes import fake_context

SENT = ses.SendResult(ses.Verdict.SENT, message_id="ses-1")


class HeldRestamps:
    """The quota engine's restamp: each one waits until the test lets it answer."""

    def __init__(self) -> None:
        self.asked = 0
        self.answered = 0
        self.go = asyncio.Event()

    async def restamp(self, *_: Any, **__: Any) -> int:
        self.asked += 1
        await self.go.wait()
        self.answered += 1
        return 5_000 + self.answered


def counting() -> tuple[Counting, HeldRestamps]:
    ctx, _, quota = fake_context()
    held = HeldRestamps()
    quota.restamp = held.restamp  # type: ignore[method-assign]
    return Counting(ctx), held


def keep_timers(monkeypatch: pytest.MonkeyPatch) -> list[asyncio.TimerHandle]:
    """Every timer the running loop sets to start a keep (``_Keeper.start``), as set."""
    loop = asyncio.get_running_loop()
    real = loop.call_later
    timers: list[asyncio.TimerHandle] = []

    def call_later(
        delay: float, callback: Callable[..., object], *args: Any, **kw: Any
    ) -> asyncio.TimerHandle:
        timer = real(delay, callback, *args, **kw)
        if isinstance(getattr(callback, "__self__", None), _Keeper):
            timers.append(timer)
        return timer

    monkeypatch.setattr(loop, "call_later", call_later)
    return timers


async def test_a_call_answered_within_every_is_never_restamped(monkeypatch: pytest.MonkeyPatch) -> None:
    count, held = counting()
    stamp = Stamp(1_000, 0.0)
    timers = keep_timers(monkeypatch)

    async def call() -> ses.SendResult:
        return SENT

    assert await count.keep_during(call(), "acme", 1, stamp, every=0.05) is SENT
    # The keep's start was set for `every` and is called off with the answer: no keep
    # can start later, however long the loop runs on.
    assert len(timers) == 1 and timers[0].cancelled()
    assert held.asked == 0
    assert stamp.at_ms == 1_000


async def test_a_keep_under_way_when_the_call_ends_lands_before_the_answer_is_used(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    count, held = counting()
    stamp = Stamp(1_000, 0.0)  # granted long ago: the first keep restamps
    answered = asyncio.Event()
    events: list[str] = []
    stopping = asyncio.Event()
    real_stop = _Keeper.stop

    async def stop(keeper: _Keeper, *, cancel: bool) -> None:
        stopping.set()  # the call has ended: keep_during settles its keeper
        await real_stop(keeper, cancel=cancel)
        events.append("keeper stopped")

    monkeypatch.setattr(_Keeper, "stop", stop)

    async def call() -> ses.SendResult:
        await answered.wait()
        return SENT

    waiting = asyncio.ensure_future(count.keep_during(call(), "acme", 1, stamp, every=0.01))
    waiting.add_done_callback(lambda _: events.append("answer used"))

    async def keeping() -> bool:
        return held.asked == 1

    await wait_for_async(keeping, within=5, what="a keep during the slow call")
    answered.set()  # SES answers while the restamp is on its way
    await wait_for_async(stopping.is_set, within=5, what="the call's end to reach keep_during")
    assert not waiting.done(), "the answer was used before the keep under way landed"
    held.go.set()
    assert await waiting is SENT
    assert events == ["keeper stopped", "answer used"]
    # The record moves the units from where the keep put them.
    assert stamp.at_ms == 5_001
    assert held.asked == held.answered == 1


async def test_a_cancelled_call_cancels_its_keep() -> None:
    count, held = counting()
    stamp = Stamp(1_000, 0.0)

    async def call() -> ses.SendResult:
        await asyncio.Event().wait()
        return SENT

    waiting = asyncio.ensure_future(count.keep_during(call(), "acme", 1, stamp, every=0.01))

    async def keeping() -> bool:
        return held.asked == 1

    await wait_for_async(keeping, within=5, what="a keep during the slow call")
    waiting.cancel()
    results = await asyncio.gather(waiting, return_exceptions=True)
    assert isinstance(results[0], asyncio.CancelledError)
    assert held.answered == 0
    assert stamp.at_ms == 1_000
