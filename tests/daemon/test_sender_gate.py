"""The sender's gate: a change of limits reopens what the quota closed, not what SES closed."""

from __future__ import annotations

import asyncio

import redis.asyncio

from fairpost.config import load_settings
from fairpost.dispatcher.keys import Keys
from fairpost.mailer.daemon.gate import Gate
from fairpost.mailer.quota.engine import QuotaEngine
from fairpost.mailer.quota.overrides import StaticLimits


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


async def test_a_change_of_limits_cut_an_ses_pause_short(redis_url: str, aredis: redis.asyncio.Redis) -> None:
    settings = load_settings(redis_url=redis_url, global_limits="100/second")
    gate = Gate(QuotaEngine(aredis, Keys(settings.key_prefix)), StaticLimits(settings))
    gate.hold(60)  # SES paused the account
    gate.regate()  # meanwhile the global limits rose
    assert await first_decision(gate) > 50
    assert gate.holding()  # what the slot keeper asks: the in-flight slots are kept meanwhile


async def test_a_change_of_limits_reopens_a_gate_the_global_quota_closed(
    redis_url: str, aredis: redis.asyncio.Redis
) -> None:
    settings = load_settings(redis_url=redis_url, global_limits="100/second")
    gate = Gate(QuotaEngine(aredis, Keys(settings.key_prefix)), StaticLimits(settings))
    gate.hold_for_quota(60)  # the old limits said: a minute
    gate.regate()
    assert await first_decision(gate) == 0.0
