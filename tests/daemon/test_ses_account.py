"""``FAIRPOST_GLOBAL_LIMITS=auto`` after a busy day (issue 12, item 1 and "Also").

The account is read from the recording SES server (its GetAccount) over HTTP,
the day window from a real redis-server through the real quota scripts.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import redis.asyncio

from fairpost.config import load_settings
from fairpost.config.limits import Limits, Window, parse_limits
from fairpost.mailer.daemon.aws import SES_CONFIG, session
from fairpost.mailer.daemon.gate import Gate
from fairpost.mailer.daemon.ses_account import (
    SesAccountLimits,
    daily_quota_wait,
    is_daily_quota_exceeded,
    limits_rose,
)
from fairpost.mailer.quota.engine import QuotaEngine
from fairpost.mailer.quota.overrides import OverrideCache
from fairpost.mailer.sdk.keys import MailKeys
from fairpost.mailer.testing.ses_server import SesServer

# Every test here runs against moto (SQS) and the recording SES.
pytestmark = pytest.mark.usefixtures("ses_env")

DAY = 86_400


@pytest.fixture
def ses() -> Iterator[SesServer]:
    """An account of 50,000 a day whose daily quota the tests count themselves."""
    with SesServer(max_24_hour_send=50_000, enforce_daily=False) as server:
        yield server


@pytest.fixture
async def ses_client(ses: SesServer) -> AsyncIterator[Any]:
    async with session().client("sesv2", config=SES_CONFIG) as c:
        yield c


def _account(
    ses_client: Any, aredis: redis.asyncio.Redis, redis_url: str, **kwargs: Any
) -> tuple[SesAccountLimits, QuotaEngine]:
    settings = load_settings(redis_url=redis_url, global_limits="auto", ses_account_refresh=300)
    keys = MailKeys(settings.key_prefix)
    quota = QuotaEngine(aredis, keys)
    return SesAccountLimits(ses_client, settings, client=aredis, keys=keys, quota=quota, **kwargs), quota


async def _send_today(quota: QuotaEngine, units: int) -> None:
    """fairpost's own sends of the last hours, counted in its global day window."""
    grant = await quota.acquire("busy", [units], [Window(DAY, units)], [])
    assert grant.granted == 1


async def test_a_restart_after_a_busy_day_does_not_stop_sending_for_most_of_a_day(
    ses: SesServer, ses_client: Any, aredis: redis.asyncio.Redis, redis_url: str
) -> None:
    # Today the first read counts fairpost's own 40,000 as "others'" too: 5000/day, a 21 h wait.
    ses.set_quota(max_send_rate=14, max_24_hour_send=50_000, sent_last_24_hours=40_000)
    account, quota = _account(ses_client, aredis, redis_url)
    await _send_today(quota, 40_000)

    limits = await account.start()

    assert limits == parse_limits("12/second; 45000/day")
    assert await quota.global_retry_after(limits) == 0.0


async def test_others_usage_is_still_taken_off_on_the_first_read(
    ses: SesServer, ses_client: Any, aredis: redis.asyncio.Redis, redis_url: str
) -> None:
    ses.set_quota(max_send_rate=14, max_24_hour_send=50_000, sent_last_24_hours=40_000)
    account, quota = _account(ses_client, aredis, redis_url)
    await _send_today(quota, 30_000)  # 10,000 were sent by others on the account

    assert await account.start() == parse_limits("12/second; 35000/day")


async def test_rising_auto_limits_open_a_gate_closed_by_the_old_ones(
    ses: SesServer, ses_client: Any, aredis: redis.asyncio.Redis, redis_url: str
) -> None:
    ses.set_quota(max_send_rate=14, max_24_hour_send=1_000, sent_last_24_hours=900)
    changes: list[tuple[Limits | None, Limits]] = []
    gate: Gate | None = None

    async def on_change(old: Limits | None, new: Limits) -> None:
        changes.append((old, new))
        if gate is not None and limits_rose(old, new):
            gate.regate()

    account, quota = _account(ses_client, aredis, redis_url, on_change=on_change)
    await _send_today(quota, 900)
    await account.start()
    settings = load_settings(redis_url=redis_url, global_limits="auto")
    overrides = OverrideCache(aredis, MailKeys(settings.key_prefix), settings, auto=account.current)
    gate = Gate(quota, overrides)
    waits: list[float] = []
    decided = asyncio.Event()

    def observe(wait: float) -> None:
        waits.append(wait)
        decided.set()

    gate.observer = observe
    stop = asyncio.Event()
    waiting = asyncio.create_task(gate.wait(stop))
    await asyncio.wait_for(decided.wait(), timeout=10)
    assert waits[0] > 3600  # the day window is spent: closed for hours

    ses.set_quota(max_24_hour_send=2_000)  # SES raised the quota
    await account.refresh()

    await asyncio.wait_for(waiting, timeout=5)  # woken at once, not in hours
    assert waiting.result() is True
    assert changes[-1][1] == parse_limits("12/second; 1800/day")
    assert not await gate.wait(stop)  # and it is open under the new limits


def test_limits_rose() -> None:
    old = parse_limits("12/second; 900/day")
    assert limits_rose(old, parse_limits("12/second; 1800/day"))
    assert limits_rose(old, parse_limits("12/second"))
    assert limits_rose(None, old)
    assert not limits_rose(old, parse_limits("10/second; 900/day"))
    assert not limits_rose(old, old)


def test_the_daily_quota_message_is_recognised() -> None:
    assert is_daily_quota_exceeded("SES LimitExceededException: Daily message quota exceeded.")
    assert is_daily_quota_exceeded("SES Throttling: Throttling - Daily message quota exceeded")
    assert not is_daily_quota_exceeded("SES TooManyRequestsException: Maximum sending rate exceeded.")


async def test_daily_quota_exceeded_holds_until_the_day_window_can_free(
    ses: SesServer, ses_client: Any, aredis: redis.asyncio.Redis, redis_url: str
) -> None:
    # SES says the day is spent; its account shows it (others sent what fairpost could not see).
    account, quota = _account(ses_client, aredis, redis_url)
    ses.set_quota(max_send_rate=14, max_24_hour_send=1_000, sent_last_24_hours=500)
    await account.start()  # 450/day for fairpost
    await _send_today(quota, 300)
    ses.set_quota(sent_last_24_hours=1_000)
    reads = ses.account_requests

    wait = await daily_quota_wait(ses_client, quota, account.current(), recheck_seconds=300, account=account)

    assert ses.account_requests == reads + 1  # GetAccount re-read
    # Others' 700 leave 200 for fairpost, which already has 300: closed until its units leave.
    assert account.current() == parse_limits("12/second; 200/day")
    assert wait > 3600
    # Without the account's own refresh (static limits), it still reads GetAccount.
    static = parse_limits("14/second; 50000/day")
    wait = await daily_quota_wait(ses_client, quota, static, recheck_seconds=300)
    assert wait == 300  # fairpost's count has room, SES's has not: look again after a refresh


async def test_daily_quota_wait_is_zero_once_ses_has_room_again(
    ses: SesServer, ses_client: Any, aredis: redis.asyncio.Redis, redis_url: str
) -> None:
    ses.set_quota(max_send_rate=14, max_24_hour_send=1_000, sent_last_24_hours=100)
    account, quota = _account(ses_client, aredis, redis_url)
    await account.start()
    assert await daily_quota_wait(ses_client, quota, account.current(), recheck_seconds=300) == 0.0
