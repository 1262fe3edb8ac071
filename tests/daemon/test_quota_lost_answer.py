"""A quota acquire whose answer is lost, asked again: its units count once.

Redis ran the acquire (acquire.lua counted its units) and the reply never came
back. Asked again (the same tenant's mail asks the engine again, as the sender
does after an outage back-off), it must not count them a second time: the tenant
would lose that much of its quota until the units leave the window. The fault is
injected at the client by the fault matrix's recorder (tests/faults/recorder.py:
the network cannot be cut between Redis running a script and its reply),
against a real redis-server.
"""

from __future__ import annotations

import asyncio

import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from fairpost.config.limits import Window
from fairpost.dispatcher.replies import time_ms
from fairpost.mailer.quota.engine import QuotaEngine, quota_script
from tests.faults.recorder import Step, recording
from tests.support import KEYS

MINUTE = Window(60, 100)
GLOBAL = [Window(60, 1000)]
ACQUIRE = Step("redis", "script acquire.lua", 1)


async def used(engine: QuotaEngine, tenant: str = "acme") -> int:
    [(_, units)] = await engine.usage(tenant, [MINUTE])
    return units


async def lost_answer(
    aredis: Redis,
    monkeypatch: pytest.MonkeyPatch,
    costs: list[int],
    weight: int | None = None,
    now_ms: int | None = None,
) -> QuotaEngine:
    """An engine whose first acquire, of ``costs``, raised after Redis counted it."""
    with recording(monkeypatch) as recorder:
        engine = QuotaEngine(aredis, KEYS)
        assert await used(engine) == 0
        # acquire.lua loaded, as a server that ran it before has it: the fault below hits the
        # acquire's own call, not a NOSCRIPT answer redis-py then loads the script after.
        await aredis.script_load(quota_script("acquire"))
        recorder.reset(ACQUIRE, "lost-answer")
        recorder.armed = True
        with pytest.raises(RedisConnectionError):
            await engine.acquire("acme", costs, GLOBAL, [MINUTE], weight=weight, now_ms=now_ms)
        assert recorder.fired == ACQUIRE
    assert await used(engine) > 0, "Redis counted the acquire whose answer was lost"
    return engine


@pytest.mark.parametrize("weight", [None, 1], ids=["plain", "fair"])
async def test_an_acquire_asked_again_after_its_answer_was_lost_counts_once(
    aredis: Redis, monkeypatch: pytest.MonkeyPatch, weight: int | None
) -> None:
    engine = await lost_answer(aredis, monkeypatch, [2, 3], weight)
    grant = await engine.acquire("acme", [2, 3], GLOBAL, [MINUTE], weight=weight)
    assert grant.granted == 2
    assert await used(engine) == 5


async def test_a_lost_answer_is_asked_again_by_one_call_only(
    aredis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two asks at once after the lost answer: one takes the grant Redis counted,
    # the other counts its own. Both sent under one count would be over the limit.
    engine = await lost_answer(aredis, monkeypatch, [4])
    grants = await asyncio.gather(*(engine.acquire("acme", [4], GLOBAL, [MINUTE]) for _ in range(2)))
    assert [grant.granted for grant in grants] == [1, 1]
    assert await used(engine) == 8


async def test_another_ask_than_the_lost_one_counts_its_own(
    aredis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Other costs: not the same ask. The lost grant's units stay counted (the safe
    # side: the tenant loses them until they leave the window, never goes over).
    engine = await lost_answer(aredis, monkeypatch, [2])
    grant = await engine.acquire("acme", [3], GLOBAL, [MINUTE])
    assert grant.granted == 1
    assert await used(engine) == 5


async def test_a_partial_grant_asked_again_says_what_is_left_of_its_wait(
    aredis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    lost_at = time_ms(await aredis.time())
    engine = await lost_answer(aredis, monkeypatch, [60, 60], now_ms=lost_at)
    # When the refused mail fits, as the lost answer said (a peek takes nothing).
    waited = await engine.retry_after("acme", [MINUTE], cost=60, now_ms=lost_at)
    assert waited > 10
    grant = await engine.acquire("acme", [60, 60], GLOBAL, [MINUTE], now_ms=lost_at + 10_000)
    assert (grant.granted, grant.blocked_by, grant.at_ms) == (1, "tenant", lost_at)
    assert grant.retry_after == pytest.approx(waited - 10, abs=0.001)
    assert await used(engine) == 60
