"""The sender's gate: a change of limits reopens what the quota closed, not what SES closed.

Moved from tests/daemon/test_sender_gate.py, where the quota engine ran on a
real Redis with nothing counted (so it said "no wait"); here a fake engine
says the same (tests/daemon/unit/fakes.py), and the gate is what is tested.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

from fairpost.config import load_settings
from fairpost.mailer.daemon.gate import BINDING_TURNS, OPEN_PEEK_EVERY, Gate
from fairpost.mailer.quota.overrides import StaticLimits
from tests.daemon.unit.fakes import FakeQuota


def gate(quota: FakeQuota | None = None) -> Gate:
    settings = load_settings(redis_url="redis://unused", global_limits="100/second")
    return Gate(cast(Any, quota or FakeQuota()), StaticLimits(settings))


async def first_decision(gate: Gate) -> float:
    decided: asyncio.Future[float] = asyncio.get_running_loop().create_future()

    def observe(wait: float) -> None:
        if not decided.done():
            decided.set_result(wait)

    gate.observer = observe
    stop = asyncio.Event()
    waiting = asyncio.create_task(gate.wait(stop))
    wait = await asyncio.wait_for(decided, timeout=10)
    stop.set()
    await waiting
    return wait


async def test_a_change_of_limits_cut_an_ses_pause_short() -> None:
    closed = gate()
    closed.hold(60)  # SES paused the account
    closed.regate()  # meanwhile the global limits rose
    assert await first_decision(closed) > 50
    assert closed.holding()  # what the slot keeper asks: the in-flight slots are kept meanwhile


async def test_a_change_of_limits_reopens_a_gate_the_global_quota_closed() -> None:
    closed = gate()
    closed.hold_for_quota(60)  # the old limits said: a minute
    closed.regate()
    assert await first_decision(closed) == 0.0


async def test_a_spent_global_quota_closes_the_gate_until_it_frees() -> None:
    closed = gate(FakeQuota(global_wait=12.5))
    assert await first_decision(closed) == 12.5
    assert not closed.holding()  # the engine's wait is asked each time, not held here


async def test_an_open_gate_does_not_wait() -> None:
    assert await gate().wait(asyncio.Event()) is False


async def turns(gate: Gate, count: int) -> None:
    for _ in range(count):
        await gate.wait(asyncio.Event())


async def test_a_global_quota_that_does_not_bind_is_asked_once_every_few_turns() -> None:
    # Each ask is a quota script call in Redis, a third of the script's calls under a
    # steady load that the global quota does not bind, each answering "open".
    quota = FakeQuota()
    open_gate = gate(quota)
    await turns(open_gate, 3 * OPEN_PEEK_EVERY)
    assert quota.peeks == 3


async def test_a_sign_that_the_global_quota_binds_has_it_asked_every_turn_for_a_while() -> None:
    for sign in ("refused", "closed", "share", "limits"):
        quota = FakeQuota()
        binding = gate(quota)
        await turns(binding, 1)  # the first turn asks
        if sign == "refused":
            binding.hold_for_quota(0.0)  # a refusal for global room, its wait already over
        elif sign == "closed":
            quota.global_wait = 0.001  # another replica spent it: the next ask finds it so
            await turns(binding, OPEN_PEEK_EVERY)
            quota.global_wait = 0.0
        elif sign == "share":
            binding.quota_binds()  # a refusal for a share of it, others waiting for room
        else:
            binding.regate()  # the global limits changed
        asked = quota.peeks
        await turns(binding, BINDING_TURNS)
        assert quota.peeks - asked == BINDING_TURNS, sign
        await turns(binding, 2 * OPEN_PEEK_EVERY)
        assert quota.peeks - asked == BINDING_TURNS + 2, sign
