"""A replica (re)started with ``FAIRPOST_GLOBAL_LIMITS=auto`` after a busy day sends at
once (issue 12, item 1): a real daemon process, the recording SES's GetAccount,
fairpost's own day of mail already counted in Redis."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio

from fairpost.config.limits import Window
from fairpost.mailer.quota.engine import QuotaEngine
from fairpost.mailer.sdk.client import MailClient
from tests.support.operator import Ops


async def _count_own_day(redis_url: str, ops: Ops, units: int) -> None:
    """What the replicas before the restart sent today, in fairpost's global day window."""
    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        grant = await QuotaEngine(client, ops.keys).acquire("earlier", [units], [Window(86_400, units)], [])
        assert grant.granted == 1
    finally:
        await client.aclose()


def test_a_replica_started_after_a_busy_day_sends_at_once(
    ops: Ops, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 40,000 of SES's 50,000 sent today, all by fairpost. Today: 5000/day, a 21-hour wait.
    ops.ses.set_quota(max_send_rate=14, max_24_hour_send=50_000, sent_last_24_hours=40_000)
    asyncio.run(_count_own_day(redis_url, ops, 40_000))
    monkeypatch.setenv("FAIRPOST_GLOBAL_LIMITS", "auto")
    with ops.daemon(replica="r1"), MailClient() as client:
        client.send("acme", sender="app@example.com", to=["ada@example.org"], subject="hi", text="hi")
        ops.ses.wait_for(1, timeout=15)
        code, out = ops.cli("quota", "show")
        assert code == 0 and "12/second; 45000/day" in out
